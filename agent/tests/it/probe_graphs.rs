//! The bundle probe cannot pass a broken bundle (issue #28), through the binary on the fake QNN
//! runtime (tests/fake-qnn, the CPU encoder behind the QNN C API, whose knobs break one graph of a
//! bundle: `FAKE_QNN_COLLAPSE`, `FAKE_QNN_SCALE_INPUT`, `FAKE_QNN_FAULT_L`):
//!
//! - each graph is probed on rows of its own length and judged on its own: a bundle whose 256
//!   graph collapses fails on that graph while its 128 graph passes, the verdict naming the graph;
//!   `bundle` fills a graph the maker's requests leave short from the built-in requests and prints
//!   the split, `check` refuses a probe that leaves a graph short;
//! - the default thresholds fail an input scale 10x too small;
//! - `predict` names the backend that answered each line, and a backend named with `--backend`
//!   never falls back to the CPU unless `--fallback cpu` asks;
//! - telemetry keeps each role's probe runs: after degrading, the primary's failure beside the
//!   fallback's pass;
//! - `check` compares a QNN manifest's tensors (data type, scale, offset) with the binary's.
//!
//! The same per-graph verdict on Qualcomm's simulator, with a real collapsed 256-token binary
//! (tests/fixtures/qnn/demo-broken), is the last test (skipped without the simulator).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::support::*;
use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};
use test_kit::{build_fake_library, qnn_simulator, workspace};

fn demo_checkpoint() -> PathBuf {
    std::path::absolute(workspace().join("models/demo")).expect("path")
}

fn fake_lib() -> PathBuf {
    build_fake_library("fake-qnn", "fake_qnn")
}

fn cli(args: &[&OsStr], env: &[(&str, &Path)]) -> (String, String, bool) {
    run_cli(args, env, "")
}

/// A file of `n` ordinary (short) requests: the demo's held-out tickets, nearly all under 128
/// tokens (the first 40 give the 256-token graph 6 rows, too few to judge it).
fn short_requests(n: usize) -> PathBuf {
    let text = std::fs::read_to_string(workspace().join("tests/fixtures/demo/heldout.jsonl")).expect("held-out");
    let file = temp_dir("probe-short-requests").join("requests.jsonl");
    std::fs::write(&file, text.lines().take(n).collect::<Vec<_>>().join("\n")).expect("write");
    file
}

/// `laya-edge bundle` of fake QNN graphs of 128 and 256 tokens over the demo checkpoint, probed
/// with `probe` (else the built-in requests); the bundle and what `bundle` printed.
fn assembled(name: &str, probe: Option<&Path>) -> (PathBuf, String) {
    assembled_of(&demo_checkpoint(), name, probe)
}

