//! Requests that ask more than the model can do, through the agent's front ends: the max_len
//! bomb (`{"state": <200 KB of words>, "max_len": 1000000, ...}`) through `predict` and through
//! `serve` over mosquitto, answered at the model's own budget with a small peak RSS, and
//! `[limits] max_request_tokens` refusing a request beyond it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;
use laya_topics::Value;
use laya_topics::json::{self, ParseOptions, Style};
use laya_topics::wire::Encoding;

/// The peak RSS the issue allows the process answering a bomb (fixture model).
const PEAK_RSS_LIMIT_KIB: u64 = 300 * 1024;

/// About 200 KB of words: tens of thousands of tokens.
fn big_state() -> String {
    let words: Vec<String> = (0..44_000).map(|i| format!("w{}", i % 977)).collect();
    let s = words.join(" ");
    assert!(s.len() > 200_000 && s.len() < 240_000, "{}", s.len());
    s
}

/// A request over the big state; `max_len` as given (none: the model's).
fn bomb(id: &str, max_len: Option<i64>) -> Value {
    let mut text = format!(
        r#"{{"id": "{id}", "state": {}, "questions": {{"team": {{"type": "choice", "instructions": "Which team?", "criteria": ["billing", "technical", "sales"]}}}}"#,
        json::to_string(&Value::Str(big_state()), Style::COMPACT)
    );
    if let Some(m) = max_len {
        text.push_str(&format!(r#", "max_len": {m}"#));
    }
    text.push('}');
    json::parse_str(&text, ParseOptions::default()).expect("json")
}

/// `VmHWM` (peak resident set) of a live process, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the process is alive");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

fn answers_of(v: &Value) -> String {
    text(v.get("answers").unwrap_or_else(|| panic!("no answers: {}", text(v))))
}

#[test]
fn a_max_len_bomb_through_predict_is_answered_at_the_models_budget_with_a_small_peak_rss() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_laya-edge"))
        .args(["predict", "--model", &model("bpe-t5"), "--threads", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("predict starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut answer = |request: &Value| {
        writeln!(stdin, "{}", text(request)).expect("write");
        stdin.flush().expect("flush");
        let mut line = String::new();
        stdout.read_line(&mut line).expect("an answer line");
        json::parse_str(&line, ParseOptions::default()).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    let got = answer(&bomb("bomb", Some(1_000_000)));
    let peak = peak_rss_kib(child.id());
    let want = answer(&bomb("plain", None));
    drop(stdin);
    assert!(child.wait().expect("exit").success());
    assert_eq!(got.get("usage").and_then(|u| u.get("input_tokens")), Some(&Value::int(512)), "{}", text(&got));
    assert_eq!(answers_of(&got), answers_of(&want), "the bomb is answered as at the model's own max_len");
    assert!(peak < PEAK_RSS_LIMIT_KIB, "predict peaked at {} MiB", peak / 1024);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_max_len_bomb_over_mqtt_is_answered_at_the_models_budget_with_a_small_worker_peak_rss() {
    let broker = Broker::start("bomb", "");
    let agent = Agent::start(&broker, "bomb1", &format!("[model]\ndir = \"{}\"\n", model("bpe-t5")));
    wait_online(broker.port, "bomb1").await;
    let mut c = Client::connect(broker.port, "bomber").await;
    c.subscribe("laya/v1/reply/bomber/#").await;
    let mut ask = async |request: Value| {
        let body = Encoding::Json.encode(&request);
        c.ask("laya/v1/bomb1/ask", body, Some("laya/v1/reply/bomber/x"), None, Encoding::Json).await;
        decode(&c.next(Duration::from_secs(60)).await.expect("a reply within 60 s"))
    };
    let got = ask(bomb("bomb", Some(1_000_000))).await;
    assert_eq!(got.get("id"), Some(&Value::from("bomb")), "{}", text(&got));
    let pid = agent.child.as_ref().expect("running").id();
    let workers = children(pid);
    assert!(!workers.is_empty(), "the agent has a worker");
    let peak = workers.iter().map(|&w| peak_rss_kib(w)).max().unwrap_or(0);
    let want = ask(bomb("plain", None)).await;
    assert_eq!(got.get("usage").and_then(|u| u.get("input_tokens")), Some(&Value::int(512)), "{}", text(&got));
    assert_eq!(answers_of(&got), answers_of(&want), "the bomb is answered as at the model's own max_len");
    assert!(peak < PEAK_RSS_LIMIT_KIB, "the worker peaked at {} MiB", peak / 1024);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_beyond_max_request_tokens_is_refused_too_large_and_a_smaller_one_answered() {
    let broker = Broker::start("tokens", "");
    let model = model("bpe-t5");
    let _agent =
        Agent::start(&broker, "tok1", &format!("[limits]\nmax_request_tokens = 1000\n[model]\ndir = \"{model}\"\n"));
    wait_online(broker.port, "tok1").await;
    let mut c = Client::connect(broker.port, "tok-asker").await;
    c.subscribe("laya/v1/reply/tok-asker/#").await;
    let state = json::to_string(&Value::Str("The app crashes when I log in. ".repeat(200)), Style::COMPACT);
    let question = r#"{"type": "noul", "instructions": "Is this a bug report?"}"#;
    // Two rows of 512 tokens: 1024 > 1000. One row: answered.
    for (id, questions, refused) in [
        ("two", format!(r#"{{"a": {question}, "b": {question}}}"#), true),
        ("one", format!(r#"{{"a": {question}}}"#), false),
    ] {
        let request = format!(r#"{{"id": "{id}", "state": {state}, "questions": {questions}}}"#);
        let request = json::parse_str(&request, ParseOptions::default()).expect("json");
        let topic = format!("laya/v1/reply/tok-asker/{id}");
        c.ask("laya/v1/tok1/ask", Encoding::Json.encode(&request), Some(&topic), None, Encoding::Json).await;
        let reply = decode(&c.next(Duration::from_secs(60)).await.expect("a reply"));
        assert_eq!(reply.get("id"), Some(&Value::from(id)));
        let code = reply.get("error").and_then(|e| e.get("code"));
        if refused {
            assert_eq!(code, Some(&Value::from("too_large")), "{}", text(&reply));
            let message = reply.get("error").and_then(|e| e.get("message")).and_then(Value::as_str).unwrap_or("");
            assert!(message.contains("1024") && message.contains("max_request_tokens"), "{message}");
        } else {
            assert_eq!(code, None, "{}", text(&reply));
            assert_eq!(reply.get("usage").and_then(|u| u.get("input_tokens")), Some(&Value::int(512)));
        }
    }
}

#[test]
fn predict_takes_max_request_tokens_from_its_config() {
    let dir = temp_dir("predict-tokens");
    let config = dir.join("laya-edge.toml");
    std::fs::write(&config, format!("[limits]\nmax_request_tokens = 1000\n[model]\ndir = \"{}\"\n", model("bpe-t5")))
        .expect("config");
    let state = json::to_string(&Value::Str("The app crashes when I log in. ".repeat(200)), Style::COMPACT);
    let question = r#"{"type": "noul", "instructions": "Is this a bug report?"}"#;
    // Two rows of 512 tokens: 1024 > 1000; one row: answered.
    let input = format!(
        "{{\"id\": \"two\", \"state\": {state}, \"questions\": {{\"a\": {question}, \"b\": {question}}}}}\n{{\"id\": \"one\", \"state\": {state}, \"questions\": {{\"a\": {question}}}}}\n"
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_laya-edge"))
        .arg("predict")
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("predict starts");
    child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write");
    let out = child.wait_with_output().expect("predict runs");
    assert!(out.status.success());
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| json::parse_str(l, ParseOptions::default()).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 2);
    let code = |v: &Value| v.get("error").and_then(|e| e.get("code")).and_then(Value::as_str).map(str::to_owned);
    assert_eq!(code(&lines[0]).as_deref(), Some("too_large"), "{}", text(&lines[0]));
    assert_eq!(code(&lines[1]), None, "{}", text(&lines[1]));
    assert_eq!(lines[1].get("usage").and_then(|u| u.get("input_tokens")), Some(&Value::int(512)));
}
