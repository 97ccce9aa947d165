//! The agent's own overhead per question over MQTT, with the zero-cost `null` backend: a client
//! sends questions one at a time to a `laya-edge serve` process through a loopback broker and
//! measures the round trip (decode, admission, tokenize, the worker hop, decode, encode, two
//! broker hops). Also the in-process admission + reply encoding alone. Not a test: see
//! BENCHMARKS.md.
//!
//! Every request has a new id and a new state (a repeated request would be answered from the
//! reply cache, or tokenized from memory). Two workloads: `fleet`, where each request asks two
//! of a fixed set of six questions, as an application does, and `unseen`, where every
//! instruction and option is new, so the tokenizer's memo never helps (the worst case).
//!
//! Then fairness (issue #40): `fleet` questions one at a time again, on the idle agent and then
//! beside a flood: another client holds `LAYA_BENCH_FLOOD` (5000) questions, publishing them as
//! fast as the broker takes them and one more for each reply it gets (answered or `overloaded`,
//! counted by an observer) until the measurement ends; it never acknowledges a reply. The target:
//! the one-at-a-time client's p99 beside the flood within twice its idle p99 plus one batch (the
//! worker's time for the longest batch beside the flood: the most of the flood's answers'
//! `timing_ms.infer`, the time of the merged batch each ran in).
//! `LAYA_BENCH_NULL_FAULTS` (e.g. `sleep=20`, a batch of any size 20 ms; `row-sleep=1`, 1 ms a
//! row) makes the `null` backend's calls cost something.
//!
//!     cargo bench --bench mqtt_overhead

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};

use laya_edge::config::Config;
use laya_edge::service::admission::{Admission, Decision, Incoming, ReplyCache};
use laya_topics::Value;
use laya_topics::topic::Schema;
use laya_topics::wire::Encoding;

const N: usize = 500;
/// Requests per workload not measured (connection and caches warming up).
const WARM_UP: usize = 20;
/// Questions asked one at a time on the idle agent and beside the flood.
const BESIDE: usize = 300;

const WORDS: [&str; 40] = [
    "the",
    "app",
    "crashes",
    "when",
    "I",
    "log",
    "in",
    "again",
    "after",
    "update",
    "my",
    "invoice",
    "shows",
    "a",
    "double",
    "charge",
    "please",
    "help",
    "refund",
    "order",
    "screen",
    "stays",
    "black",
    "since",
    "yesterday",
    "upgrade",
    "plan",
    "price",
    "too",
    "high",
    "password",
    "reset",
    "email",
    "never",
    "arrives",
    "sync",
    "fails",
    "on",
    "android",
    "thanks",
];

/// The questions an application asks, again and again.
const FLEET_QUESTIONS: [&str; 6] = [
    r#""bug": {"type": "noul", "instructions": "Is this a bug report?"}"#,
    r#""team": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "technical", "sales"]}"#,
    r#""urgency": {"type": "score", "instructions": "How urgent is this?", "criteria": ["not urgent", "low", "medium", "high", "critical"]}"#,
    r#""refund": {"type": "noul", "instructions": "Is the customer asking for a refund?"}"#,
    r#""mood": {"type": "choice", "instructions": "How does the customer feel?", "criteria": {"angry": "upset, threatening to leave", "neutral": "matter of fact", "happy": "satisfied"}}"#,
    r#""churn": {"type": "noul", "instructions": "Might the customer cancel?"}"#,
];

/// A small deterministic generator (no randomness needed beyond variety).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// Request `i` of a workload: a new id and state; the fleet's questions or never-seen ones.
fn request(i: usize, unseen: bool, rng: &mut Lcg) -> Vec<u8> {
    let words: Vec<&str> = (0..6 + rng.below(15)).map(|_| WORDS[rng.below(WORDS.len())]).collect();
    let state = format!("Ticket {i}: {}.", words.join(" "));
    let questions = if unseen {
        format!(
            r#""q{i}a": {{"type": "noul", "instructions": "Is ticket {i} about {}?"}}, "q{i}b": {{"type": "choice", "instructions": "Which queue takes ticket {i}?", "criteria": ["{} {i}", "{} {i}", "{} {i}"]}}"#,
            WORDS[rng.below(WORDS.len())],
            WORDS[rng.below(WORDS.len())],
            WORDS[rng.below(WORDS.len())],
            WORDS[rng.below(WORDS.len())]
        )
    } else {
        let a = rng.below(FLEET_QUESTIONS.len());
        let b = (a + 1 + rng.below(FLEET_QUESTIONS.len() - 1)) % FLEET_QUESTIONS.len();
        format!("{}, {}", FLEET_QUESTIONS[a], FLEET_QUESTIONS[b])
    };
    format!(r#"{{"id": "b{i}", "state": "{state}", "questions": {{{questions}}}}}"#).into_bytes()
}

/// A child process killed when dropped (at the end, or when the benchmark panics).
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The agent's timing fields (`timing_ms` of each reply).
const STAGES: [&str; 5] = ["queue", "tokenize", "infer", "decode", "total"];

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}

