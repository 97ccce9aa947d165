//! Questions and replies through `laya-edge serve` on a real mosquitto: MQTT 5 with correlation
//! data in JSON and CBOR (answers equal to the in-process CPU pipeline's), an MQTT 3.1.1 client,
//! the telemetry counters of a round trip, the `ask` command, and `serve --demo` on its own broker.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;
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
        let inline = laya_edge::service::INLINE_TOKENIZE_BYTES;
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
        let mut cpu =
            laya_edge::backend::cpu::CpuBackend::load(Path::new(&model("bpe-small")), &bundle.config).expect("cpu");
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

#[test]
fn serve_demo_gives_predicts_answers_to_the_example_questions_over_its_own_broker_and_the_readmes() {
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
    // The answers and usage of `predict` on the demo checkpoint (the CPU backend, itself held to
    // laya's own answers on this model by the conformance tests' demo_model module).
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo");
    let requests = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/demo-requests.jsonl"))
        .expect("demo requests");
    let predicted = run_predict(&demo, "cpu", &requests, &[]);
    assert_eq!(predicted.len(), answers.len());
    for (answer, predicted) in answers.iter().zip(&predicted) {
        for k in ["id", "answers", "usage"] {
            let (got, want) = (answer.get(k).map(text), predicted.get(k).map(text));
            assert!(got.is_some() && got == want, "{k}: the demo's {got:?}, predict's {want:?}");
        }
    }
    // And what the README shows of demo-1's reply is what the demo prints.
    let shown = readme_demo_reply();
    assert_eq!(shown.get("id"), Some(&Value::from("demo-1")));
    assert_contains(&answers[0], &shown, "demo-1");
}

/// The reply the README shows for `demo-1` (its `json` block after "example (`demo-1`"),
/// with its elisions (`, ...`) taken out: what it shows, without what it leaves out.
fn readme_demo_reply() -> Value {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).expect("README");
    let from = readme.find("example (`demo-1`").expect("the README's demo example");
    let block = readme[from..].split("```json\n").nth(1).and_then(|b| b.split("```").next()).expect("its json block");
    json::parse_str(&block.replace(", ...", ""), ParseOptions::default())
        .unwrap_or_else(|e| panic!("the README's demo reply is not JSON without its elisions: {e}: {block}"))
}

/// Every member `shown` has is in `got` with the same value (objects recursively).
fn assert_contains(got: &Value, shown: &Value, at: &str) {
    match (got, shown) {
        (Value::Object(g), Value::Object(s)) => {
            for (k, v) in s {
                let here = format!("{at}.{k}");
                assert_contains(g.get(k).unwrap_or_else(|| panic!("{here}: not in {}", text(got))), v, &here);
            }
        }
        _ => assert_eq!(text(got), text(shown), "{at}: the demo prints it, the README shows it"),
    }
}
