//! `laya-edge serve`: the board's service. Answers questions over MQTT with the backend the
//! configuration names, in a supervised worker process (`crate::backends` builds it), until
//! SIGTERM or Ctrl-C. `--demo` starts an in-process broker and the bundled demo model and asks
//! the example questions itself.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::backend;
use crate::bundle::HostBundle;
use crate::client;
use crate::config::BackendKind;
use crate::config::Config;
use crate::engine::{Engine, EngineConfig};
use crate::service;
use laya_topics::topic::Schema;
use laya_topics::wire::{Encoding, ReloadRef};

#[derive(clap::Args)]
pub struct Args {
    /// The configuration file (TOML); without it every key has its default.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Overrides mqtt.broker.
    #[arg(long)]
    broker: Option<String>,
    /// Overrides mqtt.device.
    #[arg(long)]
    device: Option<String>,
    /// Overrides model.dir.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Overrides engine.backend.
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Overrides model.laya: the laya whose semantics the model is answered with (0.3.20, 0.4.15).
    #[arg(long, value_parser = super::laya_version)]
    laya: Option<laya_topics::wire::LayaVersion>,
    /// Start an in-process broker and the bundled demo model, ask the example questions,
    /// print the answers, keep serving.
    #[arg(long)]
    demo: bool,
    /// The demo broker's port (default: a free one); only with --demo.
    #[arg(long, requires = "demo")]
    port: Option<u16>,
    /// Overrides http.listen: open laya.serve's HTTP API on ADDR (e.g. 127.0.0.1:8000).
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
}

impl Args {
    /// The file's configuration with the flags applied (`--demo`'s settings come at start, below
    /// the flags).
    pub fn config(&self) -> Result<Config, String> {
        let mut config = super::load_config(self.config.as_deref())?;
        if let Some(b) = &self.broker {
            config.mqtt.broker = b.clone();
        }
        if let Some(d) = &self.device {
            config.mqtt.device = d.clone();
        }
        if let Some(m) = &self.model {
            config.model.dir = m.to_path_buf();
        }
        if let Some(b) = self.backend {
            config.engine.backend = b;
        }
        if let Some(l) = self.laya {
            config.model.laya = l;
        }
        if let Some(a) = &self.http {
            config.http.listen = a.clone();
        }
        config.check().map_err(|e| e.to_string())?;
        Ok(config)
    }
}

/// Where the demo model (a toy trained on synthetic support tickets: tools/demo/README.md) may
/// be, in order: where an install puts it (beside the binary, `../share/laya-edge/demo` from its
/// directory, `/usr/share/laya-edge/demo`, which the Yocto recipe's `demo` package config
/// installs), then the checkout this binary was built from, then `./models/demo`.
pub fn demo_model_candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(bin) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) {
        out.push(bin.join("models").join("demo"));
        out.push(bin.join("..").join("share").join("laya-edge").join("demo"));
    }
    out.push(PathBuf::from("/usr/share/laya-edge/demo"));
    out.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo"));
    out.push(PathBuf::from("models/demo"));
    out
}

/// The first demo model directory found, or where it was looked for.
fn demo_model() -> Result<PathBuf, String> {
    let candidates = demo_model_candidates();
    match candidates.iter().find(|c| c.join("rl_agent_config.json").is_file()) {
        Some(found) => Ok(std::fs::canonicalize(found).unwrap_or_else(|_| found.clone())),
        None => {
            let looked: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
            Err(format!("the demo model was not found; looked in {} (or give --model DIR)", looked.join(", ")))
        }
    }
}

/// The demo's in-process broker, in a build with the `demo` feature.
#[cfg(feature = "demo")]
fn start_demo_broker(port: Option<u16>) -> Result<u16, String> {
    service::demo::start_broker(port)
}

/// A build without the `demo` feature (a board's) has no broker of its own.
#[cfg(not(feature = "demo"))]
fn start_demo_broker(_: Option<u16>) -> Result<u16, String> {
    Err("--demo needs the in-process broker, which this build leaves out (cargo feature `demo`); run `cargo run -- serve --demo` from a checkout, or serve against a broker with --broker".into())
}

const DEMO_REQUESTS: &str = include_str!("../../../config/demo-requests.jsonl");

/// The demo's telemetry interval (a board's default is 60 s).
const DEMO_TELEMETRY_S: u64 = 2;

