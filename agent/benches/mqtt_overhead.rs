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
    let mut mosquitto = None;
    let port =
        match ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"].into_iter().find(|p| std::path::Path::new(p).exists()) {
            Some(bin) => {
                let port = std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .map(|a| a.port())
                    .expect("port");
                let conf = std::env::temp_dir().join(format!("laya-bench-mosquitto-{}.conf", std::process::id()));
                std::fs::write(
                    &conf,
                    format!("user root\nlistener {port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\n"),
                )
                .expect("conf");
                mosquitto = Some(
                    Command::new(bin)
                        .arg("-c")
                        .arg(&conf)
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("mosquitto"),
                );
                std::thread::sleep(Duration::from_millis(300));
                port
            }
            None => laya_edge::service::demo::start_broker(None).expect("broker"),
        };
    let model = format!("{}/../tests/fixtures/laya-0.3.20/models/bpe-t5", env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("laya-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("laya-edge.toml");
    std::fs::write(&config, format!("[mqtt]\nbroker = \"mqtt://127.0.0.1:{port}\"\ndevice = \"bench\"\n[model]\ndir = \"{model}\"\n[engine]\nbackend = \"null\"\n")).expect("config");
    let mut agent = Command::new(env!("CARGO_BIN_EXE_laya-edge"))
        .args(["serve", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .spawn()
        .expect("agent");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let workloads = ["fleet", "unseen"];
    let mut rng = Lcg(0x1a7a);
    let per = N + WARM_UP;
    let requests: Vec<Vec<u8>> = (0..workloads.len() * per).map(|i| request(i, i >= per, &mut rng)).collect();
    // Per reply: the round trip and the agent's own stage timings.
    let measured: Vec<(Duration, Vec<f64>)> = rt.block_on(async {
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
        let mut measured = Vec::with_capacity(requests.len());
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
        measured
    });
    let _ = agent.kill();
    let _ = agent.wait();
    if let Some(mut m) = mosquitto {
        let _ = m.kill();
        let _ = m.wait();
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
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
    println!("{{\"bench\": \"mqtt_overhead\", {}, \"admission_us\": {admission_us:.2}}}", report.join(", "));
}
