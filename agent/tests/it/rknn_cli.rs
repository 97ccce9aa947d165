//! The RKNN backend through the agent's own front ends, on the fake librknnrt
//! (tests/fake-rknn): `predict --backend rknn`, `serve` with `backend = "rknn"`, and the
//! watchdog restarting a hung or failing runtime in the worker process.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::*;
use laya_edge::config::BackendKind;
use laya_edge::engine::Policy;
use laya_edge::engine::{Engine, EngineConfig, EngineError, WorkerSpec};
use laya_edge::prompt::{QType, Row};
use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};
use laya_topics::wire::Encoding;
use test_kit::build_fake_library;

fn fake_library() -> PathBuf {
    build_fake_library("fake-rknn", "fake_rknn")
}

/// An RKNN bundle: fake graphs of 128 and 512 tokens over a fixture checkpoint.
fn bundle_dir(name: &str, model: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("laya-rknn-bundle-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let ckpt = std::path::absolute(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/laya-0.3.20/models").join(model),
    )
    .expect("path");
    let ckpt_json = json::to_string(&Value::Str(ckpt.display().to_string()), json::Style::COMPACT);
    for l in [128, 512] {
        std::fs::write(
            dir.join(format!("g{l}.fake.rknn")),
            format!(r#"{{"fake_rknn_graph": 1, "checkpoint": {ckpt_json}, "seq_len": {l}, "marker_slots": 64}}"#),
        )
        .expect("graph");
    }
    std::fs::write(
        dir.join("laya-bundle.json"),
        format!(
            r#"{{"backend": "rknn", "checkpoint": {ckpt_json}, "graphs": [{{"file": "g128.fake.rknn", "seq_len": 128, "marker_slots": 64}}, {{"file": "g512.fake.rknn", "seq_len": 512, "marker_slots": 64}}], "runtime_allowlist": ["2.3.2"]}}"#
        ),
    )
    .expect("manifest");
    dir
}

/// The fake runs the CPU reference; the act head is not part of the RKNN graph.
const RKNN: Closeness = Closeness { tol: 1e-4, clear_gap: 0.0, skip: &["action"] };