/// How to ask the demo yourself, ready to paste: `laya-edge ask` and `mosquitto_rr` lines for
/// the first example question.
fn ask_yourself(config: &Config) -> String {
    let request = DEMO_REQUESTS.lines().find(|l| !l.trim().is_empty()).unwrap_or("{}");
    let quoted = format!("'{}'", request.replace('\'', "'\\''"));
    let exe = std::env::current_exe().map(|e| e.display().to_string()).unwrap_or_else(|_| "laya-edge".into());
    let (host, port) = match service::connection::parse_broker(&config.mqtt.broker) {
        Ok((h, p, _)) => (h, p),
        Err(_) => ("127.0.0.1".into(), 1883),
    };
    let (prefix, device) = (&config.mqtt.prefix, &config.mqtt.device);
    format!(
        "ask it yourself:\n  {exe} ask --broker {} --device {device} {quoted}\n  mosquitto_rr -h {host} -p {port} -V 5 -t {prefix}/{device}/ask -e {prefix}/reply/me/1 -m {quoted}\nwatch it: {exe} fleet --broker {} --once",
        config.mqtt.broker, config.mqtt.broker
    )
}

/// The connection is looked at every 8 task polls rather than tokio's 61: under a flood the
/// service's thread has a task per question in progress ready to run, and another client's
/// question (read off the connection) and its reply (written to it) waited for 61 of them between
/// looks (BENCHMARKS.md, "Every client served fairly").
const EVENT_INTERVAL: u32 = 8;

/// The service's runtime: one thread. Its work is I/O and short host steps (the model runs in the
/// worker process, large requests are tokenized in the blocking pool), and on two cores every
/// hand-over between runtime threads cost ~20 µs of a question's ~0.2 ms (BENCHMARKS.md). Worker
/// processes are started from this thread, which lives as long as the service: a worker dies
/// with the thread that started it (PR_SET_PDEATHSIG, see the worker command). Its I/O is looked
/// at every [`EVENT_INTERVAL`] task polls.
fn serve_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .event_interval(EVENT_INTERVAL)
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

pub fn run(args: Args, config: Config) -> Result<(), String> {
    serve_runtime()?.block_on(serve(args, config))
}

async fn serve(args: Args, mut config: Config) -> Result<(), String> {
    // From the start: SIGHUP's default action would end the agent (its Last Will firing).
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| format!("cannot handle SIGHUP: {e}"))?;
    if args.demo {
        // It waits (up to 2 s) for the broker to listen: not on the runtime's only thread.
        if args.model.is_none() {
            config.model.dir = demo_model()?;
        }
        let wanted = args.port;
        let port =
            tokio::task::spawn_blocking(move || start_demo_broker(wanted)).await.map_err(|e| e.to_string())??;
        if args.broker.is_none() {
            config.mqtt.broker = format!("mqtt://127.0.0.1:{port}");
        }
        if args.device.is_none() {
            config.mqtt.device = "demo".into();
        }
        if args.backend.is_none() {
            config.engine.backend = BackendKind::Cpu;
        }
        // Figures for `fleet` within seconds, not the board's minute.
        if config.mqtt.telemetry_interval_s == crate::config::Mqtt::default().telemetry_interval_s {
            config.mqtt.telemetry_interval_s = DEMO_TELEMETRY_S;
        }
        println!(
            "demo broker on {}, device \"{}\", model {}",
            config.mqtt.broker,
            config.mqtt.device,
            config.model.dir.display()
        );
    }
    let (bundle, engine_config) = match prepare(&config) {
        Ok(ready) => ready,
        Err(e) => {
            // Said on the device's events topic too, for operators who do not log in to boards.
            if let Err(why) = service::report::config_error(&config, &e).await {
                tracing::warn!(error = %why, "the configuration error could not be reported to the broker");
            }
            return Err(e);
        }
    };
    let engine = Engine::start(engine_config);
    if args.demo {
        ask_demo_questions(&config)?;
    }
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
    };
    // The HTTP door: its address bound now, so a taken port ends `serve` at once with the cause.
    let door = http_door(&config, &bundle).await?;
    let grace = Duration::from_secs(config.mqtt.shutdown_grace_s);
    let (stopping, stopped) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        shutdown.await;
        let _ = stopping.send(true);
    };
    let reloads = reload_on_sighup(hup, args, config.clone());
    // [thin_edge]: beside the service, on a connection of its own; stopped after it (it says down).
    let thin_edge = crate::thin_edge::spawn(&config).map_err(|e| e.to_string())?;
    let mut door_task = None;
    let open_doors = |doorway: service::Doorway| {
        if let Some(open) = door {
            door_task = Some(open(doorway, stopped));
        }
    };
    let served = service::run(config, engine, bundle, shutdown, reloads, open_doors).await.map_err(|e| e.to_string());
    if let Some(task) = door_task
        && tokio::time::timeout(grace + Duration::from_secs(5), task).await.is_err()
    {
        tracing::warn!("the HTTP door still had connections open at shutdown");
    }
    if let Some(bridge) = thin_edge {
        bridge.stop().await;
    }
    served
}