fn main() {
    let payload = br#"{"id": "b1", "state": "The app crashes when I log in.", "questions": {"bug": {"type": "noul", "instructions": "Is this a bug report?"}, "team": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "technical", "sales"]}}}"#;

    // In process: admission and reply encoding.
    let admission = Admission::new(Schema::default(), "bench".into(), &Config::default());
    let cache = ReplyCache::new(1024);
    let t = Instant::now();
    for _ in 0..20_000 {
        let m = Incoming {
            payload,
            content_type: None,
            response_topic: Some("laya/v1/reply/c/b1"),
            correlation: None,
            message_expiry_s: None,
            retained: false,
        };
        let d = admission.decide(&m, Instant::now(), &cache);
        assert!(matches!(d, Decision::Answer { .. }));
    }
    let admission_us = t.elapsed().as_secs_f64() * 1e6 / 20_000.0;

    // mosquitto with TCP_NODELAY if installed (as in the tests), else the in-process rumqttd.
    let mut _mosquitto = None;
    let port = match ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    {
        Some(bin) => {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("port");
            let conf = std::env::temp_dir().join(format!("laya-bench-mosquitto-{}.conf", std::process::id()));
            std::fs::write(
                    &conf,
                    format!("user root\nlistener {port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\nmax_queued_messages 100000\n"),
                )
                .expect("conf");
            _mosquitto = Some(Reap(
                Command::new(bin)
                    .arg("-c")
                    .arg(&conf)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("mosquitto"),
            ));
            std::thread::sleep(Duration::from_millis(300));
            port
        }
        None => laya_edge::service::demo::start_broker(None).expect("broker"),
    };
    let model = format!("{}/../tests/fixtures/laya-0.3.20/models/bpe-t5", env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("laya-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("laya-edge.toml");
    let faults = std::env::var("LAYA_BENCH_NULL_FAULTS").unwrap_or_default();
    let flood_n: usize = std::env::var("LAYA_BENCH_FLOOD").ok().and_then(|n| n.parse().ok()).unwrap_or(5000);
    std::fs::write(&config, format!("[mqtt]\nbroker = \"mqtt://127.0.0.1:{port}\"\ndevice = \"bench\"\n[model]\ndir = \"{model}\"\n[engine]\nbackend = \"null\"\nnull_faults = \"{faults}\"\n")).expect("config");
    let agent = Reap(
        Command::new(env!("CARGO_BIN_EXE_laya-edge"))
            .args(["serve", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .spawn()
            .expect("agent"),
    );
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let workloads = ["fleet", "unseen"];
    let mut rng = Lcg(0x1a7a);
    let per = N + WARM_UP;
    let requests: Vec<Vec<u8>> = (0..workloads.len() * per).map(|i| request(i, i >= per, &mut rng)).collect();
    let first = workloads.len() * per;
    let idle_requests: Vec<Vec<u8>> = (first..first + BESIDE).map(|i| request(i, false, &mut rng)).collect();
    let beside_requests: Vec<Vec<u8>> =
        (first + BESIDE..first + 2 * BESIDE).map(|i| request(i, false, &mut rng)).collect();
    let flood_requests: Vec<Vec<u8>> = (0..flood_n).map(|i| request(1_000_000 + i, false, &mut rng)).collect();
    // Per reply: the round trip and the agent's own stage timings.
    let (measured, fair) = rt.block_on(async {
        let watch = MqttOptions::new("bench-watch", "127.0.0.1", port);
        laya_edge::client::ask::wait_online(watch, &Schema::default(), "bench", Duration::from_secs(60))
            .await
            .expect("the agent comes online");
        let mut options = MqttOptions::new("bench-client", "127.0.0.1", port);
        let mut net = rumqttc::NetworkOptions::new();
        net.set_tcp_nodelay(true);
        options.set_network_options(net);
        let (client, mut eventloop) = AsyncClient::new(options, 100);
        client.subscribe("laya/v1/reply/bench-client/#", QoS::AtLeastOnce).await.expect("subscribe");
        let mut measured: Vec<(Duration, Vec<f64>)> = Vec::with_capacity(requests.len());
        let mut sent_at = None;
        let mut next = requests.iter();
        loop {
            if let Event::Incoming(packet @ (Packet::SubAck(_) | Packet::Publish(_))) =
                eventloop.poll().await.expect("connection")
            {
                if let Some(t) = sent_at.take() {
                    let elapsed = Instant::now() - t;
                    let mut stages = vec![f64::NAN; STAGES.len()];
                    if let Packet::Publish(p) = &packet {
                        let reply = Encoding::Json.decode(&p.payload, 16).expect("a JSON reply");
                        assert!(reply.get("answers").is_some(), "not answered: {reply:?}");
                        for (k, v) in STAGES.iter().zip(stages.iter_mut()) {
                            if let Some(Value::Float(ms)) = reply.get("timing_ms").and_then(|t| t.get(k)) {
                                *v = *ms;
                            }
                        }
                    }
                    measured.push((elapsed, stages));
                }
                let Some(bytes) = next.next() else { break };
                let props = PublishProperties {
                    response_topic: Some("laya/v1/reply/bench-client/b".into()),
                    ..Default::default()
                };
                sent_at = Some(Instant::now());
                client
                    .publish_with_properties("laya/v1/bench/ask", QoS::AtLeastOnce, false, bytes.clone(), props)
                    .await
                    .expect("publish");
            }
        }
        (measured, fairness(port, &idle_requests, &beside_requests, flood_requests).await)
    });
    drop(agent);
    let mut report = Vec::new();
    for (w, name) in workloads.iter().enumerate() {
        let run = &measured[w * per + WARM_UP..(w + 1) * per];
        let mut t: Vec<Duration> = run.iter().map(|(d, _)| *d).collect();
        t.sort();
        let stages: Vec<String> = STAGES
            .iter()
            .enumerate()
            .map(|(k, name)| format!("\"{name}\": {:.3}", median(run.iter().map(|(_, s)| s[k]).collect())))
            .collect();
        report.push(format!(
            "\"{name}\": {{\"questions\": {}, \"round_trip_ms_p50\": {:.3}, \"round_trip_ms_p99\": {:.3}, \"agent_ms_p50\": {{{}}}}}",
            t.len(),
            percentile(&t, 0.5),
            percentile(&t, 0.99),
            stages.join(", ")
        ));
    }
    let (idle, beside) = (sorted(&fair.idle), sorted(&fair.beside));
    let batch_ms = fair.batch_ms;
    let target_ms = 2.0 * percentile(&idle, 0.99) + batch_ms;
    let stages = |run: &[(Duration, Vec<f64>)]| {
        STAGES
            .iter()
            .enumerate()
            .map(|(k, name)| format!("\"{name}\": {:.3}", median(run.iter().map(|(_, s)| s[k]).collect())))
            .collect::<Vec<_>>()
            .join(", ")
    };
    // Beside the flood, each stage's p99, and the p99 of what the agent's own timing does not
    // hold (the round trip less `total`: the broker's hops, reading the question off the
    // connection, and the reply's way out): where another client's time goes.
    let p99s = |run: &[(Duration, Vec<f64>)]| {
        let total = STAGES.iter().position(|s| *s == "total").unwrap_or(STAGES.len() - 1);
        let mut out: Vec<String> = STAGES
            .iter()
            .enumerate()
            .map(|(k, name)| format!("\"{name}\": {:.3}", p99_of(run.iter().map(|(_, s)| s[k]).collect())))
            .collect();
        let outside = run.iter().map(|(d, s)| d.as_secs_f64() * 1000.0 - s[total]).collect();
        out.push(format!("\"outside\": {:.3}", p99_of(outside)));
        out.join(", ")
    };
    report.push(format!(
        "\"fairness\": {{\"null_faults\": \"{faults}\", \"idle\": {}, \"beside_flood\": {}, \"agent_ms_p50\": {{\"idle\": {{{}}}, \"beside_flood\": {{{}}}}}, \"beside_flood_ms_p99\": {{{}}}, \"batch_ms\": {batch_ms:.3}, \"target_p99_ms\": {target_ms:.3}, \"met\": {}, \"flood\": {{\"held\": {flood_n}, \"published\": {}, \"answered\": {}, \"overloaded\": {}, \"other\": {}, \"replied_in_ms\": {:.0}}}}}",
        figures(&idle),
        figures(&beside),
        stages(&fair.idle),
        stages(&fair.beside),
        p99s(&fair.beside),
        percentile(&beside, 0.99) <= target_ms,
        fair.flood_published,
        fair.flood_answered,
        fair.flood_overloaded,
        fair.flood_other,
        fair.flood_took.as_secs_f64() * 1000.0,
    ));
    println!("{{\"bench\": \"mqtt_overhead\", {}, \"admission_us\": {admission_us:.2}}}", report.join(", "));
}

fn sorted(run: &[(Duration, Vec<f64>)]) -> Vec<Duration> {
    let mut t: Vec<Duration> = run.iter().map(|(d, _)| *d).collect();
    t.sort();
    t
}

fn figures(sorted: &[Duration]) -> String {
    format!(
        "{{\"questions\": {}, \"p50_ms\": {:.3}, \"p99_ms\": {:.3}, \"max_ms\": {:.3}}}",
        sorted.len(),
        percentile(sorted, 0.5),
        percentile(sorted, 0.99),
        sorted.last().map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
    )
}

fn p99_of(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 * 0.99).ceil() as usize).saturating_sub(1)).copied().unwrap_or(f64::NAN)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// What the fairness phase measured.
struct Fairness {
    idle: Vec<(Duration, Vec<f64>)>,
    beside: Vec<(Duration, Vec<f64>)>,
    /// One batch: the worker's time for the longest batch beside the flood (`timing_ms.infer` of
    /// the flood's answers, the most): the one another client's question may arrive behind.
    batch_ms: f64,
    /// Questions the flood published in all: its first ones and one more per reply.
    flood_published: usize,
    flood_answered: usize,
    flood_overloaded: usize,
    flood_other: usize,
    /// From the flood's first question to its last reply.
    flood_took: Duration,
}

/// An MQTT 5 client on `port` with TCP_NODELAY, polled by a task of its own that hands on what it
/// receives.
fn connect(port: u16, id: &str, manual_acks: bool) -> (AsyncClient, tokio::sync::mpsc::UnboundedReceiver<Packet>) {
    let mut options = MqttOptions::new(id, "127.0.0.1", port);
    let mut net = rumqttc::NetworkOptions::new();
    net.set_tcp_nodelay(true);
    options.set_network_options(net);
    options.set_manual_acks(manual_acks);
    let (client, mut eventloop) = AsyncClient::new(options, 20_000);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(p)) => {
                    if tx.send(p).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                // Disconnected (at the end): the receiver sees the channel close.
                Err(_) => return,
            }
        }
    });
    (client, rx)
}

