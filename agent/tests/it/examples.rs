//! The client examples (`examples/python/ask.py`, `examples/node/ask.mjs`) against `serve` on a
//! real mosquitto, in JSON and CBOR: each must print the reply to its own question, with the
//! answers the CPU backend gives in process. Their pinned packages come from tools/examples.sh
//! (tools/test.sh runs it). The tests are `#[ignore]`d with the reason: a plain `cargo test` lists
//! them as ignored, `--include-ignored` (tools/test.sh) runs them, and a test that runs without
//! the packages fails, never skips.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;
use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};
use laya_topics::wire::Encoding;
use test_kit::workspace;

/// The examples' interpreters; panics naming what is missing (a test that runs never skips).
fn interpreters() -> (PathBuf, PathBuf) {
    examples_interpreters().unwrap_or_else(|missing| panic!("{missing}: an examples test that runs never skips"))
}

/// The examples' interpreters, or why not.
fn examples_interpreters() -> Result<(PathBuf, PathBuf), String> {
    let python = std::env::var_os("LAYA_EXAMPLES_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/examples/venv/bin/python"));
    if !python.is_file() {
        return Err(format!("no examples venv at {} (run tools/examples.sh)", python.display()));
    }
    if !workspace().join("examples/node/node_modules/mqtt").is_dir() {
        return Err("no examples/node/node_modules (run tools/examples.sh)".into());
    }
    let node = PathBuf::from("node");
    match Command::new(&node).arg("--version").output() {
        Ok(o) if o.status.success() => Ok((python, node)),
        _ => Err("no node on PATH".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the examples' pinned packages (tools/examples.sh) and node: --include-ignored runs it, as tools/test.sh does"]
async fn the_python_and_node_examples_get_the_cpu_backends_answers_in_json_and_cbor() {
    let (python, node) = interpreters();
    let broker = Broker::start("examples", "");
    let _agent = Agent::start(&broker, "dev-examples", "");
    wait_online(broker.port, "dev-examples").await;
    let model_dir = model("bpe-small");
    let bundle = laya_edge::bundle::HostBundle::load(Path::new(&model_dir)).expect("bundle");
    let mut cpu = laya_edge::backend::cpu::CpuBackend::load(Path::new(&model_dir), &bundle.config).expect("cpu");
    let examples = workspace().join("examples");
    let runs: [(&str, &Path, PathBuf); 2] =
        [("python", &python, examples.join("python/ask.py")), ("node", &node, examples.join("node/ask.mjs"))];
    for (lang, interpreter, script) in &runs {
        for cbor in [false, true] {
            let id = format!("{lang}-{}", if cbor { "cbor" } else { "json" });
            let req = request(&id);
            let mut cmd = Command::new(interpreter);
            cmd.arg(script).args(["--broker", &broker.url(), "--device", "dev-examples", "--timeout", "60"]);
            if cbor {
                cmd.arg("--cbor");
            }
            let out = cmd.arg(text(&req)).output().expect("the example runs");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{id}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
            let reply = json::parse_str(stdout.trim(), ParseOptions::default()).unwrap_or_else(|e| panic!("{id}: {e}"));
            assert_eq!(reply.get("id"), Some(&Value::from(id.as_str())), "{reply:?}");
            assert_eq!(reply.get("device"), Some(&Value::from("dev-examples")));
            let want = laya_edge::pipeline::answer(
                &bundle,
                &mut cpu,
                &laya_topics::Request::from_value(req.clone()).expect("request"),
            )
            .expect("answer")
            .to_value();
            let (got, want) = (reply.get("answers").expect("answers"), want.get("answers").expect("answers"));
            // Python prints floats as the agent does; JavaScript writes 1.0 as 1: equal as numbers.
            assert!(got.py_eq(want), "{id}: {} != {}", text(got), text(want));
            if *lang == "python" {
                assert_eq!(text(got), text(want), "{id}");
            }
        }
    }
}

/// Runs `example` (an example's command line, `--broker` and `--device` still to come) as client
/// `victim` on a device whose backend takes 2 s a call, while a snooper that learned its response
/// topic has a question of its own answered there first, and returns what the example printed.
async fn run_with_a_reflected_reply(broker: &Broker, device: &str, mut example: Command, victim: &str) -> Value {
    let mut snooper = Client::connect(broker.port, &format!("{victim}-snooper")).await;
    snooper.subscribe(&format!("laya/v1/{device}/ask")).await;
    example.args(["--broker", &broker.url(), "--device", device, "--timeout", "60", "--username", victim]);
    let child = example
        .arg(text(&request("genuine")))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the example runs");
    let p = snooper.next(std::time::Duration::from_secs(30)).await.expect("the example's question");
    let props = p.properties.expect("MQTT 5 properties");
    let victim_topic = props.response_topic.expect("a response topic");
    assert!(victim_topic.starts_with(&format!("laya/v1/reply/{victim}/")), "{victim_topic}");
    snooper.subscribe(&victim_topic).await;
    let forged = br#"{"id": "forged", "state": "s"}"#.to_vec();
    snooper.ask(&format!("laya/v1/{device}/ask"), forged, Some(&victim_topic), Some(b"hostile"), Encoding::Json).await;
    // The reflected reply reached the example's topic before its own (this test's precondition).
    let mut ids = Vec::new();
    while ids.len() < 2 {
        let p = snooper.next(std::time::Duration::from_secs(30)).await.expect("replies on the example's topic");
        if String::from_utf8_lossy(&p.topic) == victim_topic {
            ids.push(decode(&p).get("id").cloned());
        }
    }
    assert_eq!(ids, [Some(Value::from("forged")), Some(Value::from("genuine"))]);
    let out = child.wait_with_output().expect("the example exits");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{victim}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    json::parse_str(stdout.trim(), ParseOptions::default()).unwrap_or_else(|e| panic!("{victim}: {e}: {stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the examples' pinned packages (tools/examples.sh) and node: --include-ignored runs it, as tools/test.sh does"]
async fn the_python_and_node_examples_ignore_a_reply_reflected_onto_their_response_topic() {
    let (python, node) = interpreters();
    let broker = Broker::start("examples-reflect", "");
    let _agent =
        Agent::start(&broker, "dev-ex-reflect", "[engine]\nbackend = \"null\"\nnull_faults = \"sleep=2000\"\n");
    wait_online(broker.port, "dev-ex-reflect").await;
    let examples = workspace().join("examples");
    let runs =
        [("py-victim", &python, examples.join("python/ask.py")), ("node-victim", &node, examples.join("node/ask.mjs"))];
    for (victim, interpreter, script) in runs {
        let mut cmd = Command::new(interpreter);
        cmd.arg(script);
        let reply = run_with_a_reflected_reply(&broker, "dev-ex-reflect", cmd, victim).await;
        assert_eq!(
            reply.get("id"),
            Some(&Value::from("genuine")),
            "{victim} printed another question's reply: {reply:?}"
        );
    }
}
