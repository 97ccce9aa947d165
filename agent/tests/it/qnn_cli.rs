//! The QNN backend through the agent's own front ends on Qualcomm's x86-64 HTP simulator (the
//! `libQnnHtp.so` of the `onnxruntime-qnn` wheel, fetched by tools/qnn/fetch-runtime.sh) with the
//! committed V68 context binaries: `predict --backend qnn` and `serve` with `backend = "qnn"`,
//! each against the CPU backend on the same checkpoint. The worker process loads the runtime.
//!
//! Tolerances: every clear decision the CPU's, and every probability within what these requests
//! were measured at on the simulator ([`QNN`]); tests/conformance/it/qnn.rs measures every fitting
//! fixture case (up to 0.07 there, on other models).
//!
//! The tests that need the simulator libraries (`LAYA_QNN_LIB_DIR`, else `target/qnn-runtime`)
//! are `#[ignore]`d with that reason: listed as ignored by a plain `cargo test`, run by
//! `--include-ignored` (tools/test.sh fetches the libraries and does), failed when run without
//! them. What the simulator cannot do on demand (hang, fail) the watchdog test does with the fake
//! runtime (tests/fake-qnn).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::*;
use laya_edge::config::BackendKind;
use laya_edge::engine::{Engine, EngineConfig, EngineError, WorkerSpec};
use laya_edge::engine::{Policy, RestartReason};
use laya_edge::prompt::{QType, Row};
use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};
use laya_topics::wire::Encoding;
use test_kit::{build_fake_library, qnn_simulator, workspace};

/// Measured on the simulator (QNN 2.51, these binaries, deterministic from run to run): the
/// largest probability difference from the CPU backend is 0.0350 over the 12 bpe-t5 requests of
/// `predict` (the first of them, through `serve`, too) and 0.0254 for the mixed request's
/// answered question. The limit is that plus one unit of an answer's fourth digit.
const QNN: Closeness = Closeness { tol: 0.0351, clear_gap: 0.02, skip: &[] };

/// The checkpoint the fixture binaries of `model` were built from.
fn checkpoint(model: &str) -> PathBuf {
    std::path::absolute(workspace().join(format!("tests/fixtures/qnn/{model}/checkpoint"))).expect("path")
}

/// A QNN bundle of the committed binaries of `model`: 128 tokens with UFIXED_POINT_16 I/O and
/// 256 tokens with float I/O.
fn bundle_dir(name: &str, model: &str) -> PathBuf {
    let dir = temp_dir(&format!("qnn-bundle-{name}"));
    let fx = std::path::absolute(workspace().join(format!("tests/fixtures/qnn/{model}"))).expect("path");
    let s = |p: &Path| json::to_string(&Value::Str(p.display().to_string()), json::Style::COMPACT);
    std::fs::write(
        dir.join("laya-bundle.json"),
        format!(
            r#"{{"backend": "qnn", "checkpoint": {}, "allow_minmax_above_128": true, "graphs": [
                {{"file": {}, "seq_len": 128, "calibration": "min-max", "io": "ufixed16"}},
                {{"file": {}, "seq_len": 256, "calibration": "min-max", "io": "float"}}]}}"#,
            s(&checkpoint(model)),
            s(&fx.join("enc_L128_u16io_ctx_qnn.bin")),
            s(&fx.join("enc_L256_f32io_ctx_qnn.bin"))
        ),
    )
    .expect("manifest");
    dir
}

/// A configuration that runs `bundle` on the simulator libraries in `libs`: the [qnn] keys reach
/// predict's worker through --config.
fn simulator_config(bundle: &Path, libs: &Path) -> String {
    format!(
        "[model]\ndir = \"{}\"\n[engine]\nbackend = \"qnn\"\n[qnn]\nbackend_lib = \"{}\"\nsystem_lib = \"{}\"\n",
        bundle.display(),
        libs.join("libQnnHtp.so").display(),
        libs.join("libQnnSystem.so").display()
    )
}