/// Subscribes `client` to `filter` and waits for the SUBACK on `rx`.
async fn subscribe(client: &AsyncClient, rx: &mut tokio::sync::mpsc::UnboundedReceiver<Packet>, filter: &str) {
    client.subscribe(filter, QoS::AtLeastOnce).await.expect("subscribe");
    while !matches!(rx.recv().await.expect("connection"), Packet::SubAck(_)) {}
}

/// `requests` one at a time as client `id`: each round trip and the agent's stage timings.
async fn one_at_a_time(port: u16, id: &str, requests: &[Vec<u8>]) -> Vec<(Duration, Vec<f64>)> {
    let (client, mut rx) = connect(port, id, false);
    subscribe(&client, &mut rx, &format!("laya/v1/reply/{id}/#")).await;
    one_at_a_time_on(&client, &mut rx, id, requests).await
}

/// [`one_at_a_time`] on a client connected and subscribed.
async fn one_at_a_time_on(
    client: &AsyncClient,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Packet>,
    id: &str,
    requests: &[Vec<u8>],
) -> Vec<(Duration, Vec<f64>)> {
    let mut measured = Vec::with_capacity(requests.len());
    for bytes in requests {
        let props = PublishProperties { response_topic: Some(format!("laya/v1/reply/{id}/b")), ..Default::default() };
        let sent = Instant::now();
        client
            .publish_with_properties("laya/v1/bench/ask", QoS::AtLeastOnce, false, bytes.clone(), props)
            .await
            .expect("publish");
        let p = loop {
            if let Packet::Publish(p) = rx.recv().await.expect("connection") {
                break p;
            }
        };
        let elapsed = sent.elapsed();
        let reply = Encoding::Json.decode(&p.payload, 16).expect("a JSON reply");
        assert!(reply.get("answers").is_some(), "not answered: {reply:?}");
        let stages = STAGES
            .iter()
            .map(|k| match reply.get("timing_ms").and_then(|t| t.get(k)) {
                Some(Value::Float(ms)) => *ms,
                _ => f64::NAN,
            })
            .collect();
        measured.push((elapsed, stages));
    }
    let _ = client.disconnect().await;
    measured
}