/// How the HTTP door opens on the one question path, once the service gives it its doorway.
type OpenDoor = Box<dyn FnOnce(service::Doorway, tokio::sync::watch::Receiver<bool>) -> tokio::task::JoinHandle<()>>;

/// The HTTP door `[http]` asks for (`http.listen`), its address bound; none when it is off.
#[cfg(feature = "http")]
async fn http_door(config: &Config, bundle: &HostBundle) -> Result<Option<OpenDoor>, String> {
    let Some(addr) = config.http.listen_addr().map_err(|e| e.to_string())? else { return Ok(None) };
    let served_name = crate::service::identity::Identity::new(bundle).model_name;
    let settings = crate::http::DoorSettings::from_config(&config.http, &served_name).map_err(|e| e.to_string())?;
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("http.listen {addr}: cannot listen: {e}"))?;
    let addr = listener.local_addr().unwrap_or(addr);
    tracing::info!(%addr, model = settings.name(), key = settings.api_key.is_some(), "the HTTP door is open");
    println!(
        "laya.serve's API on http://{addr}/v1/systemone (health: http://{addr}/health)\n{}",
        curl_line(addr, &config.http)
    );
    Ok(Some(Box::new(move |doorway: service::Doorway, mut stopped: tokio::sync::watch::Receiver<bool>| {
        let metrics = doorway.metrics();
        let asker: Arc<dyn crate::http::Asker> = Arc::new(doorway);
        tokio::spawn(crate::http::run(listener, settings, asker, metrics, async move {
            let _ = stopped.wait_for(|s| *s).await;
        }))
    })))
}

/// A ready-to-paste `curl` line asking the first demo question through the HTTP door.
#[cfg(feature = "http")]
fn curl_line(addr: std::net::SocketAddr, http: &crate::config::Http) -> String {
    let first = DEMO_REQUESTS.lines().find(|l| !l.trim().is_empty()).unwrap_or("{}");
    let mut body = laya_topics::Map::new();
    if let Ok(laya_topics::Value::Object(request)) = laya_topics::json::parse_str(first, Default::default()) {
        for key in ["state", "questions"] {
            if let Some(v) = request.get(key) {
                body.insert(key.into(), v.clone());
            }
        }
    }
    let body = laya_topics::json::to_string(&laya_topics::Value::Object(body), laya_topics::json::Style::COMPACT);
    let bearer = match &http.api_key_file {
        Some(f) => format!(" -H \"authorization: Bearer $(cat {})\"", f.display()),
        None => String::new(),
    };
    format!(
        "ask it over HTTP:\n  curl -s http://{addr}/v1/systemone -H 'content-type: application/json'{bearer} -d '{}'\n  (laya's MCP server: LAYA_BASE_URL=http://{addr} laya-mcp-server)",
        body.replace('\'', "'\\''")
    )
}

/// A build without the `http` feature has no HTTP door.
#[cfg(not(feature = "http"))]
async fn http_door(config: &Config, _: &HostBundle) -> Result<Option<OpenDoor>, String> {
    match config.http.listen.trim() {
        "" => Ok(None),
        _ => Err("http.listen: this build leaves the HTTP door out (cargo feature `http`)".into()),
    }
}

/// What serving `config` needs before it connects: its model bundle, loaded and verified, and
/// its engine's configuration. Also what a reload prepares.
fn prepare(config: &Config) -> Result<(Arc<HostBundle>, EngineConfig), String> {
    // What check-config checks of [mqtt], before the model: a refusal names the key.
    service::connection::preflight(config).map_err(|e| e.to_string())?;
    let bundle =
        HostBundle::load_verified_as(Path::new(&config.model.dir), config.model.laya).map_err(|e| e.to_string())?;
    // The weights the workers will load, checked here without loading them (a truncated file is
    // named now, not by a worker that fails at every restart).
    backend::check_model(config, &bundle).map_err(|e| e.to_string())?;
    // A quantised CPU mode is judged by the probe here, once, and refused if it fails.
    crate::engine::fidelity::check(config, &bundle).map_err(|e| e.to_string())?;
    let program = backend::this_program().map_err(|e| e.to_string())?;
    let engine_config = EngineConfig::from_config(&program, config, &bundle).map_err(|e| e.to_string())?;
    Ok((Arc::new(bundle), engine_config))
}

