//! Helpers shared by the integration tests that run real processes: a mosquitto broker of
//! their own, `laya-edge serve` agents, and an MQTT 5 test client.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::mpsc;

use laya_topics::Value;
use laya_topics::json::{self, ParseOptions, Style};
use laya_topics::wire::Encoding;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("laya-mqtt-{name}-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

pub fn wait_for_port(port: u16) {
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t.elapsed() < Duration::from_secs(10), "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A mosquitto process with a config of our own, persistence on.
pub struct Broker {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    /// Config lines before the first listener (`per_listener_settings true` must go there).
    head: String,
}

impl Broker {
    pub fn start(name: &str, extra: &str) -> Broker {
        Broker::start_with_head(name, "", extra)
    }

    /// A broker whose config starts with `head` (before the plain listener on `port`).
    pub fn start_with_head(name: &str, head: &str, extra: &str) -> Broker {
        let dir = temp_dir(name);
        let port = free_port();
        let mut b = Broker { child: None, port, dir, head: head.to_owned() };
        b.write_conf(extra);
        b.launch();
        b
    }

    /// The broker's directory (its config, log and persistence files).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn write_conf(&self, extra: &str) {
        let conf = format!(
            // `user root`: when the tests run as root (CI), mosquitto would otherwise switch to its
            // own user and could not write the persistence files or read the test keys.
            "{}\nuser root\nlistener {} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\nautosave_interval 1\nmax_queued_messages 100000\n{extra}\n",
            self.head,
            self.port,
            self.dir.display()
        );
        std::fs::write(self.dir.join("mosquitto.conf"), conf).expect("conf");
    }

    pub fn launch(&mut self) {
        let log = std::fs::File::create(self.dir.join("mosquitto.log")).expect("log");
        let child = Command::new(mosquitto())
            .arg("-c")
            .arg(self.dir.join("mosquitto.conf"))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("mosquitto starts (apt-get install mosquitto)");
        self.child = Some(child);
        wait_for_port(self.port);
    }

    /// Stops the broker cleanly (it saves its sessions) and starts it again on the same port.
    pub fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
            let _ = c.wait();
        }
        self.launch();
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// What mosquitto logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("mosquitto.log")).unwrap_or_default()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The shipped broker configuration (`config/mosquitto.conf` with `config/mosquitto.acl`, as they
/// are) in a mosquitto of its own: only its port, persistence directory, password file, ACL file
/// path and log destination changed (the paths the example uses are a board's). Users log in
/// with `users`' passwords.
pub struct ShippedBroker {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
}

impl ShippedBroker {
    pub fn start(name: &str, users: &[(&str, &str)]) -> ShippedBroker {
        let dir = temp_dir(name);
        let port = free_port();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let conf = std::fs::read_to_string(root.join("config/mosquitto.conf")).expect("config/mosquitto.conf");
        std::fs::copy(root.join("config/mosquitto.acl"), dir.join("mosquitto.acl")).expect("the ACL file");
        let mut out = String::from("user root\n");
        for line in conf.lines() {
            let key = line.split_whitespace().next().unwrap_or("");
            out += &match key {
                "listener" => format!("listener {port} 127.0.0.1"),
                "persistence_location" => format!("persistence_location {}/", dir.display()),
                "password_file" => format!("password_file {}", dir.join("passwd").display()),
                "acl_file" => format!("acl_file {}", dir.join("mosquitto.acl").display()),
                "log_dest" => "log_dest stderr".to_owned(),
                _ => line.to_owned(),
            };
            out.push('\n');
        }
        std::fs::write(dir.join("mosquitto.conf"), out).expect("conf");
        let passwd = dir.join("passwd");
        for (user, password) in users {
            let ok = Command::new("mosquitto_passwd")
                .args(if passwd.exists() { &["-b"][..] } else { &["-c", "-b"][..] })
                .args([passwd.as_os_str(), user.as_ref(), password.as_ref()])
                .status()
                .expect("mosquitto_passwd runs");
            assert!(ok.success());
        }
        let log = std::fs::File::create(dir.join("mosquitto.log")).expect("log");
        let child = Command::new(mosquitto())
            .arg("-c")
            .arg(dir.join("mosquitto.conf"))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("mosquitto starts");
        wait_for_port(port);
        ShippedBroker { child, port, dir }
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// A file in the broker's directory holding `password` (for `mqtt.password_file`).
    pub fn password_file(&self, user: &str, password: &str) -> PathBuf {
        let path = self.dir.join(format!("{user}.password"));
        std::fs::write(&path, format!("{password}\n")).expect("password file");
        path
    }

    /// What mosquitto logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("mosquitto.log")).unwrap_or_default()
    }
}

impl Drop for ShippedBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn mosquitto() -> PathBuf {
    for p in ["/usr/sbin/mosquitto", "/usr/bin/mosquitto", "/usr/local/sbin/mosquitto"] {
        if Path::new(p).exists() {
            return p.into();
        }
    }
    "mosquitto".into()
}

pub fn model(name: &str) -> String {
    format!("{}/../tests/fixtures/laya-0.3.20/models/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A `laya-edge serve` process.
pub struct Agent {
    pub child: Option<Child>,
    pub config: PathBuf,
    pub env: Vec<(String, String)>,
}

impl Agent {
    pub fn start(broker: &Broker, device: &str, extra: &str) -> Agent {
        Agent::start_at(&broker.url(), device, extra)
    }

    /// An agent of `device` on the broker at `url` (a mosquitto of the test's, or a
    /// `test_kit::rogue_broker`), with `extra` config lines after `[mqtt]`'s.
    pub fn start_at(url: &str, device: &str, extra: &str) -> Agent {
        let dir = temp_dir(&format!("agent-{device}"));
        let config = dir.join("laya-edge.toml");
        let text = format!(
            "[mqtt]\nbroker = \"{url}\"\ndevice = \"{device}\"\ntelemetry_interval_s = 1\nreconnect_min_ms = 100\nreconnect_max_ms = 500\n{extra}"
        );
        let text = if text.contains("[model]") {
            text
        } else {
            format!("{text}\n[model]\ndir = \"{}\"\n", model("bpe-small"))
        };
        std::fs::write(&config, text).expect("config");
        Agent::with_config(config, Vec::new())
    }

    /// An agent on a config file of the caller's, with extra environment.
    pub fn with_config(config: PathBuf, env: Vec<(String, String)>) -> Agent {
        let mut a = Agent { child: None, config, env };
        a.launch();
        a
    }

    pub fn launch(&mut self) {
        let child = Command::new(test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge")))
            .arg("serve")
            .arg("--config")
            .arg(&self.config)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .spawn()
            .expect("laya-edge starts");
        self.child = Some(child);
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
        c.wait().expect("exit status")
    }

    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// An MQTT 5 test client that collects what it receives.
pub struct Client {
    pub client: AsyncClient,
    rx: mpsc::Receiver<Publish>,
    /// One `()` per SUBACK, so a subscription is in place before anything is published.
    subacks: tokio::sync::Mutex<mpsc::Receiver<()>>,
}

impl Client {
    pub async fn connect(port: u16, id: &str) -> Client {
        Client::connect_as(port, id, None).await
    }

    /// The same, logging in with `(user name, password)`.
    pub async fn connect_as(port: u16, id: &str, login: Option<(&str, &str)>) -> Client {
        let mut o = MqttOptions::new(id, "127.0.0.1", port);
        if let Some((user, password)) = login {
            o.set_credentials(user, password);
        }
        o.set_max_packet_size(Some(1 << 20));
        let (client, mut eventloop) = AsyncClient::new(o, 10_000);
        let (tx, rx) = mpsc::channel(100_000);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (sub_tx, subacks) = mpsc::channel(100);
        tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        if let Some(r) = ready.take() {
                            let _ = r.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = sub_tx.send(()).await;
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if tx.send(p).await.is_err() {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(10), ready_rx).await.expect("connected").expect("connack");
        Client { client, rx, subacks: tokio::sync::Mutex::new(subacks) }
    }

    /// Subscribes and waits for the broker's SUBACK.
    pub async fn subscribe(&self, filter: &str) {
        let mut subacks = self.subacks.lock().await;
        self.client.subscribe(filter, QoS::AtLeastOnce).await.expect("subscribe");
        tokio::time::timeout(Duration::from_secs(10), subacks.recv())
            .await
            .expect("a SUBACK")
            .expect("the client runs");
    }

    pub async fn next(&mut self, within: Duration) -> Option<Publish> {
        tokio::time::timeout(within, self.rx.recv()).await.ok().flatten()
    }

    pub async fn ask(
        &self,
        topic: &str,
        payload: Vec<u8>,
        response_topic: Option<&str>,
        correlation: Option<&[u8]>,
        encoding: Encoding,
    ) {
        let props = PublishProperties {
            response_topic: response_topic.map(str::to_owned),
            correlation_data: correlation.map(|c| c.to_vec().into()),
            content_type: Some(encoding.content_type().into()),
            ..PublishProperties::default()
        };
        self.client.publish_with_properties(topic, QoS::AtLeastOnce, false, payload, props).await.expect("publish");
    }
}

pub fn decode(p: &Publish) -> Value {
    let ct = p.properties.as_ref().and_then(|x| x.content_type.clone());
    Encoding::detect(ct.as_deref(), &p.payload).decode(&p.payload, 256).expect("a decodable reply")
}

pub fn request(id: &str) -> Value {
    let text = format!(
        r#"{{"id": "{id}", "state": "The app crashes when I log in, please help.", "questions": {{"bug": {{"type": "noul", "instructions": "Is this a bug report?"}}, "team": {{"type": "choice", "instructions": "Which team?", "criteria": ["billing", "technical", "sales"]}}}}}}"#
    );
    json::parse_str(&text, ParseOptions::default()).expect("json")
}

/// Waits until the agent's retained status says online.
pub async fn wait_online(port: u16, device: &str) {
    let options = MqttOptions::new(format!("status-watch-{device}-{}", free_port()), "127.0.0.1", port);
    laya_edge::bus::ask::wait_online(options, &laya_topics::topic::Schema::default(), device, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{device} never came online: {e}"));
}

/// Asks `device` one question as client `asker` until it is answered rather than refused (a
/// backend that is still restarting refuses with `backend_unavailable`), for up to `within`;
/// returns the answered reply.
pub async fn ask_until_answered(port: u16, device: &str, asker: &str, within: Duration) -> Value {
    let mut c = Client::connect(port, asker).await;
    c.subscribe(&format!("laya/v1/reply/{asker}/#")).await;
    let deadline = std::time::Instant::now() + within;
    loop {
        let reply_to = format!("laya/v1/reply/{asker}/q");
        c.ask(
            &format!("laya/v1/{device}/ask"),
            Encoding::Json.encode(&request("q")),
            Some(&reply_to),
            None,
            Encoding::Json,
        )
        .await;
        let reply = decode(&c.next(within).await.expect("a reply"));
        if reply.get("answers").is_some() {
            return reply;
        }
        assert!(std::time::Instant::now() < deadline, "{device} never answered: {reply:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub fn text(v: &Value) -> String {
    json::to_string(v, Style::COMPACT)
}

/// Runs the `laya-edge` binary with `args`, `env` and `stdin`; returns stdout, stderr and
/// whether it succeeded.
pub fn run_cli(args: &[&OsStr], env: &[(&str, &Path)], stdin: &str) -> (String, String, bool) {
    use std::io::Write;
    let mut child = Command::new(test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge")))
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    // Written beside the reading: a child whose output fills the pipe before it has read all
    // its input would wait for us while we wait for it.
    let mut input = child.stdin.take().expect("stdin");
    let stdin = stdin.to_owned();
    let writer = std::thread::spawn(move || input.write_all(stdin.as_bytes()));
    let out = child.wait_with_output().expect("the binary exits");
    writer.join().expect("the writer").expect("write stdin");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

/// Runs `laya-edge predict` on `input` (JSON lines) and returns its output lines.
pub fn run_predict(model: &Path, backend: &str, input: &str, env: &[(&str, &Path)]) -> Vec<Value> {
    let args =
        [OsStr::new("predict"), OsStr::new("--backend"), OsStr::new(backend), OsStr::new("--model"), model.as_os_str()];
    let (out, err, ok) = run_cli(&args, env, input);
    assert!(ok, "predict --backend {backend} failed: {err}");
    out.lines().map(|l| json::parse_str(l, ParseOptions::default()).expect("json")).collect()
}

/// Runs `laya-edge predict --config FILE` with `config` (TOML) in FILE on `input` (JSON lines)
/// and returns its output lines.
pub fn run_predict_with_config(config: &str, input: &str) -> Vec<Value> {
    let file = temp_dir("predict-config").join("laya-edge.toml");
    std::fs::write(&file, config).expect("config");
    let (out, err, ok) = run_cli(&[OsStr::new("predict"), OsStr::new("--config"), file.as_os_str()], &[], input);
    assert!(ok, "predict --config with {config:?} failed: {err}");
    out.lines().map(|l| json::parse_str(l, ParseOptions::default()).expect("json")).collect()
}

/// How close an NPU backend's answers must be to the CPU backend's.
pub struct Closeness<'a> {
    /// Largest difference of any probability.
    pub tol: f64,
    /// A `choice` must be the CPU's where the CPU's top two probabilities are more than this
    /// apart (0: always).
    pub clear_gap: f64,
    /// Keys not compared (parts of the answer the backend does not compute).
    pub skip: &'a [&'a str],
}

/// Walks two answers (`answers` objects or whole replies): the same structure and strings, every
/// float within `c.tol`, and the same `choice` wherever the CPU's decision is clear.
pub fn assert_answers_close(ours: &Value, cpu: &Value, c: &Closeness, at: &str) {
    match (ours, cpu) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                if c.skip.contains(&k.as_str()) || k == "timing_ms" || k == "backend" {
                    continue;
                }
                let w = y.get(k).unwrap_or_else(|| panic!("{at}: the CPU answer has no {k}"));
                if k == "choice"
                    && c.clear_gap > 0.0
                    && test_kit::decision_margin(cpu).is_some_and(|m| m <= c.clear_gap)
                {
                    continue;
                }
                assert_answers_close(v, w, c, &format!("{at}.{k}"));
            }
        }
        (Value::Float(x), Value::Float(y)) => assert!((x - y).abs() <= c.tol, "{at}: {x} vs cpu {y}"),
        (x, y) => assert_eq!(x, y, "{at}"),
    }
}

/// The first `n` recorded requests of fixture model `model` (as JSON lines) none of whose token
/// rows is longer than `max_tokens` (requests laya refused have no rows and are kept).
pub fn fixture_requests(model: &str, n: usize, max_tokens: usize) -> String {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/laya-0.3.20/cases.jsonl"),
    )
    .expect("cases");
    let fits = |c: &Value| {
        c.get("layout").and_then(Value::as_object).is_none_or(|layout| {
            layout
                .values()
                .all(|q| q.get("input_ids").and_then(Value::as_array).is_none_or(|ids| ids.len() <= max_tokens))
        })
    };
    text.lines()
        .filter_map(|l| json::parse_str(l, ParseOptions { max_depth: 10_000 }).ok())
        .filter(|c| c.get("model") == Some(&Value::from(model)) && fits(c))
        .take(n)
        .map(|c| json::to_string(c.get("request").expect("request"), Style::COMPACT) + "\n")
        .collect()
}

/// Live (not zombie) child processes of `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // pid (comm) state ppid ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 1 && fields[0] != "Z" && fields[1].parse() == Ok(pid) {
            out.extend(entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()));
        }
    }
    out
}

/// Whether `pid` is gone: no such process, or a zombie waiting to be reaped by its new parent.
pub fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// An MQTT 5 client with a persistent session (it keeps its subscriptions and gets what was
/// published while the broker restarted), subscribing only once the broker acknowledged.
pub struct Persistent {
    pub client: AsyncClient,
    rx: mpsc::Receiver<Publish>,
    subacks: mpsc::Receiver<()>,
}

impl Persistent {
    pub async fn connect(port: u16, id: &str) -> Persistent {
        Persistent::connect_as(port, id, None).await
    }

    /// The same, logging in with `(user name, password)`.
    pub async fn connect_as(port: u16, id: &str, login: Option<(&str, &str)>) -> Persistent {
        let mut o = MqttOptions::new(id, "127.0.0.1", port);
        if let Some((user, password)) = login {
            o.set_credentials(user, password);
        }
        o.set_clean_start(false);
        o.set_session_expiry_interval(Some(600));
        o.set_max_packet_size(Some(1 << 20));
        let (client, mut eventloop) = AsyncClient::new(o, 10_000);
        let (tx, rx) = mpsc::channel(100_000);
        let (sub_tx, subacks) = mpsc::channel(100);
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if tx.send(p).await.is_err() {
                            break;
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = sub_tx.send(()).await;
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        Persistent { client, rx, subacks }
    }

    pub async fn subscribe(&mut self, filter: &str) {
        self.client.subscribe(filter, QoS::AtLeastOnce).await.expect("subscribe");
        tokio::time::timeout(Duration::from_secs(10), self.subacks.recv()).await.expect("a SubAck");
    }

    pub async fn ask(&self, topic: &str, body: Vec<u8>, response_topic: Option<&str>) {
        let props = PublishProperties {
            response_topic: response_topic.map(str::to_owned),
            content_type: Some(Encoding::Json.content_type().into()),
            ..PublishProperties::default()
        };
        self.client.publish_with_properties(topic, QoS::AtLeastOnce, false, body, props).await.expect("publish");
    }

    pub async fn next(&mut self, within: Duration) -> Option<Publish> {
        tokio::time::timeout(within, self.rx.recv()).await.ok().flatten()
    }
}
