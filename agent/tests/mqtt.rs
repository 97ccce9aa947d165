//! `laya-edge serve` against a real broker: mosquitto 2.x started by the tests (`.ci/run`
//! installs it). Each test starts its own broker on a free port and its own agents as processes.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Publish, PublishProperties};

use common::*;
use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};
use laya_topics::wire::Encoding;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt5_request_and_response_with_correlation_data_in_json_and_cbor() {
    let broker = Broker::start("rr", "");
    let _agent = Agent::start(&broker, "dev1", "");
    wait_online(broker.port, "dev1").await;
    let mut c = Client::connect(broker.port, "asker-rr").await;
    c.subscribe("laya/v1/reply/asker-rr/#").await;
    // The third request is large enough to be tokenized in the blocking pool, not in place.
    let long_state = "The app crashes when I log in, please help. ".repeat(60);
    for (i, (enc, state)) in
        [(Encoding::Json, None), (Encoding::Cbor, None), (Encoding::Json, Some(long_state.as_str()))]
            .into_iter()
            .enumerate()
    {
        let id = format!("r{i}");
        let mut req = request(&id);
        if let (Some(s), Value::Object(m)) = (state, &mut req) {
            m.insert("state".into(), Value::from(s));
        }
        let body = enc.encode(&req);
        let inline = laya_edge::bus::server::INLINE_TOKENIZE_BYTES;
        assert_eq!(state.is_some(), body.len() > inline, "request {i} is {} bytes", body.len());
        c.ask("laya/v1/dev1/ask", body, Some(&format!("laya/v1/reply/asker-rr/{id}")), Some(b"corr-42"), enc).await;
        let p = c.next(Duration::from_secs(60)).await.expect("a reply");
        let props = p.properties.clone().expect("properties");
        assert_eq!(props.correlation_data.as_deref(), Some(&b"corr-42"[..]));
        assert_eq!(props.content_type.as_deref(), Some(enc.content_type()));
        let v = decode(&p);
        assert_eq!(v.get("id"), Some(&Value::from(id.as_str())));
        assert_eq!(v.get("device"), Some(&Value::from("dev1")));
        assert_eq!(v.get("backend"), Some(&Value::from("cpu")));
        assert_eq!(v.get("model"), Some(&Value::from("laya-rl-agent")));
        for k in ["queue", "tokenize", "infer", "decode", "total"] {
            assert!(v.get("timing_ms").and_then(|t| t.get(k)).is_some(), "timing {k}");
        }
        // The same answers as the CPU backend in process.
        let bundle = laya_edge::bundle::HostBundle::load(Path::new(&model("bpe-small"))).expect("bundle");
        let mut cpu = laya_edge::engine::cpu::CpuBackend::load(
            Path::new(&model("bpe-small")),
            &bundle.config,
            bundle.tokenizer.pad.id,
        )
        .expect("cpu");
        let req = laya_topics::Request::from_value(req).expect("request");
        let want = laya_edge::pipeline::answer(&bundle, &mut cpu, &req).expect("answer").to_value();
        assert_eq!(text(v.get("answers").expect("answers")), text(want.get("answers").expect("answers")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mqtt311_client_is_answered_on_the_reply_topic() {
    let broker = Broker::start("v311", "");
    let _agent = Agent::start(&broker, "dev311", "[engine]\nbackend = \"null\"\n");
    wait_online(broker.port, "dev311").await;
    let o = rumqttc::MqttOptions::new("client-311", "127.0.0.1", broker.port);
    let (client, mut eventloop) = rumqttc::AsyncClient::new(o, 10);
    client.subscribe("laya/v1/dev311/reply/r311", rumqttc::QoS::AtLeastOnce).await.expect("subscribe");
    let mut published = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    let payload = loop {
        assert!(Instant::now() < deadline, "no reply for the 3.1.1 client");
        match tokio::time::timeout(Duration::from_secs(5), eventloop.poll()).await {
            Ok(Ok(rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_)))) if !published => {
                published = true;
                let body = Encoding::Json.encode(&request("r311"));
                client.publish("laya/v1/dev311/ask", rumqttc::QoS::AtLeastOnce, false, body).await.expect("publish");
            }
            Ok(Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)))) => break p.payload,
            _ => {}
        }
    };
    let v = json::parse(&payload, ParseOptions::default()).expect("json reply");
    assert_eq!(v.get("id"), Some(&Value::from("r311")));
    assert_eq!(v.get("backend"), Some(&Value::from("null")));
}

/// The next telemetry document on `c` (subscribed to the device's telemetry) that `want` accepts.
async fn telemetry_where(c: &mut Client, what: &str, want: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let p = c.next(left).await.unwrap_or_else(|| panic!("no telemetry with {what}"));
        let v = decode(&p);
        if want(&v) {
            return v;
        }
    }
}