/// SIGHUP (`systemctl reload`, an OTA tool that installed a new model) re-reads the configuration
/// file and the model bundle, with the command line's flags applied again, and hands the result
/// to the service, which starts it beside the serving engine (`service::Reload`). Loading
/// runs in the blocking pool: it reads and hashes the bundle's files. Each SIGHUP acted on is
/// one reload request, numbered from 1 (signals that come while one is being read are one).
fn reload_on_sighup(
    mut hup: tokio::signal::unix::Signal,
    args: Args,
    started_with: Config,
) -> tokio::sync::mpsc::UnboundedReceiver<service::Reload> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let args = Arc::new(args);
    tokio::spawn(async move {
        let mut request = 0u64;
        while hup.recv().await.is_some() {
            request += 1;
            tracing::info!(request, "SIGHUP: reloading the configuration and the model");
            let args = args.clone();
            let started_with = started_with.clone();
            // The model directory the new configuration names, once it is read.
            let model = Arc::new(std::sync::Mutex::new(None::<String>));
            let named = model.clone();
            let prepared = tokio::task::spawn_blocking(move || {
                let mut config = args.config()?;
                if args.demo {
                    // --demo's settings, as at start.
                    config.mqtt.broker = started_with.mqtt.broker.clone();
                    config.mqtt.device = started_with.mqtt.device.clone();
                    config.model.dir = started_with.model.dir.clone();
                    config.engine.backend = started_with.engine.backend;
                    config.mqtt.telemetry_interval_s = started_with.mqtt.telemetry_interval_s;
                }
                let dir = config.model.dir.display().to_string();
                if let Ok(mut m) = named.lock() {
                    *m = Some(dir.clone());
                }
                let (bundle, engine) = prepare(&config)?;
                let request = ReloadRef { request, model: Some(dir) };
                Ok::<_, String>(service::Reload::Candidate {
                    request,
                    config: Box::new(config),
                    bundle,
                    engine: Box::new(engine),
                })
            })
            .await;
            let model = model.lock().ok().and_then(|m| m.clone());
            let failed = |why| service::Reload::Failed { request: ReloadRef { request, model: model.clone() }, why };
            let reload = match prepared {
                Ok(Ok(candidate)) => candidate,
                Ok(Err(why)) => failed(format!("the new configuration or model cannot be used: {why}")),
                Err(e) => failed(format!("loading the new configuration failed: {e}")),
            };
            if tx.send(reload).is_err() {
                return;
            }
        }
    });
    rx
}

/// Asks the example questions once the agent is online, and prints the answers.
fn ask_demo_questions(config: &Config) -> Result<(), String> {
    let target = client::ask::Target {
        schema: Schema::new(&config.mqtt.prefix).map_err(|e| e.to_string())?,
        device: Some(config.mqtt.device.clone()),
        fleet: None,
    };
    let (broker, device) = (config.mqtt.broker.clone(), config.mqtt.device.clone());
    let how = ask_yourself(config);
    tokio::spawn(async move {
        // Ask only once the agent is subscribed: on a fresh broker an early question has no
        // listener yet.
        if let Ok((host, port, _)) = service::connection::parse_broker(&broker) {
            let options = rumqttc::v5::MqttOptions::new("demo-watch", host, port);
            if let Err(e) = client::ask::wait_online(options, &target.schema, &device, Duration::from_secs(120)).await {
                tracing::error!(error = %e, "demo: the agent did not come online");
                return;
            }
        }
        for (i, line) in DEMO_REQUESTS.lines().filter(|l| !l.trim().is_empty()).enumerate() {
            let Ok(request) = laya_topics::json::parse_str(line, Default::default()) else { continue };
            let Ok((host, port, _)) = service::connection::parse_broker(&broker) else { return };
            let options = rumqttc::v5::MqttOptions::new(format!("demo-asker-{i}"), host, port);
            match client::ask::ask(options, &target, &request, Encoding::Json, Duration::from_secs(120)).await {
                Ok(reply) => println!("{}", laya_topics::json::to_string(&reply, laya_topics::json::Style::PYTHON)),
                Err(e) => tracing::error!(question = i, error = %e, "demo question failed"),
            }
        }
        println!("demo: answered the example questions; still serving (Ctrl-C to stop)\n{how}");
    });
    Ok(())
}
