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

/// Every file under `dir` but the manifest, as the manifest names them (`sub/dir/file`), found
/// by walking the directory here (not by the bundle command's own listing).
fn files_on_disk(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push(path.strip_prefix(root).expect("inside").to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.retain(|f| f != "laya-bundle.json");
    out.sort();
    out
}

/// `sha256sum`'s digest of `file`: computed by coreutils, not by the code under test.
fn sha256sum(file: &Path) -> String {
    let out = std::process::Command::new("sha256sum").arg(file).output().expect("sha256sum runs");
    assert!(out.status.success(), "sha256sum {}", file.display());
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().expect("a digest").to_owned()
}

#[test]
fn a_bundle_of_the_demo_checkpoint_lists_every_file_with_its_sha256_and_its_probe_passes_on_the_cpu() {
    let dir = demo_bundle("cpu");
    let m = manifest(&dir);
    let files = m.get("files").and_then(Value::as_object).expect("files");
    // Every file the bundle holds is listed, and nothing else, each with the digest sha256sum
    // computes of it.
    let listed: Vec<String> = {
        let mut l: Vec<String> = files.keys().cloned().collect();
        l.sort();
        l
    };
    assert_eq!(listed, files_on_disk(&dir), "the manifest's files against the directory");
    for f in [
        "checkpoint/model.safetensors",
        "checkpoint/rl_agent_config.json",
        "checkpoint/tokenizer/tokenizer.json",
        "probe.jsonl",
    ] {
        assert!(files.contains_key(f), "{f} is not listed: {files:?}");
    }
    for (f, d) in files {
        assert_eq!(d.as_str(), Some(sha256sum(&dir.join(f)).as_str()), "{f}");
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

/// Runs `serve` on `dir` against a broker of its own and returns the `config_error` message it
/// published before exiting; fails at once if it came online instead (it took the bundle).
async fn serve_refuses(dir: &Path, device: &str) -> String {
    let broker = Broker::start(device, "");
    let mut watch = Client::connect(broker.port, &format!("{device}-watch")).await;
    watch.subscribe(&format!("laya/v1/{device}/events")).await;
    watch.subscribe(&format!("laya/v1/{device}/status")).await;
    let mut agent = Agent::start(&broker, device, &format!("[model]\ndir = \"{}\"\n", dir.display()));
    // Bounded only so that a broken test fails instead of hanging: a serve that took the bundle
    // comes online (and fails the test below) long before.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut events = Vec::new();
    let status = loop {
        if let Some(s) = agent.child.as_mut().expect("started").try_wait().expect("wait") {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "serve neither exited nor came online");
        if let Some(p) = watch.next(std::time::Duration::from_millis(100)).await {
            let v = decode(&p);
            assert_ne!(v.get("state"), Some(&Value::from("online")), "serve took the damaged bundle: {v:?}");
            events.push(v);
        }
    };
    assert!(!status.success(), "serve exited successfully on a damaged bundle");
    while let Some(p) = watch.next(std::time::Duration::from_secs(2)).await {
        let v = decode(&p);
        assert_ne!(v.get("state"), Some(&Value::from("online")), "serve took the damaged bundle: {v:?}");
        events.push(v);
    }
    let error = events
        .iter()
        .find(|v| v.get("event") == Some(&Value::from("config_error")))
        .unwrap_or_else(|| panic!("no config_error in {events:?}"));
    error.get("message").and_then(Value::as_str).unwrap_or_default().to_owned()
}

/// Every command that answers from `dir` (`predict`, `probe`, `serve`) refuses it with the
/// digest's own message naming `rel`, before reading anything but the manifest; `check` fails
/// naming the file too (with the digest's message where `digest_from_check`: `check` parses the
/// tokenizer before it compares digests).
async fn every_command_refuses(dir: &Path, rel: &str, digest_from_check: bool, device: &str) {
    let path = dir.join(rel).display().to_string();
    let corrupt = format!("{path} is corrupt or was replaced: its sha256 is ");
    let (_, err, ok) = cli(&["check", "--model", dir.to_str().unwrap()]);
    assert!(!ok && err.contains(&path), "check passed {rel}: {err}");
    assert!(!digest_from_check || err.contains(&corrupt), "check on {rel}: {err}");
    let demo = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/demo-requests.jsonl"))
        .expect("requests");
    let args = [OsStr::new("predict"), OsStr::new("--model"), dir.as_os_str()];
    let (out, err, ok) = run_cli(&args, &[], &demo);
    assert!(!ok && err.contains(&corrupt), "predict on {rel}: {err}{out}");
    let (out, err, ok) = cli(&["probe", "--model", dir.to_str().unwrap(), "--backend", "cpu"]);
    assert!(!ok && err.contains(&corrupt), "probe on {rel}: {err}{out}");
    let message = serve_refuses(dir, device).await;
    assert!(message.contains(&corrupt), "serve on {rel}: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_or_replaced_file_is_refused_by_its_sha256_by_every_command_before_it_is_read() {
    let dir = demo_bundle("digests");
    let weights = dir.join("checkpoint/model.safetensors");
    let bytes = std::fs::read(&weights).expect("weights");
    // Truncated on the way to the board: one byte short.
    std::fs::write(&weights, &bytes[..bytes.len() - 1]).expect("truncate");
    every_command_refuses(&dir, "checkpoint/model.safetensors", true, "dev-digest-cut").await;
    // Replaced by a file of the same size, one byte flipped: what no loader can tell.
    let mut other = bytes.clone();
    let last = other.len() - 1;
    other[last] ^= 0xff;
    std::fs::write(&weights, &other).expect("replace");
    every_command_refuses(&dir, "checkpoint/model.safetensors", true, "dev-digest-flip").await;
    std::fs::write(&weights, &bytes).expect("restore");
    // A truncated tokenizer: named by its digest, not by what parsing it says.
    let tokenizer = dir.join("checkpoint/tokenizer/tokenizer.json");
    let text = std::fs::read(&tokenizer).expect("tokenizer");
    std::fs::write(&tokenizer, &text[..text.len() / 2]).expect("truncate");
    every_command_refuses(&dir, "checkpoint/tokenizer/tokenizer.json", false, "dev-digest-tok").await;
    // Put back: it checks and answers again.
    std::fs::write(&tokenizer, &text).expect("restore");
    let (_, err, ok) = cli(&["check", "--model", dir.to_str().unwrap()]);
    assert!(ok, "{err}");
    let args = [OsStr::new("predict"), OsStr::new("--model"), dir.as_os_str()];
    let (_, err, ok) = run_cli(&args, &[], "{}\n");
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
