//! The agent's own overhead per question over MQTT, with the zero-cost `null` backend: a client
//! sends questions one at a time to a `laya-edge serve` process through a loopback broker and
//! measures the round trip (decode, admission, tokenize, the worker hop, decode, encode, two
//! broker hops). Also the in-process admission + reply encoding alone. Not a test: see
//! BENCHMARKS.md.
//!
//!     cargo bench --bench mqtt_overhead

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};

use laya_edge::bus::admission::{Admission, Decision, Incoming, ReplyCache};
use laya_edge::config::Config;
use laya_topics::Value;
use laya_topics::topic::Schema;
use laya_topics::wire::Encoding;

const N: usize = 500;

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
            response_topic: Some("laya/v1/c/reply/b1"),
            correlation: None,
            message_expiry_s: None,
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
            None => laya_edge::bus::demo::start_broker().expect("broker"),
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
    let request = laya_topics::json::parse(payload, Default::default()).expect("json");
    let times = rt.block_on(async {
        let watch = MqttOptions::new("bench-watch", "127.0.0.1", port);
        laya_edge::bus::ask::wait_online(watch, &Schema::default(), "bench", Duration::from_secs(60))
            .await
            .expect("the agent comes online");
        let mut options = MqttOptions::new("bench-client", "127.0.0.1", port);
        let mut net = rumqttc::NetworkOptions::new();
        net.set_tcp_nodelay(true);
        options.set_network_options(net);
        let (client, mut eventloop) = AsyncClient::new(options, 100);
        client.subscribe("laya/v1/bench-client/reply/#", QoS::AtLeastOnce).await.expect("subscribe");
        let mut times = Vec::with_capacity(N);
        let mut agent_ms: Vec<Vec<f64>> = vec![Vec::with_capacity(N); STAGES.len()];
        let mut sent_at = None;
        let mut i = 0;
        loop {
            match eventloop.poll().await.expect("connection") {
                Event::Incoming(packet @ (Packet::SubAck(_) | Packet::Publish(_))) => {
                    if let Some(t) = sent_at.take() {
                        times.push(Instant::now() - t);
                        // The agent's own account of its share (timing_ms of the reply).
                        if let Packet::Publish(p) = &packet
                            && let Ok(reply) = Encoding::Json.decode(&p.payload, 16)
                        {
                            for (k, v) in STAGES.iter().zip(agent_ms.iter_mut()) {
                                if let Some(Value::Float(ms)) = reply.get("timing_ms").and_then(|t| t.get(k)) {
                                    v.push(*ms);
                                }
                            }
                        }
                        if times.len() == N + 20 {
                            break;
                        }
                    }
                    // A new id per question: a repeated id would be answered from the reply cache.
                    let mut question = request.clone();
                    if let Value::Object(m) = &mut question {
                        m.insert("id".into(), Value::Str(format!("b{i}")));
                    }
                    let bytes = Encoding::Json.encode(&question);
                    let props = PublishProperties {
                        response_topic: Some("laya/v1/bench-client/reply/b".into()),
                        ..Default::default()
                    };
                    sent_at = Some(Instant::now());
                    client
                        .publish_with_properties("laya/v1/bench/ask", QoS::AtLeastOnce, false, bytes, props)
                        .await
                        .expect("publish");
                    i += 1;
                }
                _ => {}
            }
        }
        (times, agent_ms)
    });
    let (times, agent_ms) = times;
    let stages: Vec<String> = STAGES
        .iter()
        .zip(agent_ms)
        .map(|(k, mut v)| {
            v.sort_by(f64::total_cmp);
            format!("\"{k}\": {:.3}", v.get(v.len() / 2).copied().unwrap_or(f64::NAN))
        })
        .collect();
    let _ = agent.kill();
    let _ = agent.wait();
    if let Some(mut m) = mosquitto {
        let _ = m.kill();
        let _ = m.wait();
    }
    let mut t: Vec<Duration> = times[20..].to_vec(); // first 20: warm-up
    t.sort();
    println!(
        "{{\"bench\": \"mqtt_overhead\", \"questions\": {}, \"round_trip_ms_p50\": {:.3}, \"round_trip_ms_p99\": {:.3}, \"agent_ms_p50\": {{{}}}, \"admission_us\": {:.2}}}",
        t.len(),
        percentile(&t, 0.5),
        percentile(&t, 0.99),
        stages.join(", "),
        admission_us
    );
}