/// [`assembled`] over the checkpoint `checkpoint`.
fn assembled_of(checkpoint: &Path, name: &str, probe: Option<&Path>) -> (PathBuf, String) {
    let dir = temp_dir(&format!("probe-graphs-{name}"));
    let ckpt = json::to_string(&Value::Str(checkpoint.display().to_string()), json::Style::COMPACT);
    let mut args: Vec<OsString> = vec!["bundle".into(), "--checkpoint".into(), checkpoint.into()];
    for l in [128, 256] {
        let file = dir.join(format!("enc_{l}.bin"));
        std::fs::write(
            &file,
            format!(r#"{{"fake_qnn_binary": 1, "checkpoint": {ckpt}, "seq_len": {l}, "graph_name": "enc_{l}"}}"#),
        )
        .expect("binary");
        // What tools/qnn writes beside a binary: calibrated with the masks clipped.
        std::fs::write(
            dir.join(format!("enc_{l}.json")),
            format!(r#"{{"files": {{"context_binary": "enc_{l}.bin"}}, "calibration": "min-max", "mask_clip": 100}}"#),
        )
        .expect("description");
        args.extend(["--qnn".into(), file.into()]);
    }
    let out = dir.join("bundle");
    args.extend(["--out".into(), out.clone().into(), "--qnn-system-lib".into(), fake_lib().into()]);
    if let Some(p) = probe {
        args.extend(["--probe".into(), p.into()]);
    }
    let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
    let (stdout, err, ok) = cli(&args, &[]);
    assert!(ok, "bundle failed: {err}");
    (out, stdout)
}

/// A configuration running `bundle` on the fake QNN runtime, with `extra` TOML lines in
/// `[engine]`.
fn config(bundle: &Path, engine: &str) -> PathBuf {
    let file = temp_dir("probe-graphs-config").join("laya-edge.toml");
    let lib = fake_lib();
    std::fs::write(
        &file,
        format!(
            "[model]\ndir = \"{}\"\n[engine]\nbackend = \"qnn\"\n{engine}\n[qnn]\nbackend_lib = \"{lib}\"\nsystem_lib = \"{lib}\"\n",
            bundle.display(),
            lib = lib.display()
        ),
    )
    .expect("config");
    file
}

/// `laya-edge probe` of `bundle` on the fake runtime with `knobs`.
fn probe_cli(bundle: &Path, knobs: &[(&str, &Path)]) -> (String, String, bool) {
    let config = config(bundle, "");
    cli(&[OsStr::new("probe"), "--config".as_ref(), config.as_os_str()], knobs)
}

/// The split `check` reports: `probe N rows (graph 128: a, graph 256: b)` as `[(128, a), (256, b)]`.
fn checked_split(bundle: &Path) -> Vec<(usize, usize)> {
    let (out, err, ok) = cli(&[OsStr::new("check"), "--model".as_ref(), bundle.as_os_str()], &[]);
    assert!(ok, "check failed: {err}");
    let inside = out.split("rows (").nth(1).and_then(|s| s.split(')').next()).unwrap_or_else(|| panic!("{out}"));
    inside
        .split(", ")
        .map(|part| {
            let (g, n) = part.trim_start_matches("graph ").split_once(": ").unwrap_or_else(|| panic!("{out}"));
            (g.parse().unwrap(), n.parse().unwrap())
        })
        .collect()
}

const COLLAPSE_256: [(&str, &str); 2] = [("FAKE_QNN_COLLAPSE", "1"), ("FAKE_QNN_FAULT_L", "256")];

fn knobs<'a>(pairs: &'a [(&'a str, &'a str)]) -> Vec<(&'a str, &'a Path)> {
    pairs.iter().map(|(k, v)| (*k, Path::new(*v))).collect()
}

#[test]
fn a_bundle_whose_256_graph_collapses_fails_its_probe_on_that_graph_while_its_128_graph_passes() {
    // Ordinary traffic as the probe: short requests. Judged as a whole, their rows would nearly
    // all run on the 128 graph and say next to nothing of the 256 one.
    let (bundle, printed) = assembled("collapse", Some(&short_requests(40)));
    assert!(printed.contains("graph 256: ") && printed.contains("from the built-in requests"), "{printed}");
    let split = checked_split(&bundle);
    assert_eq!(split.iter().map(|(g, _)| *g).collect::<Vec<_>>(), [128, 256], "{split:?}");
    assert!(split.iter().all(|(_, n)| *n >= 16), "a graph without its 16 rows: {split:?}");

    let (out, err, ok) = probe_cli(&bundle, &[]);
    assert!(ok, "the healthy fake failed: {out} {err}");
    assert!(out.contains("graph 128 (") && out.contains("graph 256 ("), "{out}");

    let (out, err, ok) = probe_cli(&bundle, &knobs(&COLLAPSE_256));
    assert!(!ok, "the collapsed 256 graph passed: {out}");
    let verdict = err.lines().find(|l| l.contains("probe failed")).unwrap_or_else(|| panic!("{err}"));
    assert!(verdict.contains("probe failed: graph 256: "), "the verdict names the graph: {verdict}");
    assert!(!verdict.contains("graph 128"), "the sound graph is not blamed: {verdict}");
    let line = |g: &str| out.lines().find(|l| l.trim_start().starts_with(g)).unwrap_or_else(|| panic!("{out}"));
    assert!(line("graph 128 (").ends_with(": passed"), "{out}");
    assert!(line("graph 256 (").contains("FAILED") && line("graph 256 (").contains("collapsed"), "{out}");
}

#[test]
fn a_probe_that_leaves_a_graph_short_of_rows_is_refused_by_check() {
    let (bundle, _) = assembled("thin", None);
    // Keep only the probe lines whose rows all run on the 128 graph (the user's short traffic),
    // with the manifest's sha256 of the probe brought up to date.
    let probe = bundle.join("probe.jsonl");
    let text = std::fs::read_to_string(&probe).expect("probe");
    let short: Vec<&str> = text
        .lines()
        .filter(|l| {
            let v = json::parse_str(l, ParseOptions::default()).expect("json");
            v.get("rows")
                .and_then(Value::as_object)
                .expect("rows")
                .values()
                .all(|r| r.get("input_ids").and_then(Value::as_array).is_some_and(|ids| ids.len() <= 128))
        })
        .collect();
    std::fs::write(&probe, short.join("\n") + "\n").expect("write");
    let manifest = bundle.join("laya-bundle.json");
    let digest = laya_edge::bundle::digest::sha256_file(&probe).expect("sha256");
    let m = std::fs::read_to_string(&manifest).expect("manifest");
    let old = m.split("\"probe.jsonl\": \"").nth(1).and_then(|s| s.get(..64)).expect("the probe's sha256").to_owned();
    std::fs::write(&manifest, m.replace(&old, &digest)).expect("manifest");
    let (out, err, ok) = cli(&[OsStr::new("check"), "--model".as_ref(), bundle.as_os_str()], &[]);
    assert!(!ok, "check passed a probe without 256-token rows: {out}");
    assert!(err.contains("probe.jsonl") && err.contains("graph 256 has 0"), "{err}");
}

#[test]
fn an_input_scale_ten_times_too_small_on_the_256_graph_fails_the_default_thresholds_the_old_ones_let_through() {
    // A fixture checkpoint (tests/fixtures/laya-0.3.20/models/bpe-t5: steep random heads, as
    // sensitive as the issue's model) with its 256 graph fed inputs 10x too small: 2 of its 33
    // clear decisions flip (6%), mean |dp| 0.04, cosine 0.998. The old defaults (agreement 0.9,
    // cosine 0.98) passed that graph; 0.95 does not.
    let ckpt = std::path::absolute(workspace().join("tests/fixtures/laya-0.3.20/models/bpe-t5")).expect("path");
    let (bundle, _) = assembled_of(&ckpt, "scale", None);
    let (out, err, ok) = probe_cli(&bundle, &[]);
    assert!(ok, "the sound fake failed: {out} {err}");
    let (out, err, ok) = probe_cli(&bundle, &knobs(&[("FAKE_QNN_SCALE_INPUT", "0.1"), ("FAKE_QNN_FAULT_L", "256")]));
    assert!(!ok, "an input scale 10x too small passed the probe: {out}");
    let verdict = err.lines().find(|l| l.contains("probe failed")).unwrap_or_else(|| panic!("{err}"));
    assert!(verdict.contains("probe failed: graph 256: argmax agreement 0.939 < 0.95"), "{verdict}");
    assert!(verdict.contains("(2 of 33 flipped)"), "{verdict}");
}

/// Two demo requests, one line each: a short one and one whose state fills the 256 graph.
fn two_lines() -> String {
    let built_in =
        std::fs::read_to_string(workspace().join("agent/src/engine/probe_requests.jsonl")).expect("built-in");
    let long = built_in.lines().find(|l| l.contains("\"probe-13\"")).expect("a long request");
    format!("{}\n{long}\n", json::to_string(&request("short"), json::Style::COMPACT))
}

fn predict(config: &Path, flags: &[&str], knobs: &[(&str, &Path)]) -> Vec<Value> {
    let mut args: Vec<&OsStr> = vec![OsStr::new("predict"), "--config".as_ref(), config.as_os_str()];
    args.extend(flags.iter().map(OsStr::new));
    let (out, err, ok) = run_cli(&args, knobs, &two_lines());
    assert!(ok, "predict {flags:?} failed: {err}");
    out.lines().map(|l| json::parse_str(l, ParseOptions::default()).expect("json")).collect()
}

fn who(line: &Value) -> (Option<&str>, Option<&str>) {
    (line.get("backend").and_then(Value::as_str), line.get("serving").and_then(Value::as_str))
}

#[test]
fn predict_names_the_backend_that_answered_each_line_and_an_explicit_backend_never_falls_back_unless_asked() {
    let (bundle, _) = assembled("predict", None);
    // The file asks for the CPU fallback, as a board's would; ready_wait_s 0: no line is handed
    // to the fallback for waiting, only for a degraded primary.
    let config = config(&bundle, "fallback = \"cpu\"\nmax_restarts = 1\nmax_failed_health = 1\nready_wait_s = 0");
    let healthy = predict(&config, &["--backend", "qnn"], &[]);
    assert_eq!(healthy.iter().map(who).collect::<Vec<_>>(), [(Some("qnn"), Some("primary")); 2], "{healthy:?}");

    // The 256 graph collapses: the probe fails, the primary degrades.
    let broken = knobs(&COLLAPSE_256);
    let alone = predict(&config, &["--backend", "qnn"], &broken);
    for line in &alone {
        let error = line.get("error").unwrap_or_else(|| panic!("answered without the NPU it measures: {line:?}"));
        let message = error.get("message").and_then(Value::as_str).unwrap_or_default();
        assert!(message.contains("probe failed: graph 256"), "the cause is not named: {line:?}");
    }
    // Asked for: the fallback answers, and every line says so.
    let fallback = predict(&config, &["--backend", "qnn", "--fallback", "cpu"], &broken);
    assert_eq!(fallback.iter().map(who).collect::<Vec<_>>(), [(Some("cpu"), Some("fallback")); 2], "{fallback:?}");
    // The file's own fallback, without --backend: as `serve` does, and said on every line.
    let as_configured = predict(&config, &[], &broken);
    assert_eq!(as_configured.iter().map(who).collect::<Vec<_>>(), [(Some("cpu"), Some("fallback")); 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_degrading_telemetry_keeps_the_primarys_probe_failure_beside_the_fallbacks_pass() {
    let (bundle, _) = assembled("telemetry", None);
    let broker = Broker::start("probe-graphs-telemetry", "");
    let lib = fake_lib();
    let config = temp_dir("probe-graphs-telemetry").join("laya-edge.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt]\nbroker = \"{}\"\ndevice = \"qcs-probe\"\ntelemetry_interval_s = 1\n[model]\ndir = \"{}\"\n\
             [engine]\nbackend = \"qnn\"\nfallback = \"cpu\"\nmax_restarts = 1\nmax_failed_health = 1\n\
             [qnn]\nbackend_lib = \"{lib}\"\nsystem_lib = \"{lib}\"\n",
            broker.url(),
            bundle.display(),
            lib = lib.display()
        ),
    )
    .expect("config");
    let mut t = Client::connect(broker.port, "qcs-probe-telemetry").await;
    t.subscribe("laya/v1/qcs-probe/telemetry").await;
    let env = COLLAPSE_256.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let _agent = Agent::with_config(config, env);
    let doc = telemetry_where(&mut t, "the fallback's passing probe", |v| {
        v.get("probes").and_then(|p| p.get("fallback")).and_then(|f| f.get("last")).is_some()
    })
    .await;
    let probes = doc.get("probes").expect("probes");
    let fallback = probes.get("fallback").and_then(|f| f.get("last")).expect("the fallback's run");
    assert_eq!(fallback.get("passed"), Some(&Value::Bool(true)), "{doc:?}");
    assert_eq!(fallback.get("backend"), Some(&Value::from("cpu")));
    let failure = probes.get("primary").and_then(|p| p.get("last_failure")).expect("the primary's failure");
    assert_eq!(failure.get("backend"), Some(&Value::from("qnn")), "{doc:?}");
    let verdict = failure.get("verdict").and_then(Value::as_str).unwrap_or_default();
    assert!(verdict.starts_with("graph 256: "), "{verdict}");
    let graphs = failure.get("graphs").and_then(Value::as_array).expect("per graph");
    let passed: Vec<(Option<i64>, Option<&Value>)> =
        graphs.iter().map(|g| (g.get("seq_len").and_then(Value::as_i64), g.get("passed"))).collect();
    assert_eq!(passed, [(Some(128), Some(&Value::Bool(true))), (Some(256), Some(&Value::Bool(false)))]);
    // `probe`, as before issue #28 one run: the configured backend's, not the fallback's pass.
    let probe = doc.get("probe").expect("probe");
    assert_eq!((probe.get("role"), probe.get("passed")), (Some(&Value::from("primary")), Some(&Value::Bool(false))));
}

/// The bundle's manifest with `edit` applied to the first graph's `inputs_embeds` tensor entry.
fn edit_tensor(bundle: &Path, edit: impl FnOnce(&mut laya_topics::Map)) {
    let path = bundle.join("laya-bundle.json");
    let mut m = json::parse(&std::fs::read(&path).expect("manifest"), ParseOptions::default()).expect("json");
    let Value::Object(top) = &mut m else { panic!("manifest") };
    let Some(Value::Array(graphs)) = top.get_mut("graphs") else { panic!("graphs") };
    let Value::Object(g) = &mut graphs[0] else { panic!("graph") };
    let Some(Value::Array(tensors)) = g.get_mut("tensors") else { panic!("tensors") };
    let Value::Object(t) = &mut tensors[0] else { panic!("tensor") };
    assert_eq!(t.get("logical"), Some(&Value::from("inputs_embeds")));
    edit(t);
    std::fs::write(&path, json::to_string(&m, json::Style::PYTHON)).expect("manifest");
}

fn check_with_system_lib(bundle: &Path, lib: &Path) -> (String, String, bool) {
    cli(
        &[OsStr::new("check"), "--model".as_ref(), bundle.as_os_str(), "--qnn-system-lib".as_ref(), lib.as_os_str()],
        &[],
    )
}

#[test]
fn check_compares_a_qnn_manifests_tensors_with_the_binary_and_names_what_contradicts_it() {
    let (bundle, _) = assembled("check", None);
    let lib = fake_lib();
    let (out, err, ok) = check_with_system_lib(&bundle, &lib);
    assert!(ok && out.contains("2 QNN binaries match the manifest"), "{out} {err}");
    let (out, _, ok) = cli(&[OsStr::new("check"), "--model".as_ref(), bundle.as_os_str()], &[]);
    assert!(ok && out.contains("not compared with the manifest"), "without the library, check says so: {out}");
    // The fake's inputs are float32: a manifest that gives inputs_embeds a 16-bit scale lies.
    edit_tensor(&bundle, |t| {
        t.insert("data_type".into(), "ufixed16".into());
        t.insert("scale".into(), Value::Float(1.6e-5));
    });
    let (out, err, ok) = check_with_system_lib(&bundle, &lib);
    assert!(!ok, "check passed a manifest that contradicts the binary: {out}");
    assert!(
        err.contains("the manifest contradicts the binary")
            && err.contains("inputs_embeds data_type is \"ufixed16\" in the manifest, \"float32\" in the binary")
            && err.contains("inputs_embeds scale is 1.6e-05 in the manifest, null in the binary"),
        "{err}"
    );
}

/// `laya-edge bundle` of the demo checkpoint with the committed QNN `binaries` (under
/// tests/fixtures/qnn), read through the simulator's libQnnSystem, and `extra` flags; the bundle
/// and what `bundle` printed.
fn assembled_on_the_simulator(name: &str, libs: &Path, binaries: &[&str], extra: &[&OsStr]) -> (PathBuf, String) {
    let out = temp_dir(&format!("probe-graphs-{name}")).join("bundle");
    let mut args: Vec<OsString> = vec!["bundle".into(), "--checkpoint".into(), demo_checkpoint().into()];
    args.extend(["--out".into(), out.clone().into(), "--qnn-system-lib".into(), libs.join("libQnnSystem.so").into()]);
    for b in binaries {
        let file = std::path::absolute(workspace().join("tests/fixtures/qnn").join(b)).expect("path");
        args.extend(["--qnn".into(), file.into()]);
    }
    args.extend(extra.iter().map(|a| a.to_os_string()));
    let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
    let (printed, err, ok) = cli(&args, &[]);
    assert!(ok, "bundle failed: {err}");
    (out, printed)
}

#[test]
#[ignore = "needs the QNN HTP simulator (LAYA_QNN_LIB_DIR, tools/qnn/fetch-runtime.sh): --include-ignored runs it, as tools/test.sh does"]
fn on_the_simulator_check_refuses_a_manifest_input_scale_ten_times_too_small() {
    let libs = qnn_simulator();
    let (out, _) = assembled_on_the_simulator("sim-check", &libs, &["demo/enc_L128_u16io_ctx_qnn.bin"], &[]);
    let system = libs.join("libQnnSystem.so");
    let (o, e, ok) = check_with_system_lib(&out, &system);
    assert!(ok, "{o} {e}");
    let mut scale = 0.0;
    edit_tensor(&out, |t| {
        scale = t.get("scale").and_then(Value::as_f64).expect("a ufixed16 scale");
        t.insert("scale".into(), Value::Float(scale / 10.0));
    });
    let (o, err, ok) = check_with_system_lib(&out, &system);
    assert!(!ok, "check passed an input scale 10x too small: {o}");
    assert!(err.contains("inputs_embeds scale is") && err.contains("in the binary"), "{err}");
}

#[test]
#[ignore = "needs the QNN HTP simulator (LAYA_QNN_LIB_DIR, tools/qnn/fetch-runtime.sh): --include-ignored runs it, as tools/test.sh does"]
fn on_the_simulator_a_real_collapsed_256_binary_fails_the_probe_on_its_graph_while_the_128_binary_passes() {
    let libs = qnn_simulator();
    // The demo's sound 128-token binary beside the min-max 256 one calibrated on the raw masks
    // (tests/fixtures/qnn/demo-broken), which the maker allowed; probed with short requests.
    let short = short_requests(40);
    let (out, printed) = assembled_on_the_simulator(
        "sim",
        &libs,
        &["demo/enc_L128_u16io_ctx_qnn.bin", "demo-broken/enc_L256_f32io_minmax_noclip_ctx_qnn.bin"],
        &["--allow-minmax-above-128".as_ref(), "--probe".as_ref(), short.as_os_str()],
    );
    assert!(printed.contains("from the built-in requests"), "{printed}");
    let config = temp_dir("probe-graphs-sim-config").join("laya-edge.toml");
    // The verdict is this test's subject, not the simulator's speed: a fixed deadline a
    // question (the derived one, 4 x what the health call's rows took, was missed once in CI
    // with four simulator tests sharing two cores).
    std::fs::write(
        &config,
        format!(
            "[model]\ndir = \"{}\"\n[engine]\nbackend = \"qnn\"\ndeadline_ms = 60000\n[qnn]\nbackend_lib = \"{}\"\nsystem_lib = \"{}\"\n",
            out.display(),
            libs.join("libQnnHtp.so").display(),
            libs.join("libQnnSystem.so").display()
        ),
    )
    .expect("config");
    let (o, err, ok) = cli(&[OsStr::new("probe"), "--config".as_ref(), config.as_os_str()], &[]);
    eprintln!("simulator, collapsed 256 binary: {o}{err}");
    assert!(!ok, "the collapsed 256 binary passed: {o}");
    assert!(err.contains("probe failed: graph 256: ") && !err.contains("graph 128:"), "{err}");
    let line = o.lines().find(|l| l.trim_start().starts_with("graph 128 (")).unwrap_or_else(|| panic!("{o}"));
    assert!(line.ends_with(": passed"), "{o}");
}