fn counter(v: &Value, path: &[&str]) -> i64 {
    path.iter().try_fold(v, |v, k| v.get(k)).and_then(Value::as_i64).unwrap_or_else(|| panic!("{path:?} in {v:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_counts_answers_and_a_repeated_question_is_not_tokenized_again() {
    let broker = Broker::start("telemetry", "");
    let _agent = Agent::start(&broker, "dev-tm", "[engine]\nbackend = \"null\"\n");
    wait_online(broker.port, "dev-tm").await;
    let mut watch = Client::connect(broker.port, "tm-watch").await;
    watch.subscribe("laya/v1/dev-tm/telemetry").await;
    let mut c = Client::connect(broker.port, "tm-asker").await;
    c.subscribe("laya/v1/reply/tm-asker/#").await;
    let before = telemetry_where(&mut watch, "no answer yet", |v| counter(v, &["answered"]) == 0).await;
    assert_eq!(before.get("device"), Some(&Value::from("dev-tm")));
    assert_eq!(before.get("serving"), Some(&Value::from("primary")));
    let mut seen = Vec::new();
    for (i, id) in ["t1", "t2"].into_iter().enumerate() {
        let reply_to = format!("laya/v1/reply/tm-asker/{id}");
        c.ask("laya/v1/dev-tm/ask", Encoding::Json.encode(&request(id)), Some(&reply_to), None, Encoding::Json).await;
        let reply = c.next(Duration::from_secs(30)).await.expect("a reply");
        assert_eq!(decode(&reply).get("id"), Some(&Value::from(id)));
        let answered = i as i64 + 1;
        seen.push(telemetry_where(&mut watch, "the answer counted", |v| counter(v, &["answered"]) == answered).await);
    }
    let memo = |v: &Value, k: &str| counter(v, &["token_memo", k]);
    // The first request tokenizes its instructions and options; the second, asking the same
    // questions under a new id, finds every one of them remembered.
    let texts = memo(&seen[0], "misses") - memo(&before, "misses");
    assert!(texts >= 4, "two instructions and at least two options per question: {texts}");
    assert_eq!(memo(&seen[1], "misses"), memo(&seen[0], "misses"));
    // Every text of the second request is a hit: at least the first request's new ones (texts it
    // shares with the engine's health rows, such as a yes/no question's options, were hits already).
    assert!(memo(&seen[1], "hits") - memo(&seen[0], "hits") >= texts);
    assert_eq!(memo(&seen[1], "entries"), memo(&seen[1], "misses"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_slower_to_load_than_the_configured_startup_timeout_is_replaced() {
    let broker = Broker::start("startup", "");
    // The first worker takes 30 s to load; the ones after it load at once.
    let marker = temp_dir("startup-once").join("loaded-slowly");
    let _ = std::fs::remove_file(&marker);
    let engine = format!(
        "[engine]\nbackend = \"null\"\nstartup_timeout_s = 1\nnull_faults = \"load-sleep=30000,once={}\"\n",
        marker.display()
    );
    let _agent = Agent::start(&broker, "dev-startup", &engine);
    wait_online(broker.port, "dev-startup").await;
    let mut watch = Client::connect(broker.port, "startup-watch").await;
    watch.subscribe("laya/v1/dev-startup/telemetry").await;
    let mut c = Client::connect(broker.port, "startup-asker").await;
    c.subscribe("laya/v1/reply/startup-asker/#").await;
    let reply_to = "laya/v1/reply/startup-asker/s1";
    c.ask("laya/v1/dev-startup/ask", Encoding::Json.encode(&request("s1")), Some(reply_to), None, Encoding::Json).await;
    // Well before the slow worker would have loaded.
    let reply = decode(&c.next(Duration::from_secs(20)).await.expect("answered by the replacement worker"));
    assert!(reply.get("answers").is_some(), "{reply:?}");
    telemetry_where(&mut watch, "the restart counted", |v| {
        v.get("restarts").and_then(|r| r.get("load_failed")).and_then(Value::as_i64) == Some(1)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_subscription_spreads_a_fleets_questions_over_three_agents() {
    let broker = Broker::start("fleet", "");
    let fleet = "[mqtt]\nfleet = \"north\"\nshare_group = \"workers\"\n[engine]\nbackend = \"null\"\n";
    // The [mqtt] table is already open in the agent's config: put the keys in it.
    let extra = fleet.replacen("[mqtt]\n", "", 1);
    let agents: Vec<Agent> = (0..3).map(|i| Agent::start(&broker, &format!("fleet-dev{i}"), &extra)).collect();
    for i in 0..3 {
        wait_online(broker.port, &format!("fleet-dev{i}")).await;
    }
    let mut c = Client::connect(broker.port, "fleet-asker").await;
    c.subscribe("laya/v1/reply/fleet-asker/#").await;
    let n = 60;
    for i in 0..n {
        let id = format!("f{i}");
        c.ask(
            "laya/v1/fleet/north/ask",
            Encoding::Json.encode(&request(&id)),
            Some(&format!("laya/v1/reply/fleet-asker/{id}")),
            None,
            Encoding::Json,
        )
        .await;
    }
    // Every reply, duplicates included: agents subscribed without `$share` would each answer
    // every question.
    let mut replies: Vec<(String, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let distinct = |r: &[(String, String)]| r.iter().map(|(id, _)| id.clone()).collect::<HashSet<_>>().len();
    while distinct(&replies) < n && Instant::now() < deadline {
        if let Some(p) = c.next(Duration::from_secs(2)).await {
            replies.push(reply_id_and_device(&p));
        }
    }
    // Then keep listening: a second answer to any question may still be on its way.
    while let Some(p) = c.next(Duration::from_secs(2)).await {
        replies.push(reply_id_and_device(&p));
    }
    let mut per_id: HashMap<&str, Vec<&str>> = HashMap::new();
    for (id, device) in &replies {
        per_id.entry(id).or_default().push(device);
    }
    let twice: Vec<_> = per_id.iter().filter(|(_, d)| d.len() > 1).collect();
    assert!(twice.is_empty(), "questions answered more than once: {twice:?}");
    let missing: Vec<String> = (0..n).map(|i| format!("f{i}")).filter(|id| !per_id.contains_key(id.as_str())).collect();
    assert!(missing.is_empty(), "unanswered fleet questions: {missing:?}");
    assert_eq!(replies.len(), n, "exactly one reply per question: {replies:?}");
    let devices: HashSet<&str> = replies.iter().map(|(_, d)| d.as_str()).collect();
    assert_eq!(devices.len(), 3, "the load is spread over all three agents: {devices:?}");
    drop(agents);
}

/// A reply's `id` and `device`.
fn reply_id_and_device(p: &Publish) -> (String, String) {
    let v = decode(p);
    let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    (field("id"), field("device"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_under_load_loses_no_question() {
    let mut broker = Broker::start("restart", "");
    let _agent = Agent::start(&broker, "dev-restart", "[engine]\nbackend = \"null\"\nnull_faults = \"sleep=20\"\n");
    wait_online(broker.port, "dev-restart").await;
    // The asker keeps a persistent session too, so replies published while it is away wait for it.
    let mut c = Persistent::connect(broker.port, "restart-asker").await;
    c.subscribe("laya/v1/reply/restart-asker/#").await;
    let n = 80;
    for i in 0..n {
        let id = format!("q{i}");
        let to = format!("laya/v1/reply/restart-asker/{id}");
        c.ask("laya/v1/dev-restart/ask", Encoding::Json.encode(&request(&id)), Some(&to)).await;
        if i == n / 2 {
            broker.restart();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut answered = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while answered.len() < n && Instant::now() < deadline {
        if let Some(p) = c.next(Duration::from_secs(2)).await
            && let Some(id) = decode(&p).get("id").and_then(Value::as_str)
        {
            answered.insert(id.to_owned());
        }
    }
    let missing: Vec<usize> = (0..n).filter(|i| !answered.contains(&format!("q{i}"))).collect();
    assert!(missing.is_empty(), "unanswered after the broker restart: {missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_question_answers_it_after_restarting() {
    let broker = Broker::start("kill9", "");
    let mut agent = Agent::start(&broker, "dev-kill", "[engine]\nbackend = \"null\"\nnull_faults = \"sleep=3000\"\n");
    wait_online(broker.port, "dev-kill").await;
    let mut c = Client::connect(broker.port, "kill-asker").await;
    c.subscribe("laya/v1/reply/kill-asker/#").await;
    let mut watch = Client::connect(broker.port, "kill-watch").await;
    watch.subscribe("laya/v1/dev-kill/telemetry").await;
    c.ask(
        "laya/v1/dev-kill/ask",
        Encoding::Json.encode(&request("k1")),
        Some("laya/v1/reply/kill-asker/k1"),
        None,
        Encoding::Json,
    )
    .await;
    // Killed while it computes the answer (not before the question reached it).
    telemetry_where(&mut watch, "the question in flight", |v| v.get("in_flight").and_then(Value::as_i64) >= Some(1))
        .await;
    agent.kill9();
    assert!(c.next(Duration::from_millis(500)).await.is_none(), "no reply from a killed agent");
    agent.launch();
    let p = c.next(Duration::from_secs(60)).await.expect("the question is redelivered and answered");
    assert_eq!(decode(&p).get("id"), Some(&Value::from("k1")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_and_oversize_get_clear_errors() {
    let broker = Broker::start("limits", "");
    let _agent = Agent::start(
        &broker,
        "dev-lim",
        // A Receive Maximum above the queue, so the broker sends more than the agent holds,
        // and no waiting room: what does not fit the queue is refused at once.
        "max_payload = 2000\nreceive_maximum = 100\n[limits]\nqueue = 1\nwaiting_bytes = 0\n[engine]\nbackend = \"null\"\nnull_faults = \"sleep=1500\"\n",
    );
    wait_online(broker.port, "dev-lim").await;
    let mut c = Client::connect(broker.port, "lim-asker").await;
    c.subscribe("laya/v1/reply/lim-asker/#").await;
    for i in 0..4 {
        let id = format!("o{i}");
        c.ask(
            "laya/v1/dev-lim/ask",
            Encoding::Json.encode(&request(&id)),
            Some(&format!("laya/v1/reply/lim-asker/{id}")),
            None,
            Encoding::Json,
        )
        .await;
    }
    let big = format!(r#"{{"id": "big", "state": "{}", "questions": {{}}}}"#, "x".repeat(5000));
    c.ask("laya/v1/dev-lim/ask", big.into_bytes(), Some("laya/v1/reply/lim-asker/big"), None, Encoding::Json).await;
    let mut codes: HashMap<String, String> = HashMap::new();
    while codes.len() < 5 {
        let p = c.next(Duration::from_secs(30)).await.expect("a reply for each question");
        let v = decode(&p);
        // A payload over the limit is not read, so its error carries no id: go by the topic.
        let topic = String::from_utf8_lossy(&p.topic).into_owned();
        let id = topic.rsplit('/').next().unwrap_or("?").to_owned();
        let code = v.get("error").and_then(|e| e.get("code")).and_then(Value::as_str).unwrap_or("ok").to_owned();
        if code == "overloaded" {
            assert_eq!(v.get("error").and_then(|e| e.get("retryable")), Some(&Value::Bool(true)));
        }
        codes.insert(id, code);
    }
    assert_eq!(codes["o0"], "ok");
    assert!(codes.values().filter(|c| *c == "overloaded").count() >= 2, "{codes:?}");
    assert_eq!(codes["big"], "too_large");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn questions_a_broker_sends_beyond_the_queue_wait_within_waiting_bytes_and_the_rest_are_overloaded() {
    let broker = Broker::start("waiting", "");
    // Every question of this test has the same size; the waiting room holds two of them.
    let size = Encoding::Json.encode(&request("w0")).len();
    let _agent = Agent::start(
        &broker,
        "dev-wait",
        // A Receive Maximum above the queue: the broker sends more than the queue holds, as a
        // broker that does not honour the Receive Maximum does.
        &format!(
            "receive_maximum = 100\n[limits]\nqueue = 1\nwaiting_bytes = {}\n[engine]\nbackend = \"null\"\nnull_faults = \"sleep=400\"\n",
            2 * size + size / 2
        ),
    );
    wait_online(broker.port, "dev-wait").await;
    let mut c = Client::connect(broker.port, "wait-asker").await;
    c.subscribe("laya/v1/reply/wait-asker/#").await;
    for i in 0..5 {
        let id = format!("w{i}");
        c.ask(
            "laya/v1/dev-wait/ask",
            Encoding::Json.encode(&request(&id)),
            Some(&format!("laya/v1/reply/wait-asker/{id}")),
            None,
            Encoding::Json,
        )
        .await;
    }
    let mut order = Vec::new();
    let mut codes: HashMap<String, String> = HashMap::new();
    while codes.len() < 5 {
        let p = c.next(Duration::from_secs(30)).await.expect("a reply for each question");
        let v = decode(&p);
        let id = v.get("id").and_then(Value::as_str).expect("id").to_owned();
        let code = v.get("error").and_then(|e| e.get("code")).and_then(Value::as_str).unwrap_or("ok").to_owned();
        assert!(codes.insert(id.clone(), code.clone()).is_none(), "one reply per question: {id} twice");
        if code == "ok" {
            order.push(id);
        }
    }
    // One runs, two wait for its place and are answered in arrival order, two are refused.
    assert_eq!(order, ["w0", "w1", "w2"], "{codes:?}");
    assert_eq!(codes["w3"], "overloaded", "{codes:?}");
    assert_eq!(codes["w4"], "overloaded", "{codes:?}");
    assert!(c.next(Duration::from_secs(2)).await.is_none(), "nothing more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_fuzzed_payloads_leave_the_agent_alive_and_answering() {
    let broker = Broker::start("fuzz", "");
    let mut agent = Agent::start(&broker, "dev-fuzz", "[engine]\nbackend = \"null\"\n");
    wait_online(broker.port, "dev-fuzz").await;
    let mut c = Client::connect(broker.port, "fuzz-asker").await;
    c.subscribe("laya/v1/reply/fuzz-asker/#").await;
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let fragments: [&[u8]; 12] = [
        b"{",
        b"}",
        b"[",
        b"\"state\"",
        b"\"questions\"",
        b":",
        b",",
        b"\"id\"",
        b"NaN",
        b"1e999",
        b"\xa1\x61",
        b"\"type\": \"choice\"",
    ];
    for i in 0..10_000 {
        let mut payload = Vec::new();
        let parts = next() % 12;
        for _ in 0..parts {
            if next() % 3 == 0 {
                let len = next() % 16;
                for _ in 0..len {
                    payload.push((next() & 0xff) as u8);
                }
            } else {
                payload.extend_from_slice(fragments[(next() % 12) as usize]);
            }
        }
        let qos = if i % 2 == 0 { QoS::AtMostOnce } else { QoS::AtLeastOnce };
        let reply = (i % 5 == 0).then(|| format!("laya/v1/reply/fuzz-asker/z{i}"));
        let props = PublishProperties { response_topic: reply, ..PublishProperties::default() };
        c.client.publish_with_properties("laya/v1/dev-fuzz/ask", qos, false, payload, props).await.expect("publish");
    }
    c.ask(
        "laya/v1/dev-fuzz/ask",
        Encoding::Json.encode(&request("after-fuzz")),
        Some("laya/v1/reply/fuzz-asker/after-fuzz"),
        None,
        Encoding::Json,
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut found = false;
    while Instant::now() < deadline {
        let Some(p) = c.next(Duration::from_secs(5)).await else { continue };
        if decode(&p).get("id") == Some(&Value::from("after-fuzz")) {
            found = true;
            break;
        }
    }
    assert!(found, "the agent answers after the fuzz");
    assert!(agent.alive());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_topic_outside_the_allowlist_is_never_published_to() {
    let broker = Broker::start("allow", "");
    let _agent = Agent::start(&broker, "dev-allow", "[engine]\nbackend = \"null\"\n");
    wait_online(broker.port, "dev-allow").await;
    let mut c = Client::connect(broker.port, "allow-asker").await;
    c.subscribe("factory/#").await;
    c.subscribe("laya/v1/reply/allow-asker/#").await;
    c.ask(
        "laya/v1/dev-allow/ask",
        Encoding::Json.encode(&request("evil")),
        Some("factory/valves/open"),
        None,
        Encoding::Json,
    )
    .await;
    c.ask(
        "laya/v1/dev-allow/ask",
        Encoding::Json.encode(&request("good")),
        Some("laya/v1/reply/allow-asker/good"),
        None,
        Encoding::Json,
    )
    .await;
    let p = c.next(Duration::from_secs(30)).await.expect("the allowed reply");
    assert_eq!(String::from_utf8_lossy(&p.topic), "laya/v1/reply/allow-asker/good");
    assert!(c.next(Duration::from_secs(2)).await.is_none(), "nothing on the refused topic");
}

// SIGTERM (questions in flight, STOPPING=1, a clean DISCONNECT and no Last Will) is tested in
// delivery.rs: `sigterm_mid_stream_answers_and_acknowledges_each_question_or_leaves_it_for_the_next_run`.

/// Certificates for a CA, the broker and a client, made with the openssl command line.
fn make_certs(dir: &Path) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=laya-test-ca",
    ]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").expect("ext");
    for name in ["server", "client"] {
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_mutual_tls_connections_serve_questions() {
    let certs = temp_dir("certs");
    make_certs(&certs);
    let p = |f: &str| certs.join(f).display().to_string();
    for mutual in [false, true] {
        let tls_port = free_port();
        let extra = format!(
            "listener {tls_port} 127.0.0.1\ncafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate {}\n",
            p("ca.crt"),
            p("server.crt"),
            p("server.key"),
            mutual
        );
        let broker = Broker::start(if mutual { "mtls" } else { "tls" }, &extra);
        wait_for_port(tls_port);
        let client_auth = if mutual {
            format!("client_cert = \"{}\"\nclient_key = \"{}\"\n", p("client.crt"), p("client.key"))
        } else {
            String::new()
        };
        let device = if mutual { "dev-mtls" } else { "dev-tls" };
        let dir = temp_dir(device);
        let config = dir.join("laya-edge.toml");
        std::fs::write(
            &config,
            format!(
                "[mqtt]\nbroker = \"mqtts://127.0.0.1:{tls_port}\"\ndevice = \"{device}\"\nca_file = \"{}\"\n{client_auth}[engine]\nbackend = \"null\"\n[model]\ndir = \"{}\"\n",
                p("ca.crt"),
                model("bpe-small")
            ),
        )
        .expect("config");
        let mut agent = Agent::with_config(config, Vec::new());
        // The agent's status reaches plain-TCP clients of the same broker.
        wait_online(broker.port, device).await;
        let mut c = Client::connect(broker.port, &format!("{device}-asker")).await;
        c.subscribe(&format!("laya/v1/reply/{device}-asker/#")).await;
        c.ask(
            &format!("laya/v1/{device}/ask"),
            Encoding::Json.encode(&request("t1")),
            Some(&format!("laya/v1/reply/{device}-asker/t1")),
            None,
            Encoding::Json,
        )
        .await;
        let reply = c.next(Duration::from_secs(30)).await.expect("a reply over TLS");
        assert_eq!(decode(&reply).get("id"), Some(&Value::from("t1")));
        agent.kill9();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_gets_ready_after_the_warm_up_and_watchdog_pings_while_healthy() {
    let broker = Broker::start("notify", "");
    let dir = std::env::temp_dir().join(format!("laya-notify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let socket_path = dir.join("notify.sock");
    let _ = std::fs::remove_file(&socket_path);
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).expect("bind");
    socket.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let config = dir.join("laya-edge.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt]\nbroker = \"{}\"\ndevice = \"dev-notify\"\n[model]\ndir = \"{}\"\n[engine]\nbackend = \"null\"\n",
            broker.url(),
            model("bpe-small")
        ),
    )
    .expect("config");
    let env = vec![
        ("NOTIFY_SOCKET".to_owned(), socket_path.display().to_string()),
        ("WATCHDOG_USEC".to_owned(), "400000".to_owned()),
    ];
    let _agent = Agent::with_config(config, env);
    let mut messages = Vec::new();
    let mut buf = [0u8; 512];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        let n = socket.recv(&mut buf).expect("a notification");
        let m = String::from_utf8_lossy(&buf[..n]).into_owned();
        messages.push(m);
        let ready = messages.iter().position(|m| m.starts_with("READY=1"));
        if let Some(r) = ready
            && messages[r..].iter().filter(|m| *m == "WATCHDOG=1").count() >= 3
        {
            break;
        }
    }
    let ready = messages.iter().find(|m| m.starts_with("READY=1")).expect("READY=1 was sent");
    assert!(ready.contains("STATUS=serving as dev-notify"), "{ready}");
    assert!(messages.iter().filter(|m| *m == "WATCHDOG=1").count() >= 3, "{messages:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ask_command_prints_the_reply() {
    let broker = Broker::start("askcli", "");
    let _agent = Agent::start(&broker, "dev-ask", "[engine]\nbackend = \"null\"\n");
    wait_online(broker.port, "dev-ask").await;
    let req = json::to_string(&request("cli-1"), json::Style::COMPACT);
    for cbor in [false, true] {
        let mut cmd = Command::new(test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge")));
        cmd.args(["ask", "--broker", &broker.url(), "--device", "dev-ask", "--timeout-s", "30"]);
        if cbor {
            cmd.arg("--cbor");
        }
        let out = cmd.arg(&req).output().expect("ask runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v = json::parse(&out.stdout, ParseOptions::default()).expect("a JSON reply");
        assert_eq!(v.get("id"), Some(&Value::from("cli-1")));
        assert_eq!(v.get("device"), Some(&Value::from("dev-ask")));
    }
}

/// The response topic and correlation data of the next question on `c`'s subscriptions.
async fn next_question(c: &mut Client, within: Duration) -> (String, Option<Vec<u8>>) {
    let p = c.next(within).await.expect("the question");
    let props = p.properties.expect("MQTT 5 properties");
    (props.response_topic.expect("a response topic"), props.correlation_data.map(|c| c.to_vec()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_reflected_onto_the_ask_commands_response_topic_is_ignored() {
    // Anyone may name another client's response topic: the device answers there with the
    // correlation data of the question it answers. Here a snooper learns the topic (no ACL), and a
    // hostile client's question, refused at once, is answered there before the genuine one
    // (which the backend takes 2 s to compute).
    let broker = Broker::start("reflect", "");
    let _agent = Agent::start(&broker, "dev-reflect", "[engine]\nbackend = \"null\"\nnull_faults = \"sleep=2000\"\n");
    wait_online(broker.port, "dev-reflect").await;
    let mut snooper = Client::connect(broker.port, "reflect-snooper").await;
    snooper.subscribe("laya/v1/dev-reflect/ask").await;
    let req = json::to_string(&request("genuine"), json::Style::COMPACT);
    let ask = std::process::Command::new(test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge")))
        .args(["ask", "--broker", &broker.url(), "--device", "dev-reflect", "--username", "victim"])
        .args(["--timeout-s", "60", &req])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("ask runs");
    let (victim_topic, victim_correlation) = next_question(&mut snooper, Duration::from_secs(30)).await;
    assert!(victim_topic.starts_with("laya/v1/reply/victim/"), "{victim_topic}");
    snooper.subscribe(&victim_topic).await;
    snooper
        .ask(
            "laya/v1/dev-reflect/ask",
            br#"{"id": "forged", "state": "s"}"#.to_vec(),
            Some(&victim_topic),
            Some(b"hostile"),
            Encoding::Json,
        )
        .await;
    // What reached the victim's topic, in order: the reflected reply first (the precondition of
    // this test), then the genuine one.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let p = snooper.next(Duration::from_secs(30)).await.expect("replies on the victim's topic");
        if String::from_utf8_lossy(&p.topic) == victim_topic {
            let correlation = p.properties.as_ref().and_then(|x| x.correlation_data.as_ref()).map(|c| c.to_vec());
            seen.push((decode(&p).get("id").cloned(), correlation));
        }
    }
    assert_eq!(seen[0], (Some(Value::from("forged")), Some(b"hostile".to_vec())), "{seen:?}");
    assert_eq!(seen[1], (Some(Value::from("genuine")), victim_correlation), "{seen:?}");
    let out = ask.wait_with_output().expect("ask exits");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json::parse(&out.stdout, ParseOptions::default()).expect("a JSON reply");
    assert_eq!(v.get("id"), Some(&Value::from("genuine")), "ask printed another question's reply: {v:?}");
    assert!(v.get("answers").is_some(), "{v:?}");
}

/// `laya-edge fleet --once --json` as `user`: the snapshot's row of `device`.
fn fleet_row(broker: &ShippedBroker, user: &str, password: &Path, device: &str) -> Value {
    let url = broker.url();
    let args = ["fleet", "--broker", &url, "--once", "--json", "--window-s", "3", "--username", user];
    let mut args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    args.extend([std::ffi::OsStr::new("--password-file"), password.as_os_str()]);
    let (out, err, ok) = run_cli(&args, &[], "");
    assert!(ok, "fleet as {user}: {err}");
    let v = json::parse_str(out.trim(), ParseOptions::default()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let devices = v.get("devices").and_then(Value::as_array).expect("devices").to_vec();
    devices
        .into_iter()
        .find(|d| d.get("device") == Some(&Value::from(device)))
        .unwrap_or_else(|| panic!("{device} in {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_acl_lets_only_devices_answer_clients_read_their_own_replies_and_operators_the_fleet() {
    let users = [("board-7", "pw-device"), ("app-1", "pw-app-1"), ("app-2", "pw-app-2"), ("operator", "pw-operator")];
    let broker = ShippedBroker::start("shipped-acl", &users);
    let password = |user: &str| broker.password_file(user, users.iter().find(|(u, _)| *u == user).expect("a user").1);
    // The device: its first worker dies on its first question, so it has an event to publish.
    let once = broker.dir.join("once");
    let config = broker.dir.join("laya-edge.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt]\nbroker = \"{}\"\ndevice = \"board-7\"\nusername = \"board-7\"\npassword_file = \"{}\"\ntelemetry_interval_s = 1\n[engine]\nbackend = \"null\"\nnull_faults = \"exit@2,once={}\"\n[model]\ndir = \"{}\"\n",
            broker.url(),
            password("board-7").display(),
            once.display(),
            model("bpe-small")
        ),
    )
    .expect("config");
    let login = |user: &'static str| Some((user, users.iter().find(|(u, _)| *u == user).expect("a user").1));
    let mut operator = Client::connect_as(broker.port, "ops-watch", login("operator")).await;
    for filter in ["laya/v1/+/status", "laya/v1/+/telemetry", "laya/v1/+/events"] {
        operator.subscribe(filter).await;
    }
    let mut app1 = Client::connect_as(broker.port, "app-1-client", login("app-1")).await;
    app1.subscribe("laya/v1/reply/app-1/#").await;
    app1.subscribe("laya/v1/+/telemetry").await;
    // app-2 tries to read everything it should not.
    let mut app2 = Client::connect_as(broker.port, "app-2-client", login("app-2")).await;
    for filter in
        ["laya/v1/reply/#", "laya/v1/reply/app-1/#", "laya/v1/+/telemetry", "laya/v1/+/events", "laya/v1/+/errors"]
    {
        app2.subscribe(filter).await;
    }
    let _agent = Agent::with_config(config, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = operator.next(deadline.saturating_duration_since(Instant::now())).await.expect("board-7 online");
        if String::from_utf8_lossy(&p.topic) == "laya/v1/board-7/status"
            && decode(&p).get("state") == Some(&Value::from("online"))
        {
            break;
        }
    }
    // app-2 asks first (its question kills the first worker: a restart event), then forges a
    // reply for app-1 and the device's own topics: the broker drops every forgery.
    app2.ask(
        "laya/v1/board-7/ask",
        Encoding::Json.encode(&request("a2")),
        Some("laya/v1/reply/app-2/a2"),
        Some(b"c-app-2"),
        Encoding::Json,
    )
    .await;
    let forged = b"forged".to_vec();
    for topic in [
        "laya/v1/reply/app-1/x",
        "laya/v1/board-7/status",
        "laya/v1/board-7/telemetry",
        "laya/v1/board-7/events",
        "laya/v1/board-7/reply/r1",
    ] {
        app2.client.publish(topic, QoS::AtLeastOnce, false, forged.clone()).await.expect("publish");
    }
    app1.ask(
        "laya/v1/board-7/ask",
        Encoding::Json.encode(&request("a1")),
        Some("laya/v1/reply/app-1/x"),
        Some(b"c-app-1"),
        Encoding::Json,
    )
    .await;
    // A question of app-2's naming app-1's response topic: the device answers there (it cannot
    // know who asks), with app-2's correlation data, which app-1 does not take for its own.
    app2.ask(
        "laya/v1/board-7/ask",
        Encoding::Json.encode(&request("a1")),
        Some("laya/v1/reply/app-1/x"),
        Some(b"c-app-2"),
        Encoding::Json,
    )
    .await;
    let mut app1_got = Vec::new();
    let until = Instant::now() + Duration::from_secs(60);
    while app1_got.len() < 2 {
        let p = app1.next(until.saturating_duration_since(Instant::now())).await.expect("app-1's replies");
        assert_ne!(p.payload.as_ref(), forged.as_slice(), "app-1 received a forged reply on {:?}", p.topic);
        assert_eq!(String::from_utf8_lossy(&p.topic), "laya/v1/reply/app-1/x", "app-1 reads only its replies");
        let correlation = p.properties.as_ref().and_then(|x| x.correlation_data.as_ref()).map(|c| c.to_vec());
        app1_got.push((decode(&p).get("id").cloned(), correlation));
    }
    app1_got.sort_by(|a, b| a.1.cmp(&b.1));
    let a1 = Some(Value::from("a1"));
    assert_eq!(app1_got, [(a1.clone(), Some(b"c-app-1".to_vec())), (a1, Some(b"c-app-2".to_vec()))]);
    // The operator saw the device's telemetry and its restart event, and no forgery.
    let (mut telemetry, mut restart) = (false, false);
    let until = Instant::now() + Duration::from_secs(30);
    while !(telemetry && restart) {
        let p = operator
            .next(until.saturating_duration_since(Instant::now()))
            .await
            .unwrap_or_else(|| panic!("telemetry {telemetry}, restart event {restart}"));
        assert_ne!(p.payload.as_ref(), forged.as_slice(), "the operator received a forgery on {:?}", p.topic);
        match String::from_utf8_lossy(&p.topic).as_ref() {
            "laya/v1/board-7/telemetry" => telemetry = true,
            "laya/v1/board-7/events" => restart |= decode(&p).get("event") == Some(&Value::from("worker_restart")),
            _ => {}
        }
    }
    // And so does `laya-edge fleet` as the operator (telemetry: how busy, one restart); as a
    // client it sees only the status.
    let ops = fleet_row(&broker, "operator", &password("operator"), "board-7");
    assert!(ops.get("busy").is_some_and(|b| *b != Value::Null), "{ops:?}");
    assert_eq!(ops.get("restarts").and_then(Value::as_i64), Some(1), "{ops:?}");
    let client = fleet_row(&broker, "app-1", &password("app-1"), "board-7");
    assert_eq!(client.get("state"), Some(&Value::from("online")), "{client:?}");
    assert_eq!(client.get("busy"), Some(&Value::Null), "{client:?}");
    assert_eq!(client.get("restarts").and_then(Value::as_i64), Some(0), "{client:?}");
    // app-2 got its own reply and nothing else: not app-1's, not telemetry, events or errors.
    while let Some(p) = app2.next(Duration::from_secs(2)).await {
        assert_eq!(String::from_utf8_lossy(&p.topic), "laya/v1/reply/app-2/a2", "app-2 read {:?}", decode(&p));
    }
    while let Some(p) = app1.next(Duration::from_millis(200)).await {
        assert_eq!(String::from_utf8_lossy(&p.topic), "laya/v1/reply/app-1/x", "app-1 read {:?}", p.topic);
    }
}

#[test]
fn the_shipped_acl_is_what_its_generator_writes_for_the_fleet_it_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let shipped = std::fs::read_to_string(root.join("config/mosquitto.acl")).expect("the ACL");
    let command = shipped.lines().next().and_then(|l| l.strip_prefix("# Generated by: python3 ")).expect("its command");
    let mut words = command.split_whitespace();
    let script = words.next().expect("the script");
    let out = Command::new("python3").arg(root.join(script)).args(words).output().expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), shipped, "config/mosquitto.acl is stale: regenerate it");
}

#[test]
fn serve_demo_answers_the_example_questions_over_its_own_broker() {
    use std::io::BufRead;
    let mut child = Command::new(test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge")))
        .args(["serve", "--demo"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("demo starts");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut answers = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(line) if line.starts_with('{') => {
                answers.push(json::parse_str(&line, ParseOptions::default()).expect("json"))
            }
            Ok(line) if line.starts_with("demo: answered") => break,
            _ => {}
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    // One answer per example request, in order, with an answer for each of its questions.
    let examples: Vec<Value> =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/demo-requests.jsonl"))
            .expect("demo requests")
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| json::parse_str(l, ParseOptions::default()).expect("a demo request"))
            .collect();
    assert!(examples.len() >= 2, "{examples:?}");
    let ids: Vec<&Value> = answers.iter().filter_map(|a| a.get("id")).collect();
    let want: Vec<&Value> = examples.iter().filter_map(|e| e.get("id")).collect();
    assert_eq!(ids, want);
    for (answer, example) in answers.iter().zip(&examples) {
        let questions = example.get("questions").and_then(Value::as_object).expect("questions");
        for qid in questions.keys() {
            let a = answer.get("answers").and_then(|a| a.get(qid.as_str()));
            assert!(a.is_some_and(|a| a.get("type").is_some() || a.get("error").is_some()), "{qid}: {answer:?}");
        }
    }
}

/// The unit file the Yocto layer installs: `key=value` of its [Service] section.
fn unit_setting(key: &str) -> String {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../yocto-layer/recipes-laya/laya-edge/files/laya-edge.service"),
    )
    .expect("the unit file");
    unit.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_owned))
        .unwrap_or_else(|| panic!("the unit sets no {key}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_units_settings_the_agent_notifies_ready_and_pings_within_watchdog_sec() {
    assert_eq!(unit_setting("Type"), "notify");
    assert_eq!(unit_setting("NotifyAccess"), "main", "notifications come from the main process only");
    let watchdog_sec: u64 = unit_setting("WatchdogSec").parse().expect("seconds");
    let broker = Broker::start("unit", "");
    let dir = std::env::temp_dir().join(format!("laya-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let socket_path = dir.join("notify.sock");
    let _ = std::fs::remove_file(&socket_path);
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).expect("bind");
    socket.set_read_timeout(Some(Duration::from_secs(watchdog_sec))).expect("timeout");
    let config = dir.join("laya-edge.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt]\nbroker = \"{}\"\ndevice = \"dev-unit\"\n[model]\ndir = \"{}\"\n[engine]\nbackend = \"null\"\n",
            broker.url(),
            model("bpe-small")
        ),
    )
    .expect("config");
    // What systemd sets for WatchdogSec= in the service's environment.
    let env = vec![
        ("NOTIFY_SOCKET".to_owned(), socket_path.display().to_string()),
        ("WATCHDOG_USEC".to_owned(), (watchdog_sec * 1_000_000).to_string()),
    ];
    let agent = Agent::with_config(config, env);
    let main_pid = agent.child.as_ref().map(|c| c.id()).expect("pid");
    let mut buf = [0u8; 512];
    let mut ready_at = None;
    let start = Instant::now();
    // READY, then a watchdog ping at least every WatchdogSec (the agent pings at half of it).
    let mut senders = HashSet::new();
    loop {
        let (n, sender) = recv_with_sender(&socket, &mut buf).expect("a notification within WatchdogSec");
        senders.insert(sender);
        let m = String::from_utf8_lossy(&buf[..n]).into_owned();
        if m.starts_with("READY=1") {
            ready_at = Some(Instant::now());
        } else if m == "WATCHDOG=1"
            && let Some(r) = ready_at
        {
            assert!(r.elapsed() <= Duration::from_secs(watchdog_sec), "a ping after READY within WatchdogSec");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(2 * watchdog_sec), "no READY and ping");
    }
    // Notifications come from the main process (NotifyAccess=main): the process we started, as
    // the kernel reports each datagram's sender; its worker has no NOTIFY_SOCKET to send to.
    assert_eq!(senders, HashSet::from([main_pid]), "senders of notifications");
    let workers = children(main_pid);
    assert_eq!(workers.len(), 1, "one worker: {workers:?}");
    let environ = std::fs::read(format!("/proc/{}/environ", workers[0])).expect("the worker's environment");
    let names: Vec<String> = environ
        .split(|&b| b == 0)
        .filter_map(|kv| kv.split(|&b| b == b'=').next())
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    assert!(names.iter().any(|k| k == "WATCHDOG_USEC"), "the environment was read: {names:?}");
    assert!(!names.iter().any(|k| k == "NOTIFY_SOCKET"), "the worker inherited NOTIFY_SOCKET: {names:?}");
}

/// Receives one datagram on a socket with SO_PASSCRED and returns its length and its sender's
/// process id, as the kernel reports it (SCM_CREDENTIALS).
fn recv_with_sender(socket: &std::os::unix::net::UnixDatagram, buf: &mut [u8]) -> std::io::Result<(usize, u32)> {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: SO_PASSCRED reads one c_int from the pointer we pass with its size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut control = [0u64; 16]; // 128 bytes, aligned for cmsghdr
    // SAFETY: msghdr is plain data; all-zero is a valid empty header, filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: msg points at `iov` (over `buf`) and `control`, both alive and of the given sizes.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the CMSG_* walk stays within msg_controllen of `control`, which recvmsg filled in.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_CREDENTIALS {
                let cred: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                return Ok((n as usize, cred.pid as u32));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Err(std::io::Error::other("a datagram without the sender's credentials"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_hung_in_a_call_dies_with_its_agent_when_the_agent_is_killed() {
    let broker = Broker::start("orphan", "");
    // Every call hangs, and no deadline kills the worker before the agent is killed.
    let settings = "[engine]\nbackend = \"null\"\nnull_faults = \"hang\"\ndeadline_ms = 600000\n";
    let mut agent = Agent::start(&broker, "dev-orphan", settings);
    let agent_pid = agent.child.as_ref().map(|c| c.id()).expect("pid");
    wait_online(broker.port, "dev-orphan").await;
    let mut c = Client::connect(broker.port, "orphan-asker").await;
    c.subscribe("laya/v1/dev-orphan/telemetry").await;
    c.ask("laya/v1/dev-orphan/ask", Encoding::Json.encode(&request("hung")), None, None, Encoding::Json).await;
    // The question is in flight (admitted, behind the hanging warm-up call or in the worker).
    telemetry_where(&mut c, "a question in flight", |v| v.get("in_flight").and_then(Value::as_i64) >= Some(1)).await;
    let workers = children(agent_pid);
    assert_eq!(workers.len(), 1, "one worker: {workers:?}");
    agent.kill9();
    let t = Instant::now();
    while !gone(workers[0]) {
        assert!(t.elapsed() < Duration::from_secs(5), "the worker {} outlived its agent by 5 s", workers[0]);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_signal_to_the_whole_unit_lets_the_worker_finish_the_question_it_computes() {
    let broker = Broker::start("unit-stop", "");
    // systemd's default stop (KillMode=control-group) and Ctrl-C signal every process, the worker
    // too. The question in progress must still be answered within the grace, by that worker.
    let settings = "shutdown_grace_s = 10\n[engine]\nbackend = \"null\"\nnull_faults = \"sleep=1500\"\n";
    let mut agent = Agent::start(&broker, "dev-unit", settings);
    let agent_pid = agent.child.as_ref().map(|c| c.id()).expect("pid");
    wait_online(broker.port, "dev-unit").await;
    let mut c = Client::connect(broker.port, "unit-asker").await;
    c.subscribe("laya/v1/reply/unit-asker/#").await;
    let mut watch = Client::connect(broker.port, "unit-watch").await;
    watch.subscribe("laya/v1/dev-unit/telemetry").await;
    watch.subscribe("laya/v1/dev-unit/events").await;
    c.ask(
        "laya/v1/dev-unit/ask",
        Encoding::Json.encode(&request("u1")),
        Some("laya/v1/reply/unit-asker/u1"),
        None,
        Encoding::Json,
    )
    .await;
    telemetry_where(&mut watch, "the question in flight", |v| v.get("in_flight").and_then(Value::as_i64) >= Some(1))
        .await;
    let workers = children(agent_pid);
    assert_eq!(workers.len(), 1, "one worker: {workers:?}");
    for pid in [workers[0], agent_pid] {
        let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
    }
    let reply = decode(&c.next(Duration::from_secs(10)).await.expect("the question in progress is answered"));
    assert!(reply.get("answers").is_some(), "answered, not refused: {reply:?}");
    let status = agent.child.take().expect("running").wait().expect("exit status");
    assert!(status.success(), "{status:?}");
    // The worker was not restarted: no worker_restart event went out.
    while let Some(p) = watch.next(Duration::from_millis(500)).await {
        let v = decode(&p);
        assert_ne!(v.get("event").and_then(Value::as_str), Some("worker_restart"), "the worker died: {v:?}");
    }
    assert!(gone(workers[0]), "the worker {} outlived its agent", workers[0]);
}

/// Watches `{prefix}/{device}/status` on the broker's plain port for `within` and returns the
/// `state` of every status seen (retained or live).
async fn states_seen(port: u16, prefix: &str, device: &str, within: Duration) -> Vec<String> {
    let mut c = Client::connect(port, &format!("states-{device}-{}", free_port())).await;
    c.subscribe(&format!("{prefix}/{device}/status")).await;
    let mut states = Vec::new();
    let deadline = Instant::now() + within;
    while let Some(p) = c.next(deadline.saturating_duration_since(Instant::now())).await {
        states.push(decode(&p).get("state").and_then(Value::as_str).unwrap_or("?").to_owned());
    }
    states
}

/// Waits until `{prefix}/{device}/status` says online (for a prefix of the test's own).
async fn wait_online_under(port: u16, prefix: &str, device: &str) {
    let mut c = Client::connect(port, &format!("online-{device}-{}", free_port())).await;
    c.subscribe(&format!("{prefix}/{device}/status")).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = c.next(deadline.saturating_duration_since(Instant::now())).await;
        let p = p.unwrap_or_else(|| panic!("{device} never came online under {prefix}"));
        if decode(&p).get("state") == Some(&Value::from("online")) {
            return;
        }
    }
}

/// Writes an agent config of its own (no defaults from [`Agent::start`]) and starts the agent.
fn agent_with_mqtt(device: &str, mqtt: &str) -> Agent {
    let dir = temp_dir(device);
    let config = dir.join("laya-edge.toml");
    let text = format!(
        "[mqtt]\ndevice = \"{device}\"\nreconnect_min_ms = 100\nreconnect_max_ms = 500\n{mqtt}[engine]\nbackend = \"null\"\n[model]\ndir = \"{}\"\n",
        model("bpe-small")
    );
    std::fs::write(&config, text).expect("config");
    Agent::with_config(config, Vec::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_refused_with_the_wrong_ca_or_without_the_required_client_certificate_and_never_falls_back_to_plaintext()
{
    let certs = temp_dir("certs-refused");
    make_certs(&certs);
    // A second CA that signed nothing the broker presents.
    let other = certs.join("other");
    std::fs::create_dir_all(&other).expect("dir");
    make_certs(&other);
    let p = |f: &str| certs.join(f).display().to_string();
    let (tls_port, mtls_port) = (free_port(), free_port());
    let extra = format!(
        "listener {tls_port} 127.0.0.1\ncafile {ca}\ncertfile {crt}\nkeyfile {key}\nrequire_certificate false\n\
         listener {mtls_port} 127.0.0.1\ncafile {ca}\ncertfile {crt}\nkeyfile {key}\nrequire_certificate true\n",
        ca = p("ca.crt"),
        crt = p("server.crt"),
        key = p("server.key"),
    );
    let broker = Broker::start("tls-refused", &extra);
    wait_for_port(tls_port);
    wait_for_port(mtls_port);
    let wrong_ca = format!("ca_file = \"{}\"\n", other.join("ca.crt").display());
    let right_ca = format!("ca_file = \"{}\"\n", p("ca.crt"));
    let cases = [
        // The broker's certificate does not chain to the configured CA.
        ("dev-wrong-ca", format!("broker = \"mqtts://127.0.0.1:{tls_port}\"\n{wrong_ca}")),
        // The broker requires a client certificate and the agent has none.
        ("dev-no-client-cert", format!("broker = \"mqtts://127.0.0.1:{mtls_port}\"\n{right_ca}")),
        // mqtts:// pointed at a plaintext listener: a plaintext fallback would connect here.
        ("dev-plain-listener", format!("broker = \"mqtts://127.0.0.1:{}\"\n{right_ca}", broker.port)),
    ];
    let agents: Vec<Agent> = cases.iter().map(|(device, mqtt)| agent_with_mqtt(device, mqtt)).collect();
    for (device, _) in &cases {
        // The agents retry every 100-500 ms; none of them may ever get through.
        let states = states_seen(broker.port, "laya/v1", device, Duration::from_secs(5)).await;
        assert!(states.is_empty(), "{device} reached the broker: {states:?}");
    }
    // The broker saw the refused handshakes (so the agents did try), and a control agent with the
    // right CA and a client certificate connects to the same mutual-TLS listener.
    let log = std::fs::read_to_string(broker.dir().join("mosquitto.log")).expect("broker log");
    assert!(log.contains("OpenSSL Error") || log.contains("protocol error"), "{log}");
    let client_auth = format!("client_cert = \"{}\"\nclient_key = \"{}\"\n", p("client.crt"), p("client.key"));
    let _control = agent_with_mqtt(
        "dev-tls-control",
        &format!("broker = \"mqtts://127.0.0.1:{mtls_port}\"\n{right_ca}{client_auth}"),
    );
    wait_online(broker.port, "dev-tls-control").await;
    drop(agents);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn username_and_password_file_log_in_and_a_wrong_password_is_refused() {
    let dir = temp_dir("passwd");
    let passwd = dir.join("mosquitto.passwd");
    // A password with a space: the agent reads the whole file, only the trailing newline trimmed.
    let password = "s3cret with spaces";
    let out = Command::new("mosquitto_passwd")
        .args(["-c", "-b"])
        .arg(&passwd)
        .args(["edge-agent", password])
        .output()
        .expect("mosquitto_passwd runs (apt-get install mosquitto)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let auth_port = free_port();
    // Per listener: the plain one stays anonymous for the test clients, the other needs a login.
    let extra = format!("listener {auth_port} 127.0.0.1\nallow_anonymous false\npassword_file {}\n", passwd.display());
    let broker = Broker::start_with_head("passwd", "per_listener_settings true", &extra);
    wait_for_port(auth_port);
    let right = dir.join("right.txt");
    std::fs::write(&right, format!("{password}\n")).expect("password file");
    let wrong = dir.join("wrong.txt");
    std::fs::write(&wrong, "s3cret\n").expect("password file");
    let login = |file: &Path| {
        format!(
            "broker = \"mqtt://127.0.0.1:{auth_port}\"\nusername = \"edge-agent\"\npassword_file = \"{}\"\n",
            file.display()
        )
    };
    let _refused = agent_with_mqtt("dev-wrong-password", &login(&wrong));
    let _anonymous = agent_with_mqtt("dev-anonymous", &format!("broker = \"mqtt://127.0.0.1:{auth_port}\"\n"));
    let _agent = agent_with_mqtt("dev-password", &login(&right));
    wait_online(broker.port, "dev-password").await;
    for device in ["dev-wrong-password", "dev-anonymous"] {
        let states = states_seen(broker.port, "laya/v1", device, Duration::from_secs(3)).await;
        assert!(states.is_empty(), "{device} logged in: {states:?}");
    }
    // And the logged-in agent answers.
    let mut c = Client::connect(broker.port, "passwd-asker").await;
    c.subscribe("laya/v1/reply/passwd-asker/#").await;
    let body = Encoding::Json.encode(&request("pw1"));
    c.ask("laya/v1/dev-password/ask", body, Some("laya/v1/reply/passwd-asker/pw1"), None, Encoding::Json).await;
    let reply = c.next(Duration::from_secs(30)).await.expect("a reply");
    assert_eq!(decode(&reply).get("id"), Some(&Value::from("pw1")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_prefix_and_response_topics_move_the_whole_topic_tree() {
    let broker = Broker::start("prefix", "");
    let mqtt = format!(
        "broker = \"{}\"\nprefix = \"acme/edge\"\nresponse_topics = [\"{{prefix}}/reply/+/inbox\"]\ntelemetry_interval_s = 1\n",
        broker.url()
    );
    let _agent = agent_with_mqtt("dev-prefix", &mqtt);
    let mut everything = Client::connect(broker.port, "prefix-everything").await;
    everything.subscribe("laya/#").await;
    wait_online_under(broker.port, "acme/edge", "dev-prefix").await;
    let mut c = Client::connect(broker.port, "prefix-asker").await;
    c.subscribe("acme/edge/#").await;
    // A response topic outside the configured filter (the default filter's shape) gets nothing.
    let default_shape = "acme/edge/reply/prefix-asker/p0";
    c.ask("acme/edge/dev-prefix/ask", Encoding::Json.encode(&request("p0")), Some(default_shape), None, Encoding::Json)
        .await;
    let inbox = "acme/edge/reply/c1/inbox";
    c.ask("acme/edge/dev-prefix/ask", Encoding::Json.encode(&request("p1")), Some(inbox), None, Encoding::Json).await;
    // Under the old prefix the agent neither listens nor speaks.
    c.ask("laya/v1/dev-prefix/ask", Encoding::Json.encode(&request("p2")), Some(inbox), None, Encoding::Json).await;
    let (mut replies, mut refused, mut telemetry, mut status) = (Vec::new(), Vec::new(), 0, 0);
    // Telemetry arrives every second: listen for a bounded time, not until silence.
    let until = Instant::now() + Duration::from_secs(8);
    while let Some(p) = c.next(until.saturating_duration_since(Instant::now())).await {
        match String::from_utf8_lossy(&p.topic).as_ref() {
            "acme/edge/dev-prefix/ask" => {}
            "acme/edge/dev-prefix/telemetry" => telemetry += 1,
            "acme/edge/dev-prefix/status" => status += 1,
            "acme/edge/dev-prefix/errors" => {
                refused.push(decode(&p).get("response_topic").and_then(Value::as_str).unwrap_or("?").to_owned())
            }
            topic => {
                replies.push((topic.to_owned(), decode(&p).get("id").and_then(Value::as_str).unwrap_or("?").to_owned()))
            }
        }
    }
    assert_eq!(replies, [(inbox.to_owned(), "p1".to_owned())], "one reply, on the allowed response topic");
    assert_eq!(refused, [default_shape], "the refused response topic is reported on the errors topic under acme/edge");
    assert!(telemetry >= 1 && status >= 1, "status and telemetry under acme/edge: {telemetry} {status}");
    let mut stray = Vec::new();
    while let Some(p) = everything.next(Duration::from_millis(100)).await {
        stray.push(String::from_utf8_lossy(&p.topic).into_owned());
    }
    // Only the test's own question under laya/v1, nothing from the agent.
    assert_eq!(stray, ["laya/v1/dev-prefix/ask"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_identical_redelivery_gets_the_remembered_reply_and_counts_as_resent() {
    let broker = Broker::start("resend", "");
    let _agent = Agent::start(&broker, "dev-resend", "[engine]\nbackend = \"null\"\n");
    wait_online(broker.port, "dev-resend").await;
    let mut watch = Client::connect(broker.port, "resend-watch").await;
    watch.subscribe("laya/v1/dev-resend/telemetry").await;
    let mut c = Client::connect(broker.port, "resend-asker").await;
    c.subscribe("laya/v1/reply/resend-asker/#").await;
    let body = Encoding::Json.encode(&request("same"));
    let reply_to = "laya/v1/reply/resend-asker/same";
    let mut replies = Vec::new();
    for _ in 0..2 {
        // The same bytes, id and response topic: what a broker's redelivery looks like.
        c.ask("laya/v1/dev-resend/ask", body.clone(), Some(reply_to), Some(b"c-1"), Encoding::Json).await;
        let p = c.next(Duration::from_secs(30)).await.expect("a reply");
        assert_eq!(p.properties.as_ref().and_then(|x| x.correlation_data.as_deref()), Some(&b"c-1"[..]));
        replies.push(p.payload.to_vec());
    }
    assert_eq!(replies[0], replies[1], "the remembered reply, byte for byte (timings included)");
    let t = telemetry_where(&mut watch, "the resend counted", |v| counter(v, &["resent"]) == 1).await;
    assert_eq!(counter(&t, &["answered"]), 1, "answered once, resent once: {t:?}");
}

/// An agent (null backend) with `NOTIFY_SOCKET` pointing at a datagram socket of the test's,
/// `WATCHDOG_USEC` = 400 ms and `env` besides; returns it with the socket (reads time out after
/// 1 s) once `READY=1` arrived.
fn notifying_agent(broker: &Broker, device: &str, env: &[(&str, String)]) -> (Agent, std::os::unix::net::UnixDatagram) {
    let dir = temp_dir(device);
    let socket_path = dir.join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).expect("bind");
    socket.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let config = dir.join("laya-edge.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt]\nbroker = \"{}\"\ndevice = \"{device}\"\n[model]\ndir = \"{}\"\n[engine]\nbackend = \"null\"\n",
            broker.url(),
            model("bpe-small")
        ),
    )
    .expect("config");
    let mut vars = vec![
        ("NOTIFY_SOCKET".to_owned(), socket_path.display().to_string()),
        ("WATCHDOG_USEC".to_owned(), "400000".to_owned()),
    ];
    vars.extend(env.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    let agent = Agent::with_config(config, vars);
    let mut buf = [0u8; 512];
    loop {
        let n = socket.recv(&mut buf).expect("READY=1 within 30 s");
        if buf[..n].starts_with(b"READY=1") {
            break;
        }
    }
    socket.set_read_timeout(Some(Duration::from_secs(1))).expect("timeout");
    (agent, socket)
}

/// The notifications that arrive on `socket` within `within`.
fn notifications(socket: &std::os::unix::net::UnixDatagram, within: Duration) -> Vec<String> {
    let (mut out, mut buf, deadline) = (Vec::new(), [0u8; 512], Instant::now() + within);
    while Instant::now() < deadline {
        if let Ok(n) = socket.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_watchdog_ping_is_sent_when_watchdog_pid_names_another_process() {
    let broker = Broker::start("wdpid", "");
    // systemd sets WATCHDOG_PID to the main pid; here it names this test process instead.
    let (_agent, socket) = notifying_agent(&broker, "dev-wdpid", &[("WATCHDOG_PID", std::process::id().to_string())]);
    let seen = notifications(&socket, Duration::from_secs(2));
    // At 400 ms the agent would ping every 200 ms: ten chances.
    assert!(!seen.iter().any(|m| m == "WATCHDOG=1"), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_pings_stop_while_the_agent_is_stopped_and_resume_after() {
    let broker = Broker::start("wdstop", "");
    let (agent, socket) = notifying_agent(&broker, "dev-wdstop", &[]);
    let pings = |m: &[String]| m.iter().filter(|m| *m == "WATCHDOG=1").count();
    assert!(pings(&notifications(&socket, Duration::from_secs(1))) >= 2, "pings every 200 ms while healthy");
    let pid = agent.child.as_ref().expect("running").id().to_string();
    let signal = |s: &str| assert!(Command::new("kill").args([s, &pid]).status().expect("kill").success());
    signal("-STOP");
    // What was sent before the stop took effect is drained first.
    let _ = notifications(&socket, Duration::from_millis(300));
    let stopped = notifications(&socket, Duration::from_secs(2));
    signal("-CONT");
    assert_eq!(pings(&stopped), 0, "a stopped agent sent {stopped:?}");
    // systemd would have killed it after WatchdogSec; resumed, it pings again at once.
    assert!(pings(&notifications(&socket, Duration::from_secs(2))) >= 2, "the pings resume");
}

/// Issue #31, defect 7: a cloned SD card, two agents with one client id. Each connection takes
/// the other's session (DISCONNECT 0x8E); the agent names it (an event, the status's
/// `takeovers`) and waits at least 5 s, doubling, before it connects again, so the pair costs
/// the broker at most one takeover every few seconds (without the backoff the clones took over
/// 3.4 times a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_with_one_client_id_name_the_takeover_and_back_off_to_one_every_few_seconds() {
    let broker = Broker::start("clones", "");
    let mut c = Persistent::connect(broker.port, "clone-watcher").await;
    c.subscribe("laya/v1/dev-clone/events").await;
    c.subscribe("laya/v1/dev-clone/status").await;
    let _a = Agent::start(&broker, "dev-clone", "[engine]\nbackend = \"null\"\n");
    wait_online(broker.port, "dev-clone").await;
    let _b = Agent::start(&broker, "dev-clone", "[engine]\nbackend = \"null\"\n");
    let watch = Duration::from_secs(20);
    let until = Instant::now() + watch;
    let (mut takeovers, mut named, mut most_in_status) = (0, false, 0);
    while let Some(p) = c.next(until.saturating_duration_since(Instant::now())).await {
        let v = decode(&p);
        let topic = String::from_utf8_lossy(&p.topic).into_owned();
        if topic.ends_with("/events") && v.get("event").and_then(Value::as_str) == Some("session_taken_over") {
            takeovers += 1;
            named |= v.get("message").and_then(Value::as_str).is_some_and(|m| m.contains("laya-edge-dev-clone"));
        }
        if topic.ends_with("/status") {
            most_in_status = most_in_status.max(v.get("takeovers").and_then(Value::as_i64).unwrap_or(0));
        }
    }
    assert!(takeovers >= 1, "a takeover is published as a session_taken_over event");
    assert!(named, "the event names the shared client id");
    assert!(most_in_status >= 1, "the status counts the takeovers");
    assert!(takeovers <= 8, "{takeovers} takeovers in {watch:?}: the clones do not back off");
}

/// What `c` receives until `done` holds for one message (decoded, with its topic), or `within`
/// passes: the messages, the last one the match (if any).
async fn collect_until(c: &mut Client, within: Duration, done: impl Fn(&str, &Value) -> bool) -> (Vec<(String, Value)>, bool) {
    let until = Instant::now() + within;
    let mut seen = Vec::new();
    while let Some(p) = c.next(until.saturating_duration_since(Instant::now())).await {
        let topic = String::from_utf8_lossy(&p.topic).into_owned();
        let v = decode(&p);
        let hit = done(&topic, &v);
        seen.push((topic, v));
        if hit {
            return (seen, true);
        }
    }
    (seen, false)
}

fn is_event(topic: &str, v: &Value, kinds: &[&str]) -> bool {
    topic.ends_with("/events") && v.get("event").and_then(Value::as_str).is_some_and(|e| kinds.contains(&e))
}

/// Issue #31, defect 6: SIGHUP (`systemctl reload`, an OTA tool that installed a new model)
/// re-reads the configuration and the model, starts the new engine beside the serving one and
/// lets it take over only once its health call passed; a new engine that fails it, a change only
/// a restart applies, and a model that cannot be loaded are each rejected with a
/// `reload_rejected` event while the serving engine answers on. Every question asked around the
/// reloads is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_a_new_model_beside_the_serving_one_and_bad_reloads_are_rejected_while_questions_go_on() {
    let broker = Broker::start("reload", "");
    let engine = "[engine]\nbackend = \"null\"\n";
    let agent = Agent::start(&broker, "dev-reload", engine);
    let text = std::fs::read_to_string(&agent.config).expect("config");
    let pid = agent.child.as_ref().expect("running").id().to_string();
    let hup = || assert!(Command::new("kill").args(["-HUP", &pid]).status().expect("kill").success());
    let mut c = Client::connect(broker.port, "reload-asker").await;
    c.subscribe("laya/v1/reply/reload-asker/#").await;
    c.subscribe("laya/v1/dev-reload/events").await;
    wait_online(broker.port, "dev-reload").await;
    let mut asked = 0;
    let mut answered = HashSet::new();
    let note = |seen: &[(String, Value)], answered: &mut HashSet<String>| {
        for (t, v) in seen {
            if t.contains("/reply/") && v.get("answers").is_some() {
                answered.insert(v.get("id").and_then(Value::as_str).unwrap_or_default().to_owned());
            }
        }
    };

    // 1. A new engine whose every call fails: its health call fails, the reload is rejected.
    std::fs::write(&agent.config, text.replace(engine, "[engine]\nbackend = \"null\"\nnull_faults = \"error=fatal\"\n"))
        .expect("config");
    hup();
    for _ in 0..5 {
        ask(&c, format!("q{asked}")).await;
        asked += 1;
    }
    let (seen, hit) = collect_until(&mut c, Duration::from_secs(90), |t, v| is_event(t, v, &["reloaded", "reload_rejected"])).await;
    note(&seen, &mut answered);
    let last = &seen.last().expect("a message").1;
    assert!(hit, "a verdict on the reload");
    assert_eq!(last.get("event").and_then(Value::as_str), Some("reload_rejected"), "{last:?}");
    assert!(text_of(last, "message").contains("health call"), "{last:?}");

    // 2. Another model: started beside the serving one, then serving; questions asked meanwhile
    // are answered.
    std::fs::write(&agent.config, text.replace("models/bpe-small", "models/wp-t4")).expect("config");
    hup();
    for _ in 0..10 {
        ask(&c, format!("q{asked}")).await;
        asked += 1;
    }
    let (seen, hit) = collect_until(&mut c, Duration::from_secs(90), |t, v| is_event(t, v, &["reloaded", "reload_rejected"])).await;
    note(&seen, &mut answered);
    let last = &seen.last().expect("a message").1;
    assert!(hit, "a verdict on the reload");
    assert_eq!(last.get("event").and_then(Value::as_str), Some("reloaded"), "{last:?}");
    assert!(text_of(last, "message").contains("wp-t4"), "{last:?}");

    // 3. A change only a restart applies, and 4. a model that cannot be loaded: rejected.
    for (changed, says) in [
        (text.replace("models/bpe-small", "models/wp-t4").replace("telemetry_interval_s = 1", "telemetry_interval_s = 7"), "[mqtt]"),
        (text.replace("models/bpe-small", "models/no-such-model"), "no-such-model"),
    ] {
        std::fs::write(&agent.config, changed).expect("config");
        hup();
        ask(&c, format!("q{asked}")).await;
        asked += 1;
        let (seen, hit) = collect_until(&mut c, Duration::from_secs(60), |t, v| is_event(t, v, &["reloaded", "reload_rejected"])).await;
        note(&seen, &mut answered);
        let last = &seen.last().expect("a message").1;
        assert!(hit, "a verdict on the reload");
        assert_eq!(last.get("event").and_then(Value::as_str), Some("reload_rejected"), "{last:?}");
        assert!(text_of(last, "message").contains(says), "{last:?}");
    }

    // Every question answered (the stragglers too), by the model now serving.
    let (seen, _) = collect_until(&mut c, Duration::from_secs(30), |_, _| false).await;
    note(&seen, &mut answered);
    assert_eq!(answered.len(), asked, "every question asked around the reloads answered");
    let mut s = Client::connect(broker.port, "reload-status").await;
    s.subscribe("laya/v1/dev-reload/status").await;
    let status = decode(&s.next(Duration::from_secs(10)).await.expect("the retained status"));
    assert_eq!(text_of(&status, "model_name"), "wp-t4");
    assert_eq!(text_of(&status, "state"), "online", "SIGHUP never stopped the agent");
}

async fn ask(c: &Client, id: String) {
    let body = json::to_string(&request(&id), json::Style::COMPACT).into_bytes();
    let to = format!("laya/v1/reply/reload-asker/{id}");
    c.ask("laya/v1/dev-reload/ask", body, Some(&to), Some(id.as_bytes()), Encoding::Json).await
}

fn text_of(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or_default().to_owned()
}
