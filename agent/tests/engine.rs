//! The engine with real worker processes (the `laya-edge worker` binary) and injected faults.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use laya_edge::engine::null::NullBackend;
use laya_edge::engine::process::{Engine, EngineConfig, EngineError, WorkerSpec};
use laya_edge::engine::supervisor::{Policy, RestartReason, Role, WorkerState};
use laya_edge::prompt::{QType, Row};

fn worker(backend: &str, model: &str, faults: Option<&str>) -> WorkerSpec {
    let mut args: Vec<OsString> =
        vec!["worker".into(), "--backend".into(), backend.into(), "--model".into(), model.into()];
    if let Some(f) = faults {
        args.push("--faults".into());
        args.push(f.into());
    }
    WorkerSpec { program: PathBuf::from(env!("CARGO_BIN_EXE_laya-edge")), args, env: Vec::new() }
}

fn fixture_model(name: &str) -> String {
    format!("{}/../tests/fixtures/laya-0.3.20/models/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn marker(name: &str) -> String {
    let p = std::env::temp_dir().join(format!("laya-engine-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p.display().to_string()
}

fn row(seed: u32) -> Row {
    Row { input_ids: vec![1, 4, seed, 9, 2], marker_pos: vec![1, 3], qtype: QType::Choice }
}

fn fast_policy(deadline_ms: u64) -> Policy {
    Policy {
        fixed_deadline: Some(Duration::from_millis(deadline_ms)),
        load_allowance: Duration::ZERO,
        backoff_min: Duration::from_millis(100),
        startup_timeout: Duration::from_secs(20),
        ..Policy::default()
    }
}

/// Child processes of this test process that are zombies.
fn zombie_children() -> Vec<u32> {
    let me = std::process::id();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // pid (comm) state ppid ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 1 && fields[0] == "Z" && fields[1].parse() == Ok(me) {
            out.push(entry.file_name().to_string_lossy().parse().unwrap_or(0));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_worker_is_killed_within_its_deadline_and_the_call_is_answered_after_the_restart() {
    let faults = format!("hang@1,once={}", marker("hang"));
    let engine = Engine::start(EngineConfig {
        policy: fast_policy(500),
        primary: worker("null", "-", Some(&faults)),
        fallback: None,
    });
    let t = Instant::now();
    let out = engine.run(vec![row(5)]).await.expect("answered after the restart");
    let elapsed = t.elapsed();
    assert_eq!(out.rows[0], NullBackend::logits_for(&row(5)));
    assert!(elapsed >= Duration::from_millis(500), "{elapsed:?}");
    // Generous for a loaded CI machine; without the deadline the call would never return.
    assert!(elapsed < Duration::from_millis(500 + 3000), "killed and replaced within deadline + 3 s: {elapsed:?}");
    assert_eq!(engine.restarts()[0].reason, RestartReason::Deadline);
    assert!(zombie_children().is_empty(), "zombies: {:?}", zombie_children());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_is_answered_while_the_worker_hangs() {
    let engine = Engine::start(EngineConfig {
        policy: fast_policy(1500),
        primary: worker("null", "-", Some("hang")),
        fallback: None,
    });
    let e2 = engine.clone();
    let call = tokio::spawn(async move { e2.run(vec![row(1)]).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    let t = Instant::now();
    let status = engine.status();
    assert!(t.elapsed() < Duration::from_millis(250), "status waited for the hung worker");
    assert!(matches!(status.worker, WorkerState::Busy(_)), "{status:?}");
    // It hangs again after the restart, so the second failure is final and retryable.
    let result = call.await.expect("the call task");
    assert!(matches!(result, Err(EngineError::Unavailable(_))), "{result:?}");
    assert_eq!(engine.restarts().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_or_exiting_worker_is_replaced_and_the_call_rerun() {
    for fault in ["abort@1", "exit@1", "error=fatal@1"] {
        let faults = format!("{fault},once={}", marker(&fault.replace(['@', '='], "-")));
        let engine = Engine::start(EngineConfig {
            policy: fast_policy(5000),
            primary: worker("null", "-", Some(&faults)),
            fallback: None,
        });
        let out = engine.run(vec![row(7)]).await.unwrap_or_else(|e| panic!("{fault}: {e}"));
        assert_eq!(out.rows[0], NullBackend::logits_for(&row(7)), "{fault}");
        let reasons: Vec<&str> = engine.restarts().iter().map(|r| r.reason.label()).collect();
        assert_eq!(reasons, [if fault.starts_with("error") { "fatal" } else { "crash" }], "{fault}");
    }
    // Reaping happens on the reaper task: give it a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(zombie_children().is_empty(), "zombies: {:?}", zombie_children());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_error_is_the_callers_and_restarts_nothing() {
    let engine = Engine::start(EngineConfig {
        policy: fast_policy(5000),
        primary: worker("null", "-", Some("error=input@1")),
        fallback: None,
    });
    assert!(matches!(engine.run(vec![row(1)]).await, Err(EngineError::Input(_))));
    assert!(engine.run(vec![row(2)]).await.is_ok());
    assert!(engine.restarts().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_degrades_to_the_cpu_fallback() {
    let policy =
        Policy { fallback: true, max_restarts: 2, backoff_min: Duration::from_millis(20), ..fast_policy(20_000) };
    let engine = Engine::start(EngineConfig {
        policy,
        primary: worker("null", "-", Some("load-fail")),
        fallback: Some(worker("cpu", &fixture_model("bpe-small"), None)),
    });
    let out = engine
        .run(vec![Row { input_ids: vec![1, 50, 60, 2, 4, 70, 2], marker_pos: vec![4], qtype: QType::Noul }])
        .await;
    let out = out.expect("served by the fallback");
    assert_eq!(out.role, Role::Fallback);
    assert_eq!(out.rows[0].logits.len(), 1);
    let status = engine.status();
    assert!(status.degraded && status.role == Role::Fallback, "{status:?}");
    assert_eq!(status.backend.as_deref(), Some("cpu"));
    assert!(engine.restarts().iter().all(|r| r.reason.label() == "load_failed" && r.role == Role::Primary));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_reports_a_load_failure_and_exits_is_never_taken_for_a_crash() {
    // The LoadFailed frame and the process exit reach the driver on different paths; the exit
    // must be reported only after the worker's last frames, however the two race.
    let policy = Policy {
        max_restarts: 1000,
        backoff_min: Duration::from_millis(1),
        backoff_max: Duration::from_millis(1),
        ..fast_policy(20_000)
    };
    let engine =
        Engine::start(EngineConfig { policy, primary: worker("null", "-", Some("load-fail")), fallback: None });
    let t = Instant::now();
    while engine.restarts().len() < 25 && t.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let restarts = engine.restarts();
    assert!(restarts.len() >= 25, "only {} restarts in 60 s", restarts.len());
    let labels: Vec<&str> = restarts.iter().map(|r| r.reason.label()).collect();
    assert!(labels.iter().all(|l| *l == "load_failed"), "{labels:?}");
}
