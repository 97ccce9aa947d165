//! The `laya-edge` binary's one-shot commands (`predict`, `layout`, `check-config`...): run with
//! arguments, environment and stdin, their output returned.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Stdio};

use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};

/// Runs the `laya-edge` binary with `args`, `env` and `stdin`; returns stdout, stderr and
/// whether it succeeded.
pub fn run_cli(args: &[&OsStr], env: &[(&str, &Path)], stdin: &str) -> (String, String, bool) {
    use std::io::Write;
    let mut child = Command::new(test_kit::laya_edge_bin(env!("CARGO_BIN_EXE_laya-edge")))
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    // Written beside the reading: a child whose output fills the pipe before it has read all
    // its input would wait for us while we wait for it.
    let mut input = child.stdin.take().expect("stdin");
    let stdin = stdin.to_owned();
    let writer = std::thread::spawn(move || input.write_all(stdin.as_bytes()));
    let out = child.wait_with_output().expect("the binary exits");
    // A child that stops before reading all its input (a refused flag, a model it cannot load)
    // closes the pipe: its exit status and output say what happened, not the write.
    match writer.join().expect("the writer") {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.expect("write stdin"),
    }
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

/// Runs `laya-edge predict` on `input` (JSON lines) and returns its output lines.
pub fn run_predict(model: &Path, backend: &str, input: &str, env: &[(&str, &Path)]) -> Vec<Value> {
    let args =
        [OsStr::new("predict"), OsStr::new("--backend"), OsStr::new(backend), OsStr::new("--model"), model.as_os_str()];
    let (out, err, ok) = run_cli(&args, env, input);
    assert!(ok, "predict --backend {backend} failed: {err}");
    out.lines().map(|l| json::parse_str(l, ParseOptions::default()).expect("json")).collect()
}
