//! Test helpers shared by the agent's integration tests (`agent/tests/it`) and the conformance
//! tests (`tests/conformance`) that need nothing of laya-edge itself: where the workspace and its
//! fixtures are, the vendor runtimes the tests load (a fake one built from this workspace,
//! Qualcomm's HTP simulator when fetched), reading answers, and a misbehaving MQTT broker
//! (`rogue_broker`).

use std::path::{Path, PathBuf};

pub mod rogue_broker;

use laya_topics::Value;
use laya_topics::json::{self, ParseOptions, Style};

/// The workspace's root directory (this crate is `tests/kit` in it): the test crates find the
/// fixtures, models and configs from here, wherever their own manifests are.
pub fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().and_then(Path::parent).expect("tests/kit is two levels down")
}

/// `tests/fixtures/laya-0.3.20`: the requests, answers and checkpoints recorded from laya's code.
pub fn fixtures_dir() -> PathBuf {
    workspace().join("tests").join("fixtures").join("laya-0.3.20")
}

/// A fixture checkpoint directory by name (`bpe-t5`, `wp-t4`, `bpe-small`).
pub fn model_dir(name: &str) -> PathBuf {
    fixtures_dir().join("models").join(name)
}

/// `tests/fixtures/laya-0.4.15`: what laya 0.4.15's code made of the same checkpoints and of
/// requests for its own features (tools/fixtures/generate_0415.py).
pub fn fixtures_0415_dir() -> PathBuf {
    workspace().join("tests").join("fixtures").join("laya-0.4.15")
}

/// A checkpoint the 0.4.15 fixtures name: its own (`bpe-t5-parallel`, `bpe-t5-calibrated`,
/// `bpe-t5-lang`), else the 0.3.20 fixtures' one of that name.
pub fn model_dir_0415(name: &str) -> PathBuf {
    let own = fixtures_0415_dir().join("models").join(name);
    if own.is_dir() { own } else { model_dir(name) }
}

/// Compact JSON text, for exact comparisons with readable failures.
pub fn text(v: &Value) -> String {
    json::to_string(v, Style::COMPACT)
}

/// Removes what cargo tells a test process about its package: build scripts that track one of
/// these (ring's tracks `CARGO_MANIFEST_DIR`) would otherwise be rebuilt by this nested build and
/// again by the next `cargo test`, a minute each time on two cores.
fn forget_test_package(cmd: &mut std::process::Command) {
    const OF_THE_PACKAGE: [&str; 6] =
        ["CARGO_MANIFEST_", "CARGO_PKG_", "CARGO_CRATE_", "CARGO_BIN_", "CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR"];
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(|k| OF_THE_PACKAGE.iter().any(|p| k.starts_with(p)) || k == "CARGO_RUSTC_CURRENT_DIR")
        {
            cmd.env_remove(k);
        }
    }
}

/// The `laya-edge` binary the tests run: `LAYA_EDGE_BIN` if set (tools/cross runs the x86 tests
/// against an aarch64 build under qemu-user this way), else `built`, the binary cargo built for
/// this test (`env!("CARGO_BIN_EXE_laya-edge")`).
pub fn laya_edge_bin(built: &str) -> PathBuf {
    std::env::var_os("LAYA_EDGE_BIN").filter(|v| !v.is_empty()).map_or_else(|| PathBuf::from(built), PathBuf::from)
}

