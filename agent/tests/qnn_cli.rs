//! The QNN backend through the agent's own front ends on Qualcomm's x86-64 HTP simulator (the
//! `libQnnHtp.so` of the `onnxruntime-qnn` wheel, fetched by tools/qnn/fetch-runtime.sh) with the
//! committed V68 context binaries: `predict --backend qnn` and `serve` with `backend = "qnn"`,
//! each against the CPU backend on the same checkpoint. The worker process loads the runtime.
//!
//! Tolerances as in tests/qnn.rs (which measures them over every fitting fixture case): every
//! clear decision the CPU's, every probability within 0.1.
//!
//! Without the simulator libraries (`LAYA_QNN_LIB_DIR`, else `target/qnn-runtime`) the tests are
//! skipped with a loud message; CI always provides them.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};
use laya_topics::wire::Encoding;

const QNN: Closeness = Closeness { tol: 0.1, clear_gap: 0.02, skip: &[] };

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn simulator() -> Option<PathBuf> {
    let dir = std::env::var_os("LAYA_QNN_LIB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target").join("qnn-runtime"));
    if dir.join("libQnnHtp.so").is_file() && dir.join("libQnnSystem.so").is_file() {
        return Some(dir);
    }
    eprintln!(
        "\n!!!!!!!!!! SKIPPED: no QNN HTP simulator libraries in {} (set LAYA_QNN_LIB_DIR or run tools/qnn/fetch-runtime.sh) !!!!!!!!!!\n",
        dir.display()
    );
    None
}

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

#[test]
fn predict_with_the_qnn_backend_on_the_simulator_agrees_with_the_cpu_backend() {
    let Some(libs) = simulator() else { return };
    let bundle = bundle_dir("predict", "bpe-t5");
    let input = fixture_requests("bpe-t5", 12, 256);
    let (core, system) = (libs.join("libQnnHtp.so"), libs.join("libQnnSystem.so"));
    let qnn = run_predict(&bundle, "qnn", &input, &[("LAYA_QNN_BACKEND_LIB", &core), ("LAYA_QNN_SYSTEM_LIB", &system)]);
    let cpu = run_predict(&checkpoint("bpe-t5"), "cpu", &input, &[]);
    assert_eq!(qnn.len(), 12);
    assert_eq!(cpu.len(), 12);
    let answered = qnn.iter().filter(|v| v.get("answers").is_some()).count();
    assert!(answered >= 8, "only {answered} of 12 requests answered: {qnn:?}");
    for (i, (a, b)) in qnn.iter().zip(&cpu).enumerate() {
        assert_answers_close(a, b, &QNN, &format!("line {i}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_the_qnn_backend_on_the_simulator_answers_over_mqtt() {
    let Some(libs) = simulator() else { return };
    let bundle = bundle_dir("serve", "bpe-t5");
    let broker = Broker::start("qnn-serve", "");
    let dir = temp_dir("qnn-serve");
    let config = dir.join("laya-edge.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt]\nbroker = \"{}\"\ndevice = \"qcs1\"\n[model]\ndir = \"{}\"\n[engine]\nbackend = \"qnn\"\n\
             [qnn]\nbackend_lib = \"{}\"\nsystem_lib = \"{}\"\nperformance = \"burst\"\n",
            broker.url(),
            bundle.display(),
            libs.join("libQnnHtp.so").display(),
            libs.join("libQnnSystem.so").display()
        ),
    )
    .expect("config");
    let _agent = Agent::with_config(config, Vec::new());
    wait_online(broker.port, "qcs1").await;
    let mut c = Client::connect(broker.port, "qcs-asker").await;
    c.subscribe("laya/v1/qcs-asker/reply/#").await;
    let line = fixture_requests("bpe-t5", 1, 256);
    let request = json::parse_str(line.trim(), ParseOptions::default()).expect("json");
    c.ask("laya/v1/qcs1/ask", Encoding::Json.encode(&request), Some("laya/v1/qcs-asker/reply/x"), None, Encoding::Json)
        .await;
    let reply = decode(&c.next(Duration::from_secs(120)).await.expect("a reply"));
    assert_eq!(reply.get("backend"), Some(&Value::from("qnn")), "{reply:?}");
    let cpu = run_predict(&checkpoint("bpe-t5"), "cpu", &line, &[]);
    assert_answers_close(
        reply.get("answers").expect("answers"),
        cpu[0].get("answers").expect("answers"),
        &QNN,
        "answers",
    );
}