/// The fairness phase (module doc).
async fn fairness(port: u16, idle: &[Vec<u8>], beside: &[Vec<u8>], flood: Vec<Vec<u8>>) -> Fairness {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let idle = one_at_a_time(port, "bench-idle", idle).await;
    // The observer counts the flood's replies; each one makes the flood ask again while the
    // measurement runs, so the flood holds its questions throughout.
    let (observer, mut seen) = connect(port, "bench-observer", false);
    subscribe(&observer, &mut seen, "laya/v1/reply/bench-flood/#").await;
    let (published, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let (again, mut asks) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (underway, first_reply) = tokio::sync::oneshot::channel();
    let counted = tokio::spawn({
        let (published, stop) = (published.clone(), stop.clone());
        async move {
            let (mut answered, mut overloaded, mut other) = (0, 0, 0);
            let mut batches = Vec::new();
            let mut underway = Some(underway);
            loop {
                let got = tokio::time::timeout(Duration::from_millis(100), seen.recv()).await;
                if let Ok(Some(Packet::Publish(p))) = got {
                    if let Some(u) = underway.take() {
                        let _ = u.send(());
                    }
                    let reply = Encoding::Json.decode(&p.payload, 16).expect("a JSON reply");
                    match reply.get("error").and_then(|e| e.get("code")).and_then(Value::as_str) {
                        None => answered += 1,
                        Some("overloaded") => overloaded += 1,
                        Some(_) => other += 1,
                    }
                    if let Some(Value::Float(ms)) = reply.get("timing_ms").and_then(|t| t.get("infer")) {
                        batches.push(*ms);
                    }
                    let _ = again.send(());
                }
                if stop.load(Ordering::SeqCst) && answered + overloaded + other >= published.load(Ordering::SeqCst) {
                    let batch = batches.iter().copied().fold(f64::NAN, f64::max);
                    return (answered, overloaded, other, batch, Instant::now());
                }
            }
        }
    });
    // The flood: its client subscribes to its replies and never acknowledges one.
    let (flooder, mut flood_rx) = connect(port, "bench-flood", true);
    subscribe(&flooder, &mut flood_rx, "laya/v1/reply/bench-flood/#").await;
    tokio::spawn(async move { while flood_rx.recv().await.is_some() {} });
    let started = Instant::now();
    tokio::spawn({
        let (published, stop) = (published.clone(), stop.clone());
        async move {
            let publish = |i: usize| {
                let props = PublishProperties {
                    response_topic: Some(format!("laya/v1/reply/bench-flood/{i}")),
                    ..Default::default()
                };
                let bytes = flood[i % flood.len()].clone();
                let flooder = flooder.clone();
                async move {
                    flooder
                        .publish_with_properties("laya/v1/bench/ask", QoS::AtLeastOnce, false, bytes, props)
                        .await
                        .expect("publish")
                }
            };
            for i in 0..flood.len() {
                published.fetch_add(1, Ordering::SeqCst);
                publish(i).await;
            }
            let mut i = flood.len();
            while asks.recv().await.is_some() {
                if stop.load(Ordering::SeqCst) {
                    continue;
                }
                published.fetch_add(1, Ordering::SeqCst);
                publish(i).await;
                i += 1;
            }
        }
    });
    // Once the agent has answered the flood's first question, the one-at-a-time client asks
    // behind what is left of it.
    let (beside_client, mut beside_rx) = connect(port, "bench-beside", false);
    subscribe(&beside_client, &mut beside_rx, "laya/v1/reply/bench-beside/#").await;
    let _ = first_reply.await;
    let beside = one_at_a_time_on(&beside_client, &mut beside_rx, "bench-beside", beside).await;
    stop.store(true, Ordering::SeqCst);
    let (flood_answered, flood_overloaded, flood_other, batch_ms, done) =
        tokio::time::timeout(Duration::from_secs(600), counted).await.expect("the flood replied").expect("counted");
    let flood_published = published.load(Ordering::SeqCst);
    Fairness {
        idle,
        beside,
        batch_ms,
        flood_published,
        flood_answered,
        flood_overloaded,
        flood_other,
        flood_took: done - started,
    }
}