#[test]
fn predict_with_the_rknn_backend_gives_the_cpu_answers() {
    let lib = fake_library();
    let bundle = bundle_dir("predict", "bpe-small");
    let input = fixture_requests("bpe-small", 25, 512);
    // The [rknn] keys reach predict's worker through --config.
    let config = format!(
        "[model]\ndir = \"{}\"\n[engine]\nbackend = \"rknn\"\n[rknn]\nlibrary = \"{}\"\n",
        bundle.display(),
        lib.display()
    );
    let rknn = run_predict_with_config(&config, &input);
    let cpu = run_predict(
        Path::new(&format!("{}/../tests/fixtures/laya-0.3.20/models/bpe-small", env!("CARGO_MANIFEST_DIR"))),
        "cpu",
        &input,
        &[],
    );
    assert_eq!(rknn.len(), 25);
    for (i, (a, b)) in rknn.iter().zip(&cpu).enumerate() {
        assert_answers_close(a, b, &RKNN, &format!("line {i}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_the_rknn_backend_answers_over_mqtt() {
    let lib = fake_library();
    let bundle = bundle_dir("serve", "bpe-small");
    let broker = Broker::start("rknn-serve", "");
    let settings = format!(
        "[model]\ndir = \"{}\"\n[engine]\nbackend = \"rknn\"\n[rknn]\nlibrary = \"{}\"\n",
        bundle.display(),
        lib.display()
    );
    let _agent = Agent::start(&broker, "rk1", &settings);
    wait_online(broker.port, "rk1").await;
    let mut c = Client::connect(broker.port, "rk-asker").await;
    c.subscribe("laya/v1/reply/rk-asker/#").await;
    let request = fixture_requests("bpe-small", 1, 512);
    let request = json::parse_str(request.trim(), ParseOptions::default()).expect("json");
    c.ask("laya/v1/rk1/ask", Encoding::Json.encode(&request), Some("laya/v1/reply/rk-asker/x"), None, Encoding::Json)
        .await;
    let reply = decode(&c.next(Duration::from_secs(60)).await.expect("a reply"));
    assert_eq!(reply.get("backend"), Some(&Value::from("rknn")));
    let cpu = run_predict(
        Path::new(&format!("{}/../tests/fixtures/laya-0.3.20/models/bpe-small", env!("CARGO_MANIFEST_DIR"))),
        "cpu",
        &fixture_requests("bpe-small", 1, 512),
        &[],
    );
    assert_answers_close(
        reply.get("answers").expect("answers"),
        cpu[0].get("answers").expect("answers"),
        &RKNN,
        "answers",
    );
    // The retained status names the runtime the worker loaded, the model and its manifest's sha256.
    c.subscribe("laya/v1/rk1/status").await;
    let status = decode(&c.next(Duration::from_secs(10)).await.expect("the retained status"));
    assert_eq!(status.get("runtime"), Some(&Value::from("librknnrt 2.3.2 (fake) (driver 0.9.8)")), "{status:?}");
    let dir_name = bundle.file_name().and_then(|n| n.to_str()).expect("a name");
    assert_eq!(status.get("model_name"), Some(&Value::from(dir_name)), "{status:?}");
    let sha = std::process::Command::new("sha256sum").arg(bundle.join("laya-bundle.json")).output().expect("sha256sum");
    let sha = String::from_utf8_lossy(&sha.stdout).split_whitespace().next().unwrap_or_default().to_owned();
    assert_eq!(sha.len(), 64);
    assert_eq!(status.get("bundle_sha256"), Some(&Value::from(sha.as_str())), "{status:?}");
}

/// The agent's RKNN worker on `bundle` with `rknn.library = lib`, plus the fake runtime's knobs.
fn rknn_worker(bundle: &Path, lib: &Path, env: &[(&str, &str)]) -> WorkerSpec {
    let mut config = laya_edge::config::Config::default();
    config.model.dir = bundle.to_path_buf();
    config.rknn.library = Some(lib.to_path_buf());
    let program = test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge"));
    let mut spec = laya_edge::engine::spec::worker_spec(&program, BackendKind::Rknn, &config).expect("spec");
    spec.env.extend(env.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))));
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_or_failing_rknn_runtime_is_restarted_by_the_watchdog() {
    let lib = fake_library();
    let bundle = bundle_dir("watchdog", "bpe-small");
    let row = Row { input_ids: vec![1, 60, 70, 2, 4, 80, 2], marker_pos: vec![4], qtype: QType::Noul, layout: None };
    let policy = Policy {
        fixed_deadline: Some(Duration::from_millis(1500)),
        load_allowance: Duration::ZERO,
        ..Policy::default()
    };
    // Every worker hangs on its first run: killed at the deadline, restarted, killed again.
    let engine =
        Engine::start(EngineConfig::new(policy.clone(), rknn_worker(&bundle, &lib, &[("FAKE_RKNN_HANG_ON_RUN", "1")])));
    assert!(matches!(engine.run(vec![row.clone()], None).await, Err(EngineError::Quarantined(_))));
    let reasons: Vec<&str> = engine.restarts().iter().map(|r| r.reason.label()).collect();
    assert_eq!(reasons, ["deadline", "deadline"]);
    // A driver job timeout (-1) after a run is fatal: the worker is replaced and the call re-run;
    // the knob applies to every worker process, so the re-run fails too and the answer is
    // quarantined (an error for this request alone) after two fatal restarts.
    let engine = Engine::start(EngineConfig::new(
        policy,
        rknn_worker(&bundle, &lib, &[("FAKE_RKNN_FAIL_CODE", "-1"), ("FAKE_RKNN_FAIL_ON_RUN", "1")]),
    ));
    assert!(matches!(engine.run(vec![row], None).await, Err(EngineError::Quarantined(_))));
    let restarts = engine.restarts();
    assert_eq!(restarts.len(), 2);
    assert!(
        restarts.iter().all(|r| matches!(r.reason, laya_edge::engine::RestartReason::Fatal { code: Some(-1), .. })),
        "{restarts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hang_in_one_of_three_contexts_is_caught_by_the_watchdog_and_a_fresh_worker_answers() {
    let lib = fake_library();
    let bundle = bundle_dir("watchdog3", "bpe-small");
    let row = |n: u32| Row {
        input_ids: vec![1, 60 + n, 70, 2, 4, 80, 2],
        marker_pos: vec![4],
        qtype: QType::Noul,
        layout: None,
    };
    let policy = Policy {
        fixed_deadline: Some(Duration::from_millis(1500)),
        load_allowance: Duration::ZERO,
        ..Policy::default()
    };
    // Three questions side by side on three contexts (each run 300 ms, so each context takes
    // one); every worker's third run hangs while the other two contexts answer.
    let env = [("FAKE_RKNN_HANG_ON_RUN", "3"), ("FAKE_RKNN_LATENCY_MS", "300")];
    let engine = Engine::start(EngineConfig::new(policy, rknn_worker(&bundle, &lib, &env)));
    // Bounded so that a hang the watchdog misses fails the test instead of hanging it.
    let result = tokio::time::timeout(Duration::from_secs(60), engine.run(vec![row(0), row(1), row(2)], None)).await;
    let result = result.expect("refused, not left hanging");
    assert!(matches!(result, Err(EngineError::Quarantined(_))), "{result:?}");
    let reasons: Vec<&str> = engine.restarts().iter().map(|r| r.reason.label()).collect();
    assert_eq!(reasons, ["deadline", "deadline"]);
    // The worker after them answers two questions (its first two runs).
    let out = engine.run(vec![row(3), row(4)], None).await.expect("answered by a fresh worker");
    assert_eq!(out.rows.len(), 2);
}

/// A request over a long state with a question of `options` choices and a plain one, as a
/// JSON line; `max_len` as given.
fn mixed_request(options: usize, max_len: Option<i64>) -> String {
    let labels: Vec<String> = (0..options).map(|i| format!("\"label {i}\"")).collect();
    let state = json::to_string(&Value::Str("The app crashes when I log in. ".repeat(200)), json::Style::COMPACT);
    let max_len = max_len.map(|m| format!(r#", "max_len": {m}"#)).unwrap_or_default();
    format!(
        r#"{{"id": "mixed", "state": {state}, "questions": {{"ok": {{"type": "noul", "instructions": "Is this a bug report?"}}, "many": {{"type": "choice", "instructions": "Which label?", "criteria": [{}]}}}}{max_len}}}"#,
        labels.join(", ")
    ) + "\n"
}

#[test]
fn a_question_with_more_options_than_marker_slots_is_too_large_in_place_and_the_others_are_answered() {
    let lib = fake_library();
    let bundle = bundle_dir("mixed", "bpe-t5");
    // 65 options (the graphs have 64 slots) and a max_len far above the longest graph's 512:
    // both used to fail the whole request as `internal`.
    let input = mixed_request(65, Some(1_000_000));
    let rknn = run_predict(&bundle, "rknn", &input, &[("RKNN_LIB", &lib)]);
    // The CPU backend on the same bundle lays out the same rows.
    let cpu = run_predict(&bundle, "cpu", &input, &[]);
    let answers = rknn[0].get("answers").unwrap_or_else(|| panic!("no answers: {}", text(&rknn[0])));
    let many = answers.get("many").and_then(|a| a.get("error")).expect("an error in place of 'many'");
    assert_eq!(many.get("code"), Some(&Value::from("too_large")));
    let message = many.get("message").and_then(Value::as_str).unwrap_or("");
    assert!(message.contains("65 options") && message.contains("64 option slots"), "{message}");
    assert_eq!(rknn[0].get("usage").and_then(|u| u.get("input_tokens")), Some(&Value::int(512)), "one row of 512");
    assert_answers_close(
        answers.get("ok").expect("ok"),
        cpu[0].get("answers").and_then(|a| a.get("ok")).expect("cpu ok"),
        &RKNN,
        "ok",
    );
}

/// The agent's settings for the RKNN backend on `bundle` with the fake runtime `lib`.
fn rknn_config(bundle: &Path, lib: &Path) -> laya_edge::config::Config {
    let mut config = laya_edge::config::Config::default();
    config.model.dir = bundle.to_path_buf();
    config.engine.backend = laya_edge::config::BackendKind::Rknn;
    config.rknn.library = Some(lib.to_path_buf());
    config
}

fn kill_9(pid: u32) {
    let status = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().expect("kill");
    assert!(status.success());
}

const CONSTANT: (&str, &str) = ("FAKE_RKNN_CONSTANT_OUTPUT", "1");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constant_output_rknn_runtime_fails_every_workers_health_call_and_the_refusal_says_so() {
    let lib = fake_library();
    let bundle = bundle_dir("constant-health", "bpe-small");
    let config = rknn_config(&bundle, &lib);
    let host = laya_edge::bundle::HostBundle::load(&bundle).expect("bundle");
    // As serve builds it: all defaults, the health call of two different rows of the model.
    let mut engine_config =
        laya_edge::engine::EngineConfig::from_config(Path::new(env!("CARGO_BIN_EXE_laya-edge")), &config, &host)
            .expect("config");
    assert_eq!(engine_config.health.len(), 2);
    engine_config.primary.env.push((CONSTANT.0.into(), CONSTANT.1.into()));
    let engine = Engine::start(engine_config);
    let row = Row { input_ids: vec![1, 60, 70, 2, 4, 80, 2], marker_pos: vec![4], qtype: QType::Noul, layout: None };
    let result = engine.run(vec![row], None).await;
    assert!(matches!(&result, Err(EngineError::Unavailable(m)) if m.contains("constant output")), "{result:?}");
    let restarts = engine.restarts();
    // The third failed health call in a row degrades (issue #31; it was the sixth restart).
    assert_eq!(restarts.len(), 3, "{restarts:?}");
    assert!(restarts.iter().all(|r| r.reason.describe().contains("constant output")), "{restarts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constant_output_rknn_runtime_is_caught_on_a_new_workers_first_row_after_a_kill_9() {
    let lib = fake_library();
    let bundle = bundle_dir("constant-restart", "bpe-small");
    let config = rknn_config(&bundle, &lib);
    // No health call: nothing but the answers themselves can show the runtime is constant.
    let engine = Engine::start(EngineConfig::new(
        laya_edge::engine::Policy::from_config(&config, false),
        rknn_worker(&bundle, &lib, &[CONSTANT]),
    ));
    let first = Row { input_ids: vec![1, 60, 70, 2, 4, 80, 2], marker_pos: vec![4], qtype: QType::Noul, layout: None };
    let other = Row { input_ids: vec![1, 61, 71, 2, 4, 81, 2], ..first.clone() };
    // Worker 1's first row: nothing to compare with yet, so it is answered.
    engine.run(vec![first], None).await.expect("the first row is answered");
    let pid = engine.status().worker_pid.expect("a worker");
    kill_9(pid);
    let mut restarted = false;
    for _ in 0..500 {
        let s = engine.status();
        if engine.restart_total() == 1 && s.worker_pid.is_some_and(|p| p != pid) {
            restarted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(restarted, "{:?}", engine.status());
    // The new worker's first row, a different one, comes back with the same bits: caught by the
    // evidence the agent kept across workers, never answered.
    let result = engine.run(vec![other], None).await;
    match &result {
        Err(EngineError::Quarantined(m) | EngineError::Unavailable(m)) => assert!(m.contains("constant output"), "{m}"),
        other => panic!("answered with the constant vector: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Bundles (issue #14): assembled by `laya-edge bundle` from graphs and their descriptions, and
// the probe on the fake runtime, healthy and constant.
// ---------------------------------------------------------------------------------------------

/// Fake graphs of 128 and 512 tokens over the demo checkpoint, each with the description
/// tools/rknn writes beside a graph (`<stem>.json`: seq_len, marker_slots).
fn fake_graphs(name: &str) -> (PathBuf, Vec<PathBuf>) {
    let dir = temp_dir(&format!("rknn-graphs-{name}"));
    let ckpt = std::path::absolute(Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo")).expect("path");
    let ckpt_json = json::to_string(&Value::Str(ckpt.display().to_string()), json::Style::COMPACT);
    let mut files = Vec::new();
    for l in [128, 512] {
        let file = dir.join(format!("g{l}.rknn"));
        std::fs::write(
            &file,
            format!(r#"{{"fake_rknn_graph": 1, "checkpoint": {ckpt_json}, "seq_len": {l}, "marker_slots": 64}}"#),
        )
        .expect("graph");
        std::fs::write(
            dir.join(format!("g{l}.json")),
            format!(r#"{{"seq_len": {l}, "marker_slots": 64, "target": "rk3588", "dtype": "fp16"}}"#),
        )
        .expect("description");
        files.push(file);
    }
    (ckpt, files)
}

/// `laya-edge bundle --rknn` over [`fake_graphs`].
fn assembled_bundle(name: &str) -> PathBuf {
    let (ckpt, files) = fake_graphs(name);
    let out = temp_dir(&format!("rknn-assembled-{name}")).join("bundle");
    let mut args: Vec<OsString> =
        vec!["bundle".into(), "--checkpoint".into(), ckpt.into(), "--out".into(), out.clone().into()];
    for f in files {
        args.push("--rknn".into());
        args.push(f.into());
    }
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let (_, err, ok) = run_cli(&args, &[], "");
    assert!(ok, "bundle failed: {err}");
    out
}

fn probe_cli(bundle: &Path, lib: &Path, env: &[(&str, &Path)]) -> (String, String, bool) {
    let config = temp_dir("rknn-probe-config").join("laya-edge.toml");
    std::fs::write(&config, format!("[rknn]\nlibrary = \"{}\"\n", lib.display())).expect("config");
    let args = [
        std::ffi::OsStr::new("probe"),
        "--model".as_ref(),
        bundle.as_os_str(),
        "--backend".as_ref(),
        "rknn".as_ref(),
        "--config".as_ref(),
        config.as_os_str(),
    ];
    run_cli(&args, env, "")
}

#[test]
fn an_assembled_rknn_bundle_describes_its_graphs_checks_and_passes_its_probe_on_the_fake_runtime() {
    let lib = fake_library();
    let bundle = assembled_bundle("round-trip");
    let m = json::parse(&std::fs::read(bundle.join("laya-bundle.json")).expect("manifest"), ParseOptions::default())
        .expect("json");
    assert_eq!(m.get("backend"), Some(&Value::from("rknn")));
    let graphs = m.get("graphs").and_then(Value::as_array).expect("graphs");
    let shapes: Vec<(i64, i64)> = graphs
        .iter()
        .map(|g| {
            (g.get("seq_len").and_then(Value::as_i64).unwrap(), g.get("marker_slots").and_then(Value::as_i64).unwrap())
        })
        .collect();
    assert_eq!(shapes, [(128, 64), (512, 64)]);
    assert_eq!(m.get("runtime_allowlist"), Some(&Value::Array(vec!["2.3.2".into()])));
    let files = m.get("files").and_then(Value::as_object).expect("files");
    assert!(files.contains_key("graphs/g128.rknn") && files.contains_key("graphs/g512.rknn"), "{files:?}");
    let args = [std::ffi::OsStr::new("check"), "--model".as_ref(), bundle.as_os_str()];
    let (out, err, ok) = run_cli(&args, &[], "");
    assert!(ok, "check: {err}");
    assert!(out.contains("rknn bundle, 2 graph(s)"), "{out}");
    let (out, err, ok) = probe_cli(&bundle, &lib, &[]);
    assert!(ok, "the probe failed on the healthy fake: {out} {err}");
    assert!(out.starts_with("rknn on "), "{out}");
}

#[test]
fn the_probe_command_fails_on_a_constant_output_runtime_and_says_why() {
    let lib = fake_library();
    let bundle = assembled_bundle("constant-cli");
    let one = Path::new("1");
    let (out, err, ok) = probe_cli(&bundle, &lib, &[(CONSTANT.0, one)]);
    assert!(!ok, "the probe passed a constant runtime: {out}");
    // The health call's constant-output check or the probe's collapse check, whichever sees it.
    assert!(err.contains("constant output") || err.contains("collapsed"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_a_constant_output_runtime_publishes_probe_failed_with_the_figures_and_the_fallback_answers() {
    let lib = fake_library();
    let bundle = assembled_bundle("constant-serve");
    let broker = Broker::start("rknn-probe-failed", "");
    let dir = temp_dir("rknn-probe-failed-agent");
    let config = dir.join("laya-edge.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt]\nbroker = \"{}\"\ndevice = \"rk-probe\"\ntelemetry_interval_s = 1\n[model]\ndir = \"{}\"\n\
             [engine]\nbackend = \"rknn\"\nfallback = \"cpu\"\nmax_restarts = 1\n[rknn]\nlibrary = \"{}\"\n",
            broker.url(),
            bundle.display(),
            lib.display()
        ),
    )
    .expect("config");
    let mut c = Client::connect(broker.port, "rk-probe-watch").await;
    c.subscribe("laya/v1/rk-probe/events").await;
    let _agent = Agent::with_config(config, vec![(CONSTANT.0.into(), CONSTANT.1.into())]);
    // Every new worker's health call runs the probe: the first worker fails it, with figures.
    let event = loop {
        let p = c.next(Duration::from_secs(60)).await.expect("a probe_failed event");
        let v = decode(&p);
        if v.get("event") == Some(&Value::from("probe_failed")) {
            break v;
        }
    };
    let probe = event.get("probe").expect("the figures");
    assert_eq!(probe.get("backend"), Some(&Value::from("rknn")), "{event:?}");
    assert_eq!(probe.get("passed"), Some(&Value::Bool(false)));
    // The worker's own guard stops a constant runtime within the probe rows, so there are no
    // figures, only why.
    let verdict = probe.get("verdict").and_then(Value::as_str).unwrap_or_default();
    assert!(verdict.contains("constant output"), "{event:?}");
    assert!(probe.get("rows").and_then(Value::as_i64).unwrap_or(0) >= 24, "{probe:?}");
    // The backend degrades and the CPU fallback answers (its own probe passed).
    wait_online(broker.port, "rk-probe").await;
    let reply = ask_until_answered(broker.port, "rk-probe", "rk-probe-asker", Duration::from_secs(60)).await;
    assert_eq!(reply.get("backend"), Some(&Value::from("cpu")), "{reply:?}");
    // Telemetry carries each role's probe runs (issue #28): the fallback's pass, with its
    // figures, does not hide the primary's failure, which `probe` shows.
    let mut t = Client::connect(broker.port, "rk-probe-telemetry").await;
    t.subscribe("laya/v1/rk-probe/telemetry").await;
    let telemetry = decode(&t.next(Duration::from_secs(10)).await.expect("telemetry"));
    let fallback = telemetry.get("probes").and_then(|p| p.get("fallback")).and_then(|f| f.get("last"));
    let fallback = fallback.unwrap_or_else(|| panic!("the fallback's run: {telemetry:?}"));
    assert_eq!(fallback.get("passed"), Some(&Value::Bool(true)), "{telemetry:?}");
    assert_eq!(
        fallback.get("agree"),
        fallback.get("rows"),
        "the float model on the CPU agrees with itself: {fallback:?}"
    );
    let last = telemetry.get("probe").expect("a probe field");
    assert_eq!(last.get("role"), Some(&Value::from("primary")), "{telemetry:?}");
    assert_eq!(last.get("passed"), Some(&Value::Bool(false)), "{telemetry:?}");
    let failure = telemetry.get("probes").and_then(|p| p.get("primary")).and_then(|p| p.get("last_failure"));
    assert!(
        failure.and_then(|f| f.get("verdict")).and_then(Value::as_str).is_some_and(|v| v.contains("constant output")),
        "{telemetry:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_outside_the_bundles_allowlist_is_published_as_runtime_rejected() {
    let lib = fake_library();
    let bundle = bundle_dir("rejected", "bpe-small");
    let broker = Broker::start("rknn-rejected", "");
    let mut watch = Client::connect(broker.port, "rk-rejected-watch").await;
    watch.subscribe("laya/v1/rk-rejected/events").await;
    let config = temp_dir("rk-rejected").join("laya-edge.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt]\nbroker = \"{}\"\ndevice = \"rk-rejected\"\ntelemetry_interval_s = 0\n[model]\ndir = \"{}\"\n[engine]\nbackend = \"rknn\"\nmax_restarts = 0\n[rknn]\nlibrary = \"{}\"\n",
            broker.url(),
            bundle.display(),
            lib.display()
        ),
    )
    .expect("config");
    // The release that loads the graph and answers a constant vector: not in the allowlist (2.3.2).
    let _agent = Agent::with_config(config, vec![("FAKE_RKNN_SDK_VERSION".into(), "2.4.2 (fake)".into())]);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    let rejected = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let p = watch.next(left).await.unwrap_or_else(|| panic!("no runtime_rejected event: {seen:?}"));
        let v = decode(&p);
        if v.get("event") == Some(&Value::from("runtime_rejected")) {
            break v;
        }
        seen.push(v);
    };
    let message = rejected.get("message").and_then(Value::as_str).unwrap_or_default();
    assert!(message.contains("refusing RKNN runtime \"2.4.2 (fake)\"") && message.contains("2.3.2"), "{rejected:?}");
    assert_eq!(rejected.get("reason"), Some(&Value::from("load_failed")));
    assert_eq!(rejected.get("role"), Some(&Value::from("primary")));
    // The restart it came with says the same.
    assert!(seen.iter().any(|v| v.get("event") == Some(&Value::from("worker_restart"))), "{seen:?}");
}
