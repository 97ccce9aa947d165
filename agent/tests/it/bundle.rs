//! Bundles through the binary (issue #14): `laya-edge bundle` assembles one from a checkpoint,
//! `check` validates it and names what is wrong, `probe` runs its probe on a backend, and the
//! commands that answer questions refuse a bundle whose files are not what its manifest says.
//! The NPU round trips are in `rknn_cli.rs` (fake librknnrt) and `qnn_cli.rs` (the simulator).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::support::*;
use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};

fn demo_checkpoint() -> PathBuf {
    std::path::absolute(Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo")).expect("path")
}

fn cli(args: &[&str]) -> (String, String, bool) {
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    run_cli(&args, &[], "")
}

/// A CPU bundle of the demo checkpoint (no graphs) in a new directory.
fn demo_bundle(name: &str) -> PathBuf {
    let out = temp_dir(&format!("bundle-{name}")).join("bundle");
    let (stdout, err, ok) =
        cli(&["bundle", "--checkpoint", demo_checkpoint().to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(ok, "bundle failed: {err}");
    assert!(stdout.contains("probe of"), "{stdout}");
    out
}

fn manifest(dir: &Path) -> Value {
    json::parse(&std::fs::read(dir.join("laya-bundle.json")).expect("manifest"), ParseOptions::default()).expect("json")
}

#[test]
fn a_bundle_of_the_demo_checkpoint_lists_every_file_with_its_sha256_and_its_probe_passes_on_the_cpu() {
    let dir = demo_bundle("cpu");
    let m = manifest(&dir);
    let files = m.get("files").and_then(Value::as_object).expect("files");
    for f in ["checkpoint/model.safetensors", "checkpoint/rl_agent_config.json", "probe.jsonl"] {
        let d = files.get(f).and_then(Value::as_str).unwrap_or_else(|| panic!("{f} is not listed: {files:?}"));
        assert_eq!(d.len(), 64, "{f}: {d}");
    }
    // The default probe: a few dozen rows of every question type, short and long states.
    let probe = std::fs::read_to_string(dir.join("probe.jsonl")).expect("probe");
    let rows: usize = probe
        .lines()
        .map(|l| json::parse_str(l, ParseOptions::default()).expect("json"))
        .map(|v| v.get("rows").and_then(Value::as_object).map_or(0, |r| r.len()))
        .sum();
    assert!((24..=48).contains(&rows), "{rows} probe rows");
    for t in ["\"noul\"", "\"choice\"", "\"score\""] {
        assert!(probe.contains(t), "no {t} question in the probe");
    }
    let (out, err, ok) = cli(&["check", "--model", dir.to_str().unwrap()]);
    assert!(ok, "check failed: {err}");
    assert!(out.contains(&format!("{} file(s) verified by sha256", files.len())), "{out}");
    let (out, err, ok) = cli(&["probe", "--model", dir.to_str().unwrap(), "--backend", "cpu"]);
    assert!(ok, "probe failed: {out} {err}");
    assert!(out.contains(&format!("argmax {rows}/{rows}")), "{out}");
}

#[test]
fn the_bundle_answers_like_the_checkpoint_it_was_made_from() {
    let dir = demo_bundle("same");
    let input = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/demo-requests.jsonl"))
        .expect("requests");
    let from_bundle = run_predict(&dir, "cpu", &input, &[]);
    let from_checkpoint = run_predict(&demo_checkpoint(), "cpu", &input, &[]);
    assert!(!from_bundle.is_empty());
    assert_eq!(from_bundle, from_checkpoint);
}

#[test]
fn a_corrupted_or_replaced_file_is_caught_by_its_sha256_and_named_by_every_command() {
    let dir = demo_bundle("corrupt");
    let weights = dir.join("checkpoint/model.safetensors");
    // Truncated on the way to the board: one byte short.
    let bytes = std::fs::read(&weights).expect("weights");
    std::fs::write(&weights, &bytes[..bytes.len() - 1]).expect("truncate");
    let (_, err, ok) = cli(&["check", "--model", dir.to_str().unwrap()]);
    assert!(!ok, "check passed a truncated file");
    assert!(err.contains("model.safetensors") && err.contains("sha256"), "{err}");
    let args = [OsStr::new("predict"), OsStr::new("--model"), dir.as_os_str()];
    let (_, err, ok) = run_cli(&args, &[], "{}\n");
    assert!(!ok && err.contains("model.safetensors") && err.contains("corrupt"), "{err}");
    let (_, err, ok) = cli(&["probe", "--model", dir.to_str().unwrap()]);
    assert!(!ok && err.contains("model.safetensors"), "{err}");
    // The service refuses to start on it, naming the file (the broker is never reached).
    let config = temp_dir("bundle-corrupt-serve").join("laya-edge.toml");
    std::fs::write(&config, format!("[mqtt]\nbroker = \"mqtt://127.0.0.1:1\"\n[model]\ndir = \"{}\"\n", dir.display()))
        .expect("config");
    // Bounded: a serve that took the bundle would try the broker for ever.
    let out = std::process::Command::new("timeout")
        .arg("60")
        .arg(test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge")))
        .args(["serve", "--config", config.to_str().unwrap()])
        .output()
        .expect("serve runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.status.code() != Some(124), "serve took a corrupt bundle: {err}");
    assert!(err.contains("model.safetensors"), "{err}");
    // Replaced by another file of the same size: still caught.
    let mut other = bytes.clone();
    let last = other.len() - 1;
    other[last] ^= 0xff;
    std::fs::write(&weights, &other).expect("replace");
    let (_, err, ok) = cli(&["check", "--model", dir.to_str().unwrap()]);
    assert!(!ok && err.contains("model.safetensors"), "{err}");
    // Put back: it checks again.
    std::fs::write(&weights, &bytes).expect("restore");
    let (_, err, ok) = cli(&["check", "--model", dir.to_str().unwrap()]);
    assert!(ok, "{err}");
}

/// A copy of the fixture checkpoint `bpe-small` whose `model.safetensors` lost its last bytes.
fn truncated_checkpoint(name: &str) -> PathBuf {
    let from = PathBuf::from(model("bpe-small"));
    let dir = temp_dir(&format!("truncated-{name}")).join("checkpoint");
    for rel in
        ["rl_agent_config.json", "encoder/config.json", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"]
    {
        std::fs::create_dir_all(dir.join(rel).parent().expect("parent")).expect("dir");
        std::fs::copy(from.join(rel), dir.join(rel)).expect("copy");
    }
    let weights = std::fs::read(from.join("model.safetensors")).expect("weights");
    std::fs::write(dir.join("model.safetensors"), &weights[..weights.len() - 1000]).expect("truncated weights");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_a_plain_checkpoint_with_truncated_weights_publishes_config_error_naming_the_file_and_exits() {
    let ckpt = truncated_checkpoint("serve");
    let broker = Broker::start("truncated-serve", "");
    let mut watch = Client::connect(broker.port, "truncated-watch").await;
    watch.subscribe("laya/v1/dev-truncated/events").await;
    watch.subscribe("laya/v1/dev-truncated/status").await;
    let mut agent = Agent::start(&broker, "dev-truncated", &format!("[model]\ndir = \"{}\"\n", ckpt.display()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    // Polled in place: a failing test drops `agent`, which kills a serve that did not exit.
    let status = loop {
        if let Some(s) = agent.child.as_mut().expect("started").try_wait().expect("wait") {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "serve did not exit on truncated weights");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(!status.success(), "serve exited successfully on truncated weights");
    // What the broker got: a config_error naming the file, and never an online status.
    let mut events = Vec::new();
    while let Some(p) = watch.next(std::time::Duration::from_secs(2)).await {
        let v = decode(&p);
        assert_ne!(v.get("state"), Some(&Value::from("online")), "the agent came online: {v:?}");
        events.push(v);
    }
    let error = events
        .iter()
        .find(|v| v.get("event") == Some(&Value::from("config_error")))
        .unwrap_or_else(|| panic!("no config_error in {events:?}"));
    let message = error.get("message").and_then(Value::as_str).unwrap_or_default();
    assert!(message.contains(&ckpt.join("model.safetensors").display().to_string()), "{message}");
}

#[test]
fn check_loads_what_it_can_and_fails_on_truncated_weights_or_a_truncated_rknn_graph() {
    // A plain checkpoint: no sha256 to compare, the weights' header is checked against the file.
    let ckpt = truncated_checkpoint("check");
    let (out, err, ok) = cli(&["check", "--model", ckpt.to_str().unwrap()]);
    assert!(!ok, "check passed truncated weights: {out}");
    assert!(err.contains("model.safetensors"), "{err}");
    let (out, err, ok) = cli(&["check", "--model", &model("bpe-small")]);
    assert!(ok && out.contains("header checked"), "{out} {err}");
    // A hand-written RKNN bundle (no files list) around Rockchip's demo graph: whole, then cut.
    let dir = temp_dir("truncated-rknn").join("bundle");
    std::fs::create_dir_all(&dir).expect("dir");
    let graph = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/rknn/demo/demo.rknn"))
        .expect("the demo graph");
    let ckpt_json = json::to_string(&Value::Str(demo_checkpoint().display().to_string()), json::Style::COMPACT);
    std::fs::write(
        dir.join("laya-bundle.json"),
        format!(r#"{{"backend": "rknn", "checkpoint": {ckpt_json}, "graphs": [{{"file": "demo.rknn", "seq_len": 512, "marker_slots": 64}}]}}"#),
    )
    .expect("manifest");
    std::fs::write(dir.join("demo.rknn"), &graph).expect("graph");
    let (out, err, ok) = cli(&["check", "--model", dir.to_str().unwrap()]);
    assert!(ok, "check refused the whole graph: {err}");
    assert!(out.contains("rknn bundle, 1 graph(s)"), "{out}");
    std::fs::write(dir.join("demo.rknn"), &graph[..graph.len() / 2]).expect("truncated graph");
    let (out, err, ok) = cli(&["check", "--model", dir.to_str().unwrap()]);
    assert!(!ok, "check passed a truncated graph: {out}");
    assert!(err.contains("demo.rknn") && err.contains("truncated"), "{err}");
}

#[test]
fn a_probe_that_no_longer_lays_out_as_recorded_is_named_with_the_question() {
    let dir = demo_bundle("layout");
    // Another tokenizer (or layout) than the probe was made with: the recorded token ids differ.
    let probe = dir.join("probe.jsonl");
    let text = std::fs::read_to_string(&probe).expect("probe");
    let mut v = json::parse_str(text.lines().next().expect("a line"), ParseOptions::default()).expect("json");
    if let Value::Object(m) = &mut v
        && let Some(Value::Object(rows)) = m.get_mut("rows")
        && let Some((_, Value::Object(row))) = rows.iter_mut().next()
        && let Some(Value::Array(ids)) = row.get_mut("input_ids")
    {
        ids.pop();
    }
    let rest: Vec<&str> = text.lines().skip(1).collect();
    std::fs::write(&probe, format!("{}\n{}\n", json::to_string(&v, json::Style::COMPACT), rest.join("\n")))
        .expect("write");
    // The manifest's digest catches it first; without the digest (a hand-edited manifest), the
    // layout check does.
    let (_, err, ok) = cli(&["check", "--model", dir.to_str().unwrap()]);
    assert!(!ok && err.contains("probe.jsonl"), "{err}");
    let mut m = manifest(&dir);
    if let Value::Object(o) = &mut m {
        o.shift_remove("files");
    }
    std::fs::write(dir.join("laya-bundle.json"), json::to_string(&m, json::Style::PYTHON)).expect("manifest");
    let (_, err, ok) = cli(&["check", "--model", dir.to_str().unwrap()]);
    assert!(!ok && err.contains("probe.jsonl") && err.contains("lays out to"), "{err}");
}

#[test]
fn bundle_refuses_to_overwrite_and_to_mix_backends() {
    let dir = demo_bundle("refuse");
    let ckpt = demo_checkpoint();
    let (_, err, ok) = cli(&["bundle", "--checkpoint", ckpt.to_str().unwrap(), "--out", dir.to_str().unwrap()]);
    assert!(!ok && err.contains("not empty"), "{err}");
    let out = temp_dir("bundle-mixed").join("b");
    let (_, err, ok) = cli(&[
        "bundle",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--qnn",
        "a.bin",
        "--rknn",
        "b.rknn",
    ]);
    assert!(!ok && err.contains("one backend"), "{err}");
    let (_, err, ok) = cli(&["bundle", "--checkpoint", "/nonexistent/ckpt", "--out", out.to_str().unwrap()]);
    assert!(!ok && err.contains("/nonexistent/ckpt"), "{err}");
}