#[test]
#[ignore = "needs the QNN HTP simulator (LAYA_QNN_LIB_DIR, tools/qnn/fetch-runtime.sh): --include-ignored runs it, as tools/test.sh does"]
fn predict_with_the_qnn_backend_on_the_simulator_agrees_with_the_cpu_backend() {
    let libs = qnn_simulator();
    let bundle = bundle_dir("predict", "bpe-t5");
    let input = fixture_requests("bpe-t5", 12, 256);
    let config = simulator_config(&bundle, &libs);
    let qnn = run_predict_with_config(&config, &input);
    let cpu = run_predict(&checkpoint("bpe-t5"), "cpu", &input, &[]);
    assert_eq!(qnn.len(), 12);
    assert_eq!(cpu.len(), 12);
    // Every request answered, as on the CPU (measured: 12 of 12 both).
    for (i, (a, b)) in qnn.iter().zip(&cpu).enumerate() {
        assert!(a.get("answers").is_some() && b.get("answers").is_some(), "line {i}: {a:?} / cpu {b:?}");
    }
    let mut worst = 0.0f64;
    for (i, (a, b)) in qnn.iter().zip(&cpu).enumerate() {
        worst = worst.max(assert_answers_close(a, b, &QNN, &format!("line {i}")));
    }
    eprintln!("predict on the simulator: 12 of 12 answered, max |dp| against the CPU {worst:.4}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the QNN HTP simulator (LAYA_QNN_LIB_DIR, tools/qnn/fetch-runtime.sh): --include-ignored runs it, as tools/test.sh does"]
async fn serve_with_the_qnn_backend_on_the_simulator_answers_over_mqtt() {
    let libs = qnn_simulator();
    let bundle = bundle_dir("serve", "bpe-t5");
    let broker = Broker::start("qnn-serve", "");
    let settings = format!(
        "[model]\ndir = \"{}\"\n[engine]\nbackend = \"qnn\"\n\
         [qnn]\nbackend_lib = \"{}\"\nsystem_lib = \"{}\"\nperformance = \"burst\"\n",
        bundle.display(),
        libs.join("libQnnHtp.so").display(),
        libs.join("libQnnSystem.so").display()
    );
    let _agent = Agent::start(&broker, "qcs1", &settings);
    wait_online(broker.port, "qcs1").await;
    let mut c = Client::connect(broker.port, "qcs-asker").await;
    c.subscribe("laya/v1/reply/qcs-asker/#").await;
    let line = fixture_requests("bpe-t5", 1, 256);
    let request = json::parse_str(line.trim(), ParseOptions::default()).expect("json");
    c.ask("laya/v1/qcs1/ask", Encoding::Json.encode(&request), Some("laya/v1/reply/qcs-asker/x"), None, Encoding::Json)
        .await;
    let reply = decode(&c.next(Duration::from_secs(120)).await.expect("a reply"));
    assert_eq!(reply.get("backend"), Some(&Value::from("qnn")), "{reply:?}");
    let cpu = run_predict(&checkpoint("bpe-t5"), "cpu", &line, &[]);
    let worst = assert_answers_close(
        reply.get("answers").expect("answers"),
        cpu[0].get("answers").expect("answers"),
        &QNN,
        "answers",
    );
    eprintln!("serve on the simulator: max |dp| against the CPU {worst:.4}");
    // The retained status names the QAIRT build the worker loaded.
    c.subscribe("laya/v1/qcs1/status").await;
    let status = decode(&c.next(Duration::from_secs(10)).await.expect("the retained status"));
    let runtime = status.get("runtime").and_then(Value::as_str).unwrap_or_default();
    assert!(!runtime.is_empty() && !runtime.contains(char::is_whitespace), "a build id: {status:?}");
}

/// A bundle of one fake graph (128 tokens, float I/O) over the fixture checkpoint `model`.
fn fake_bundle(name: &str, model: &str) -> PathBuf {
    let dir = temp_dir(&format!("qnn-fake-{name}"));
    let ckpt = std::path::absolute(workspace().join("tests/fixtures/laya-0.3.20/models").join(model)).expect("path");
    let ckpt = json::to_string(&Value::Str(ckpt.display().to_string()), json::Style::COMPACT);
    std::fs::write(
        dir.join("enc_128.fake.bin"),
        format!(
            r#"{{"fake_qnn_binary": 1, "checkpoint": {ckpt}, "seq_len": 128, "graph_name": "enc_128", "tensor_suffix": ""}}"#
        ),
    )
    .expect("binary");
    std::fs::write(
        dir.join("laya-bundle.json"),
        format!(
            r#"{{"backend": "qnn", "checkpoint": {ckpt}, "graphs": [{{"file": "enc_128.fake.bin", "seq_len": 128, "calibration": "min-max", "io": "float"}}]}}"#
        ),
    )
    .expect("manifest");
    dir
}

/// The agent's QNN worker on `bundle` with both `[qnn]` libraries `lib`, plus the fake runtime's
/// knobs.
fn qnn_worker(bundle: &Path, lib: &Path, env: &[(&str, &str)]) -> WorkerSpec {
    let mut config = laya_edge::config::Config::default();
    config.model.dir = bundle.to_path_buf();
    config.qnn.backend_lib = Some(lib.to_path_buf());
    config.qnn.system_lib = Some(lib.to_path_buf());
    let program = test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge"));
    let mut spec = laya_edge::engine::spec::worker_spec(&program, BackendKind::Qnn, &config).expect("spec");
    spec.env.extend(env.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))));
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_or_failing_qnn_runtime_is_restarted_by_the_watchdog_and_a_recovered_restart_is_retried_in_place() {
    let lib = build_fake_library("fake-qnn", "fake_qnn");
    let bundle = fake_bundle("watchdog", "bpe-small");
    let row = Row { input_ids: vec![1, 60, 70, 2, 4, 80, 2], marker_pos: vec![4], qtype: QType::Noul, layout: None };
    let policy = Policy {
        fixed_deadline: Some(Duration::from_millis(3000)),
        load_allowance: Duration::ZERO,
        ..Policy::default()
    };
    let start = |env: &[(&str, &str)]| Engine::start(EngineConfig::new(policy.clone(), qnn_worker(&bundle, &lib, env)));

    // Healthy: answered by the worker, no restart.
    let engine = start(&[]);
    let ok = engine.run(vec![row.clone()], None).await.expect("answered");
    assert_eq!(ok.rows[0].logits.len(), 1);
    assert_eq!(engine.status().backend.as_deref(), Some("qnn"));
    assert!(engine.restarts().is_empty());

    // Every worker hangs in graphExecute: killed at the deadline, restarted, killed again.
    let engine = start(&[("FAKE_QNN_HANG_ON_EXECUTE", "1")]);
    assert!(matches!(engine.run(vec![row.clone()], None).await, Err(EngineError::Quarantined(_))));
    let reasons: Vec<&str> = engine.restarts().iter().map(|r| r.reason.label()).collect();
    assert_eq!(reasons, ["deadline", "deadline"]);

    // 1011 (subsystem restart, not recovered) on each worker's first execute: the fatal path,
    // the worker replaced and the call re-run once.
    let engine = start(&[("FAKE_QNN_EXECUTE_ERROR", "1011"), ("FAKE_QNN_EXECUTE_ERROR_ON", "1")]);
    assert!(matches!(engine.run(vec![row.clone()], None).await, Err(EngineError::Quarantined(_))));
    let restarts = engine.restarts();
    assert_eq!(restarts.len(), 2);
    assert!(restarts.iter().all(|r| matches!(r.reason, RestartReason::Fatal { code: Some(1011), .. })), "{restarts:?}");

    // 1007 (subsystem restart, recovered) on the first execute: retried in the same worker.
    let engine = start(&[("FAKE_QNN_EXECUTE_ERROR", "1007"), ("FAKE_QNN_EXECUTE_ERROR_ON", "1")]);
    let again = engine.run(vec![row.clone()], None).await.expect("answered after the retry");
    assert_eq!(again.rows, ok.rows);
    assert!(engine.restarts().is_empty(), "{:?}", engine.restarts());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graph_shipped_as_a_dlc_is_compiled_once_by_the_configured_generator_and_cached() {
    let lib = build_fake_library("fake-qnn", "fake_qnn");
    // The bundle ships a "DLC" (for the fake runtime, its binary) and no context binary.
    let bundle = fake_bundle("dlc", "bpe-small");
    std::fs::rename(bundle.join("enc_128.fake.bin"), bundle.join("enc_128.dlc")).expect("dlc");
    let manifest = std::fs::read_to_string(bundle.join("laya-bundle.json")).expect("manifest");
    let manifest =
        manifest.replace(r#""file": "enc_128.fake.bin","#, r#""file": "enc_128.fake.bin", "dlc": "enc_128.dlc","#);
    std::fs::write(bundle.join("laya-bundle.json"), manifest).expect("manifest");
    // A stand-in for qnn-context-binary-generator: logs its arguments, "compiles" by copying.
    let dir = temp_dir("qnn-generator");
    let log = dir.join("generator.log");
    let generator = dir.join("qnn-context-binary-generator");
    std::fs::write(
        &generator,
        format!(
            "#!/bin/sh\necho \"$@\" >> '{}'\nwhile [ $# -gt 0 ]; do case \"$1\" in\n  --dlc_path) dlc=$2;;\n  \
             --binary_file) name=$2;;\n  --output_dir) out=$2;;\nesac; shift; done\ncp \"$dlc\" \"$out/$name.bin\"\n",
            log.display()
        ),
    )
    .expect("generator");
    std::fs::set_permissions(&generator, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let state = dir.join("state");
    let broker = Broker::start("qnn-dlc", "");
    let settings = format!(
        "[model]\ndir = \"{}\"\n[engine]\nbackend = \"qnn\"\n\
         [qnn]\nbackend_lib = \"{lib}\"\nsystem_lib = \"{lib}\"\ngenerator = \"{}\"\n\
         model_lib = \"/opt/qairt/lib/libQnnModelDlc.so\"\nstate_dir = \"{}\"\nsoc = \"qcm6490\"\n",
        bundle.display(),
        generator.display(),
        state.display(),
        lib = lib.display(),
    );
    let mut c = Client::connect(broker.port, "dlc-asker").await;
    c.subscribe("laya/v1/reply/dlc-asker/#").await;
    let mut agent = Agent::start(&broker, "qcs-dlc", &settings);
    for run in ["generated", "cached"] {
        if run == "cached" {
            agent.launch();
        }
        wait_online(broker.port, "qcs-dlc").await;
        c.ask(
            "laya/v1/qcs-dlc/ask",
            Encoding::Json.encode(&request(run)),
            Some(&format!("laya/v1/reply/dlc-asker/{run}")),
            None,
            Encoding::Json,
        )
        .await;
        let reply = decode(&c.next(Duration::from_secs(60)).await.expect("a reply"));
        assert_eq!(reply.get("backend"), Some(&Value::from("qnn")), "{run}: {reply:?}");
        assert!(reply.get("answers").is_some(), "{run}: {reply:?}");
        assert!(agent.terminate().success(), "{run}");
    }
    let calls = std::fs::read_to_string(&log).expect("the generator ran");
    assert_eq!(calls.lines().count(), 1, "generated once, then loaded from the cache: {calls}");
    assert!(
        calls.contains(&format!(
            "--backend {} --model /opt/qairt/lib/libQnnModelDlc.so --dlc_path {}",
            lib.display(),
            bundle.join("enc_128.dlc").display()
        )),
        "{calls}"
    );
    let cached: Vec<PathBuf> = std::fs::read_dir(state.join("qnn-context"))
        .expect("the cache")
        .flatten()
        .map(|build| build.path().join("qcm6490/enc_128.bin"))
        .filter(|p| p.is_file())
        .collect();
    assert_eq!(cached.len(), 1, "one binary, keyed by the runtime's build id and the configured SoC");
    assert_eq!(
        std::fs::read(&cached[0]).expect("cached"),
        std::fs::read(bundle.join("enc_128.dlc")).expect("dlc"),
        "the generator's output"
    );
}

#[test]
#[ignore = "needs the QNN HTP simulator (LAYA_QNN_LIB_DIR, tools/qnn/fetch-runtime.sh): --include-ignored runs it, as tools/test.sh does"]
fn on_a_128_256_bundle_rows_are_cut_to_256_and_a_question_that_cannot_fit_is_too_large_in_place() {
    let libs = qnn_simulator();
    let bundle = bundle_dir("mixed", "bpe-t5");
    let labels: Vec<String> = (0..70).map(|i| format!("\"label {i}\"")).collect();
    let state = json::to_string(&Value::Str("The app crashes when I log in. ".repeat(200)), json::Style::COMPACT);
    // No max_len: the checkpoint's 512, which used to make rows of 512 tokens that fit no graph
    // and fail the whole request. 70 options need more than the 256 tokens of the longest graph.
    let input = format!(
        r#"{{"id": "mixed", "state": {state}, "questions": {{"ok": {{"type": "noul", "instructions": "Is this a bug report?"}}, "many": {{"type": "choice", "instructions": "Which label?", "criteria": [{}]}}}}}}"#,
        labels.join(", ")
    ) + "\n";
    let config = simulator_config(&bundle, &libs);
    let qnn = run_predict_with_config(&config, &input);
    let cpu = run_predict(&bundle, "cpu", &input, &[]);
    let answers = qnn[0].get("answers").unwrap_or_else(|| panic!("no answers: {}", text(&qnn[0])));
    let many = answers.get("many").and_then(|a| a.get("error")).expect("an error in place of 'many'");
    assert_eq!(many.get("code"), Some(&Value::from("too_large")), "{}", text(many));
    assert_eq!(qnn[0].get("usage").and_then(|u| u.get("input_tokens")), Some(&Value::int(256)), "one row of 256");
    let worst = assert_answers_close(
        answers.get("ok").expect("ok"),
        cpu[0].get("answers").and_then(|a| a.get("ok")).expect("cpu ok"),
        &QNN,
        "ok",
    );
    eprintln!("the mixed request on the simulator: max |dp| against the CPU {worst:.4}");
}

/// The fake runs the CPU reference's encoder behind the QNN C API; the host steps (embeddings,
/// masks, head) are the QNN backend's own.
const FAKE_QNN: Closeness = Closeness { tol: 1e-4, clear_gap: 0.0, skip: &[] };

#[test]
fn predict_with_the_qnn_backend_on_the_fake_runtime_gives_the_cpu_answers() {
    let lib = build_fake_library("fake-qnn", "fake_qnn");
    let bundle = fake_bundle("predict", "bpe-small");
    let input = fixture_requests("bpe-small", 25, 128);
    // Both [qnn] libraries are the fake; they reach predict's worker through --config.
    let config = format!(
        "[model]\ndir = \"{}\"\n[engine]\nbackend = \"qnn\"\n[qnn]\nbackend_lib = \"{lib}\"\nsystem_lib = \"{lib}\"\n",
        bundle.display(),
        lib = lib.display()
    );
    let qnn = run_predict_with_config(&config, &input);
    let model = workspace().join("tests/fixtures/laya-0.3.20/models/bpe-small");
    let cpu = run_predict(&model, "cpu", &input, &[]);
    assert_eq!(qnn.len(), 25);
    for (i, (a, b)) in qnn.iter().zip(&cpu).enumerate() {
        assert_answers_close(a, b, &FAKE_QNN, &format!("line {i}"));
    }
}

// ---------------------------------------------------------------------------------------------
// Bundles (issue #14) on the simulator: `laya-edge bundle` reads the binaries themselves, and the
// probe holds the backend to the float model.
// ---------------------------------------------------------------------------------------------

fn demo_checkpoint() -> PathBuf {
    std::path::absolute(workspace().join("models/demo")).expect("path")
}

/// `laya-edge bundle --qnn ...` of the demo model's binaries; `extra` flags added.
fn assembled_demo_bundle(name: &str, binaries: &[PathBuf], libs: &Path, extra: &[&str]) -> PathBuf {
    let out = temp_dir(&format!("qnn-assembled-{name}")).join("bundle");
    let mut args: Vec<OsString> = vec![
        "bundle".into(),
        "--checkpoint".into(),
        demo_checkpoint().into(),
        "--out".into(),
        out.clone().into(),
        "--qnn-system-lib".into(),
        libs.join("libQnnSystem.so").into(),
    ];
    for b in binaries {
        args.push("--qnn".into());
        args.push(b.into());
    }
    args.extend(extra.iter().map(OsString::from));
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let (_, err, ok) = run_cli(&args, &[], "");
    assert!(ok, "bundle failed: {err}");
    out
}

fn demo_binary(file: &str) -> PathBuf {
    std::path::absolute(workspace().join("tests/fixtures/qnn/demo").join(file)).expect("path")
}

/// `laya-edge probe --backend qnn` on the simulator.
fn probe_on_simulator(bundle: &Path, libs: &Path) -> (String, String, bool) {
    let config = temp_dir("qnn-probe-config").join("laya-edge.toml");
    std::fs::write(&config, simulator_config(bundle, libs)).expect("config");
    let args = [std::ffi::OsStr::new("probe"), "--config".as_ref(), config.as_os_str()];
    run_cli(&args, &[], "")
}

#[test]
#[ignore = "needs the QNN HTP simulator (LAYA_QNN_LIB_DIR, tools/qnn/fetch-runtime.sh): --include-ignored runs it, as tools/test.sh does"]
fn an_assembled_qnn_bundle_reads_its_graphs_from_the_binaries_and_its_probe_judges_each_graph_on_the_simulator() {
    let libs = qnn_simulator();
    let binaries = [demo_binary("enc_L128_u16io_ctx_qnn.bin"), demo_binary("enc_L256_f32io_ctx_qnn.bin")];
    // Min-max with the masks clipped (their descriptions say so): usable at 256 without a flag.
    let bundle = assembled_demo_bundle("round-trip", &binaries, &libs, &[]);
    let m = json::parse(&std::fs::read(bundle.join("laya-bundle.json")).expect("manifest"), ParseOptions::default())
        .expect("json");
    let graphs = m.get("graphs").and_then(Value::as_array).expect("graphs");
    // Read from the binaries, not typed by hand: lengths, I/O flavour, quantization.
    let got: Vec<(i64, &str)> = graphs
        .iter()
        .map(|g| (g.get("seq_len").and_then(Value::as_i64).unwrap(), g.get("io").and_then(Value::as_str).unwrap()))
        .collect();
    assert_eq!(got, [(128, "ufixed16"), (256, "float")]);
    for g in graphs {
        assert_eq!(g.get("calibration"), Some(&Value::from("min-max")), "from the description beside it: {g:?}");
        assert!(
            g.get("mask_clip").and_then(|c| if let Value::Float(f) = c { Some(*f) } else { None }).is_some(),
            "{g:?}"
        );
    }
    let host = laya_edge::bundle::HostBundle::load(&bundle).expect("bundle");
    assert_eq!(host.capacity.limits.max_len, 256, "the clipped 256 graph is usable");
    let embeds = &graphs[0].get("tensors").and_then(Value::as_array).expect("tensors")[0];
    assert_eq!(embeds.get("data_type"), Some(&Value::from("ufixed16")));
    assert!(embeds.get("offset").and_then(Value::as_i64).is_some() && embeds.get("scale").is_some(), "{embeds:?}");
    let allow = m.get("runtime_allowlist").and_then(Value::as_array).expect("allowlist");
    assert_eq!(allow.len(), 1, "the QAIRT release the binaries name: {allow:?}");
    let args = [std::ffi::OsStr::new("check"), "--model".as_ref(), bundle.as_os_str()];
    let (out, err, ok) = run_cli(&args, &[], "");
    assert!(ok && out.contains("qnn bundle, 2 graph(s)"), "{out} {err}");
    // Each graph is judged on its own rows (issue #28): the 128 graph passes; the committed 256
    // graph was calibrated on short tickets only and fails on the long rows it serves (one
    // confident decision reversed; docs/test-evidence.md, "Issue #28").
    let (out, err, ok) = probe_on_simulator(&bundle, &libs);
    assert!(out.starts_with("qnn on "), "{out} {err}");
    let line = |g: &str| out.lines().find(|l| l.trim_start().starts_with(g)).unwrap_or_else(|| panic!("{out}"));
    assert!(line("graph 128 (").ends_with(": passed"), "{out}");
    assert!(!ok && err.contains("probe failed: graph 256: ") && !err.contains("graph 128:"), "{out} {err}");
}

#[test]
#[ignore = "needs the QNN HTP simulator (LAYA_QNN_LIB_DIR, tools/qnn/fetch-runtime.sh): --include-ignored runs it, as tools/test.sh does"]
fn a_graph_without_calibration_metadata_is_treated_as_minmax_and_not_used_above_128_tokens() {
    let libs = qnn_simulator();
    // A copy of the 256-token binary without the description tools/qnn writes beside it.
    let dir = temp_dir("qnn-unlabelled");
    let bare = dir.join("enc_256.bin");
    std::fs::copy(demo_binary("enc_L256_f32io_ctx_qnn.bin"), &bare).expect("copy");
    let bundle = assembled_demo_bundle("unlabelled", &[demo_binary("enc_L128_u16io_ctx_qnn.bin"), bare], &libs, &[]);
    let m = json::parse(&std::fs::read(bundle.join("laya-bundle.json")).expect("manifest"), ParseOptions::default())
        .expect("json");
    let graphs = m.get("graphs").and_then(Value::as_array).expect("graphs");
    assert_eq!(graphs[1].get("calibration"), Some(&Value::Null), "{:?}", graphs[1]);
    let host = laya_edge::bundle::HostBundle::load(&bundle).expect("bundle");
    assert_eq!(host.capacity.limits.max_len, 128, "the unlabelled 256 graph must not raise the budget");
    let args = [std::ffi::OsStr::new("check"), "--model".as_ref(), bundle.as_os_str()];
    let (out, _, ok) = run_cli(&args, &[], "");
    assert!(ok && out.contains("will not be used"), "{out}");
}

#[test]
#[ignore = "needs the QNN HTP simulator (LAYA_QNN_LIB_DIR, tools/qnn/fetch-runtime.sh): --include-ignored runs it, as tools/test.sh does"]
fn a_truncated_context_binary_is_named_in_the_error() {
    let libs = qnn_simulator();
    let dir = temp_dir("qnn-truncated");
    let cut = dir.join("enc_128_cut.bin");
    let bytes = std::fs::read(demo_binary("enc_L128_u16io_ctx_qnn.bin")).expect("binary");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write");
    let out = temp_dir("qnn-truncated-bundle").join("bundle");
    let args: Vec<OsString> = vec![
        "bundle".into(),
        "--checkpoint".into(),
        demo_checkpoint().into(),
        "--out".into(),
        out.into(),
        "--qnn-system-lib".into(),
        libs.join("libQnnSystem.so").into(),
        "--qnn".into(),
        cut.clone().into(),
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let (_, err, ok) = run_cli(&args, &[], "");
    assert!(!ok, "a truncated binary was bundled");
    assert!(err.contains("enc_128_cut.bin") && err.contains("MALFORMED_BINARY"), "the file is not named: {err}");
    // A hand-written manifest (no sha256 to catch it first): the worker's load error names it too.
    let s = |p: &Path| json::to_string(&Value::Str(p.display().to_string()), json::Style::COMPACT);
    let hand = temp_dir("qnn-truncated-hand");
    std::fs::write(
        hand.join("laya-bundle.json"),
        format!(
            r#"{{"backend": "qnn", "checkpoint": {}, "graphs": [{{"file": {}, "seq_len": 128, "calibration": "sqnr"}}]}}"#,
            s(&demo_checkpoint()),
            s(&cut)
        ),
    )
    .expect("manifest");
    let config = temp_dir("qnn-truncated-config").join("laya-edge.toml");
    std::fs::write(
        &config,
        simulator_config(&hand, &libs).replace("backend = \"qnn\"\n", "backend = \"qnn\"\nmax_restarts = 0\n"),
    )
    .expect("config");
    let config_text = std::fs::read_to_string(&config).expect("config");
    let (out, err, _) = run_cli(
        &[std::ffi::OsStr::new("predict"), "--config".as_ref(), config.as_os_str()],
        &[],
        "{\"state\": \"x\", \"questions\": {\"q\": {\"type\": \"noul\", \"instructions\": \"ok?\"}}}\n",
    );
    assert!(out.contains("enc_128_cut.bin") || err.contains("enc_128_cut.bin"), "{config_text}\n{out}\n{err}");
}

fn broken_binary(file: &str) -> PathBuf {
    std::path::absolute(workspace().join("tests/fixtures/qnn/demo-broken").join(file)).expect("path")
}

#[test]
#[ignore = "needs the QNN HTP simulator (LAYA_QNN_LIB_DIR, tools/qnn/fetch-runtime.sh): --include-ignored runs it, as tools/test.sh does"]
fn the_probe_fails_on_a_minmax_256_binary_calibrated_without_the_mask_clip() {
    let libs = qnn_simulator();
    // The user allowed the min-max graph above 128 tokens: only the probe stands between it and
    // the board (tools/qnn/README.md: min-max calibration on the raw additive masks).
    // A probe of four requests (12 rows): every row runs the 256-token graph, slow on the simulator.
    let requests = temp_dir("qnn-minmax-requests").join("probe.jsonl");
    let built_in =
        std::fs::read_to_string(workspace().join("agent/src/engine/probe_requests.jsonl")).expect("requests");
    std::fs::write(&requests, built_in.lines().take(4).collect::<Vec<_>>().join("\n")).expect("write");
    let bundle = assembled_demo_bundle(
        "minmax-noclip",
        &[broken_binary("enc_L256_f32io_minmax_noclip_ctx_qnn.bin")],
        &libs,
        &["--allow-minmax-above-128", "--probe", requests.to_str().expect("utf-8")],
    );
    let (out, err, ok) = probe_on_simulator(&bundle, &libs);
    assert!(!ok, "the probe passed a min-max binary without the mask clip: {out}");
    assert!(err.contains("probe failed") && err.contains("agreement"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the QNN HTP simulator (LAYA_QNN_LIB_DIR, tools/qnn/fetch-runtime.sh): --include-ignored runs it, as tools/test.sh does"]
async fn serve_on_a_binary_with_a_wrong_quantization_offset_publishes_probe_failed_and_the_fallback_answers() {
    let libs = qnn_simulator();
    let bundle =
        assembled_demo_bundle("bad-offset", &[broken_binary("enc_L128_f32io_badoffset_ctx_qnn.bin")], &libs, &[]);
    // The command first: it fails with the figures.
    let (out, err, ok) = probe_on_simulator(&bundle, &libs);
    assert!(!ok, "the probe passed a binary with a wrong offset: {out}");
    assert!(out.contains("argmax") && err.contains("probe failed"), "{out} {err}");
    // The service: every new worker runs the probe with its health call.
    let broker = Broker::start("qnn-bad-offset", "");
    let settings = format!(
        "[model]\ndir = \"{}\"\n[engine]\nbackend = \"qnn\"\nfallback = \"cpu\"\nmax_restarts = 1\n\
         [qnn]\nbackend_lib = \"{}\"\nsystem_lib = \"{}\"\n",
        bundle.display(),
        libs.join("libQnnHtp.so").display(),
        libs.join("libQnnSystem.so").display()
    );
    let mut watch = Client::connect(broker.port, "qcs-bad-watch").await;
    watch.subscribe("laya/v1/qcs-bad/events").await;
    let _agent = Agent::start(&broker, "qcs-bad", &settings);
    let event = loop {
        let v = decode(&watch.next(Duration::from_secs(120)).await.expect("a probe_failed event"));
        if v.get("event") == Some(&Value::from("probe_failed")) {
            break v;
        }
    };
    let probe = event.get("probe").expect("figures");
    assert_eq!(probe.get("backend"), Some(&Value::from("qnn")), "{event:?}");
    let cosine = probe.get("mean_cosine").and_then(|v| if let Value::Float(f) = v { Some(*f) } else { None });
    assert!(cosine.is_some_and(|c| c < 0.98), "{probe:?}");
    // Degraded after the second failed worker: the CPU fallback answers.
    wait_online(broker.port, "qcs-bad").await;
    let reply = ask_until_answered(broker.port, "qcs-bad", "qcs-bad-asker", Duration::from_secs(120)).await;
    assert_eq!(reply.get("backend"), Some(&Value::from("cpu")), "a wrong binary answered: {reply:?}");
}