/// Builds a fake runtime cdylib of this workspace (`cargo build -p PACKAGE`, in the profile of
/// the running test binary) and returns the shared library cargo reports for `target`.
///
/// With `LAYA_FAKE_LIB_DIR` set, nothing is built: the library is `lib{target}.so` in that
/// directory (tools/cross puts the aarch64 builds there, for an emulated `laya-edge` to load).
pub fn build_fake_library(package: &str, target: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("LAYA_FAKE_LIB_DIR").filter(|v| !v.is_empty()) {
        let lib = Path::new(&dir).join(format!("lib{target}.so"));
        assert!(lib.is_file(), "LAYA_FAKE_LIB_DIR is set but has no {} (for {package})", lib.display());
        return lib;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.args(["build", "-p", package, "--message-format=json"]).current_dir(env!("CARGO_MANIFEST_DIR"));
    forget_test_package(&mut cmd);
    // The test binary is target/<profile dir>/deps/<name>: build the library beside it.
    let exe = std::env::current_exe().expect("the test binary's path");
    if exe.parent().and_then(Path::parent).and_then(Path::file_name).is_some_and(|d| d == "release") {
        cmd.arg("--release");
    }
    let out = cmd.stderr(std::process::Stdio::inherit()).output().expect("cargo runs");
    assert!(out.status.success(), "cargo build -p {package} failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| json::parse(l.as_bytes(), ParseOptions::default()).ok())
        .filter(|m| m.get("reason").and_then(Value::as_str) == Some("compiler-artifact"))
        .filter(|m| m.get("target").and_then(|t| t.get("name")).and_then(Value::as_str) == Some(target))
        .flat_map(|m| m.get("filenames").and_then(Value::as_array).map(<[Value]>::to_vec).unwrap_or_default())
        .filter_map(|f| f.as_str().map(PathBuf::from))
        .find(|p| p.extension().is_some_and(|e| e == "so" || e == "dylib"))
        .unwrap_or_else(|| panic!("cargo reports no library for {target}"))
}

/// Qualcomm's x86-64 HTP simulator libraries (`LAYA_QNN_LIB_DIR`, else what
/// tools/qnn/fetch-runtime.sh put in `target/qnn-runtime`). The tests that need them are
/// `#[ignore]`d with the reason, so a run without `--include-ignored` (or `--ignored`) lists them
/// as ignored and never as passed; a test that runs panics here when they are missing: asked for,
/// it never skips.
pub fn qnn_simulator() -> PathBuf {
    let dir = std::env::var_os("LAYA_QNN_LIB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target").join("qnn-runtime"));
    assert!(
        dir.join("libQnnHtp.so").is_file() && dir.join("libQnnSystem.so").is_file(),
        "no QNN HTP simulator libraries in {} (set LAYA_QNN_LIB_DIR or run tools/qnn/fetch-runtime.sh; tools/test.sh does both): a simulator test that runs never skips",
        dir.display()
    );
    dir
}

/// How far apart an answer's two most probable options are (`None` with fewer than two): a
/// decision closer than a backend's precision may flip between backends.
pub fn decision_margin(answer: &Value) -> Option<f64> {
    let mut p: Vec<f64> = answer
        .get("probabilities")
        .and_then(Value::as_object)
        .map(|m| m.values().filter_map(|x| if let Value::Float(f) = x { Some(*f) } else { None }).collect())
        .unwrap_or_default();
    p.sort_by(|a, b| b.total_cmp(a));
    (p.len() >= 2).then(|| p[0] - p[1])
}

/// Compares our answer with laya's: every number within `tol`, the same choice wherever laya's
/// top two probabilities differ by more than 1e-3.
pub fn assert_like_laya(case: &str, qid: &str, ours: &laya_topics::Value, laya: &laya_topics::Value, tol: f64) {
    match (ours, laya) {
        (Value::Object(a), Value::Object(b)) => {
            assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "{case} {qid}");
            for (k, v) in a {
                if k == "choice" {
                    let probs: Vec<f64> = b
                        .get("probabilities")
                        .and_then(Value::as_object)
                        .map(|m| {
                            m.values().filter_map(|p| if let Value::Float(f) = p { Some(*f) } else { None }).collect()
                        })
                        .unwrap_or_default();
                    let mut sorted = probs.clone();
                    sorted.sort_by(|x, y| y.total_cmp(x));
                    if sorted.len() < 2 || sorted[0] - sorted[1] > 1e-3 {
                        assert_eq!(v, &b[k], "{case} {qid}: choice");
                    }
                    continue;
                }
                let t = if k == "score" {
                    tol * b.get("probabilities").and_then(Value::as_object).map_or(1, |m| m.len()) as f64
                } else {
                    tol
                };
                assert_like_laya(case, qid, v, &b[k], t);
            }
        }
        (Value::Float(a), Value::Float(b)) => assert!((a - b).abs() <= tol, "{case} {qid}: {a} vs laya {b}"),
        (a, b) => assert_eq!(a, b, "{case} {qid}"),
    }
}
