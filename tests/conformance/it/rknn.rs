//! The RKNN backend through the fake runtime (`tests/fake-rknn`): the same answers as the CPU
//! backend on every fixture case, and every failure mode mapped to the error the supervisor acts
//! on (version refusal, constant output, error codes, hangs, shape buckets).
//!
//! The fake is a cdylib; cargo cannot make a test depend on one, so [`fake_library`] runs
//! `cargo build -p fake-rknn` once per test binary (a no-op when it is fresh) and takes the
//! library's path from cargo's JSON messages. The fake reads its `FAKE_RKNN_*` knobs at
//! `rknn_init`, and environment variables are process-wide, so every test that sets knobs runs
//! its body in a child process ([`in_child`]) with those variables; no test changes its own
//! environment.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::{bundle, cases, json_str, model_dir, test_path};
use laya_edge::backend::cpu::CpuBackend;
use laya_edge::backend::npu::rknn::{RknnBackend, RknnConfig, RknnError, RknnGraph, Status};
use laya_edge::backend::{Backend, BackendError, RowResult};
use laya_edge::pipeline;
use laya_edge::prompt::parallel::ParallelLayout;
use laya_edge::prompt::{QType, Row};
use laya_topics::{Request, Value};

/// Set in the child processes [`in_child`] starts.
const CHILD: &str = "LAYA_RKNN_TEST_CHILD";
/// The fake library's path, handed to children so they do not run cargo again.
const FAKE_LIB: &str = "LAYA_RKNN_TEST_FAKE_LIB";

/// Builds the fake runtime (once per process) and returns the path of `libfake_rknn.so`.
fn fake_library() -> &'static Path {
    crate::support::cached_fake_library(FAKE_LIB, "fake-rknn", "fake_rknn")
}

/// Writes a fake graph file for `checkpoint` compiled to `seq_len` tokens and 64 marker slots.
/// The file is what `rknn_init` gets; see tests/fake-rknn/README.md.
fn fake_graph(checkpoint: &Path, seq_len: usize) -> PathBuf {
    fake_graph_with_slots(checkpoint, seq_len, 64)
}

fn fake_graph_with_slots(checkpoint: &Path, seq_len: usize, marker_slots: usize) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("rknn-graphs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("graph-{}-{seq_len}.fake.rknn", N.fetch_add(1, Ordering::SeqCst)));
    let ckpt = std::path::absolute(checkpoint).unwrap();
    let ckpt = json_str(&ckpt.to_string_lossy());
    let text = format!(
        r#"{{"fake_rknn_graph": 1, "checkpoint": {ckpt}, "seq_len": {seq_len}, "marker_slots": {marker_slots}}}"#
    );
    std::fs::write(&file, text).unwrap();
    file
}

/// The bundle's graph list for fake graphs of `model` at the given lengths.
fn graphs(model: &str, lengths: &[usize]) -> Vec<RknnGraph> {
    lengths
        .iter()
        .map(|&l| RknnGraph { file: fake_graph(&model_dir(model), l), seq_len: l, marker_slots: 64 })
        .collect()
}

fn config() -> RknnConfig {
    RknnConfig::new(fake_library())
}

fn load(model: &str, lengths: &[usize]) -> Result<RknnBackend, RknnError> {
    RknnBackend::load(&graphs(model, lengths), &config(), bundle(model).tokenizer.pad.id)
}

/// A synthetic row of `n` tokens (ids inside every fixture vocabulary) and `k` options.
fn row(n: usize, k: usize, seed: u32) -> Row {
    Row {
        input_ids: (0..n as u32).map(|i| 5 + (i * 7 + seed) % 200).collect(),
        marker_pos: (1..=k as u32).collect(),
        qtype: QType::Choice,
        layout: None,
    }
}

/// Runs `body` in a child process (this test binary, only this test) with `env` set, and
/// asserts that it passed. In the child, runs `body` directly.
fn in_child(test: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    crate::support::in_child(CHILD, FAKE_LIB, fake_library(), &test_path(module_path!(), test), env, body)
}

fn child(test: &str, env: &[(&str, &str)]) -> Command {
    crate::support::child_command(CHILD, FAKE_LIB, fake_library(), &test_path(module_path!(), test), env)
}

fn fatal(e: BackendError) -> (Option<i64>, String) {
    match e {
        BackendError::Fatal { code, message } => (code, message),
        other => panic!("expected a fatal error, got {other:?}"),
    }
}

/// Our answer against the CPU backend's: option probabilities within 1e-4 (they are rounded to
/// 4 places), derived numbers within 1e-3, the same choice wherever the top two are apart,
/// everything else equal except `action` (the RKNN graph has no act head).
fn assert_same_answer(case: &str, qid: &str, ours: &Value, cpu: &Value, key: &str) {
    match (ours, cpu) {
        (Value::Object(a), Value::Object(b)) => {
            assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "{case} {qid}");
            for (k, v) in a {
                match k.as_str() {
                    "action" => {}
                    "choice" => {
                        let mut p: Vec<f64> = b
                            .get("probabilities")
                            .and_then(Value::as_object)
                            .map(|m| {
                                m.values()
                                    .filter_map(|x| if let Value::Float(f) = x { Some(*f) } else { None })
                                    .collect()
                            })
                            .unwrap_or_default();
                        p.sort_by(|x, y| y.total_cmp(x));
                        if p.len() < 2 || p[0] - p[1] > 2e-4 {
                            assert_eq!(v, &b[k], "{case} {qid}: choice");
                        }
                    }
                    _ => assert_same_answer(case, qid, v, &b[k], if key == "probabilities" { key } else { k }),
                }
            }
        }
        (Value::Float(a), Value::Float(b)) => {
            let tol = if matches!(key, "probabilities" | "noul") { 1e-4 + 1e-9 } else { 1e-3 };
            assert!((a - b).abs() <= tol, "{case} {qid} {key}: rknn {a} vs cpu {b}");
        }
        (a, b) => assert_eq!(a, b, "{case} {qid} {key}"),
    }
}

/// A backend that keeps a copy of what the backend it wraps returned.
struct Recording<'a, B: Backend> {
    inner: &'a mut B,
    results: Vec<RowResult>,
}

impl<'a, B: Backend> Recording<'a, B> {
    fn new(inner: &'a mut B) -> Self {
        Recording { inner, results: Vec::new() }
    }
}

impl<B: Backend> Backend for Recording<'_, B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn run(&mut self, rows: &[&Row]) -> Result<Vec<RowResult>, BackendError> {
        let out = self.inner.run(rows)?;
        self.results.extend(out.iter().cloned());
        Ok(out)
    }
}

#[test]
fn answers_through_the_fake_runtime_equal_the_cpu_backends() {
    let mut rknn: HashMap<String, RknnBackend> = HashMap::new();
    let mut cpu: HashMap<String, CpuBackend> = HashMap::new();
    let (mut compared, mut worst) = (0, 0.0f32);
    for case in cases() {
        if case.field("result").get("error").is_some() {
            continue;
        }
        let b = bundle(&case.model);
        // Two buckets: the fixtures' short rows run on 128, the long ones on 512.
        let r = rknn.entry(case.model.clone()).or_insert_with(|| load(&case.model, &[512, 128]).unwrap());
        let c = cpu
            .entry(case.model.clone())
            .or_insert_with(|| CpuBackend::load(&model_dir(&case.model), &b.config).unwrap());
        let request = Request::from_value(case.field("request").clone()).unwrap();
        let (mut r, mut c) = (Recording::new(r), Recording::new(c));
        let ours = pipeline::answer(&b, &mut r, &request).unwrap_or_else(|e| panic!("{}: {e}", case.id)).to_value();
        let want = pipeline::answer(&b, &mut c, &request).unwrap().to_value();
        let (oa, wa) = (ours.get("answers").unwrap(), want.get("answers").unwrap());
        for (qid, a) in oa.as_object().unwrap() {
            let w = wa.get(qid).unwrap_or_else(|| panic!("{} {qid}: the CPU backend has no answer", case.id));
            assert_same_answer(&case.id, qid, a, w, "");
        }
        assert_eq!(ours.get("usage"), want.get("usage"), "{}", case.id);
        // And the raw logits the two backends returned, row by row.
        assert_eq!(r.results.len(), c.results.len());
        for (x, y) in r.results.iter().zip(&c.results) {
            assert_eq!(x.logits.len(), y.logits.len(), "{}", case.id);
            assert_eq!(x.act_logits, [0.0, 0.0]);
            for (u, v) in x.logits.iter().zip(&y.logits) {
                worst = worst.max((u - v).abs());
            }
        }
        compared += 1;
    }
    assert!(compared >= 400, "only {compared} cases");
    assert!(worst <= 1e-4, "largest logit difference from the CPU backend: {worst:e}");
    eprintln!("{compared} cases; largest logit difference from the CPU backend: {worst:e}");
}

#[test]
fn the_runtime_and_driver_versions_are_reported_for_the_caller_to_log() {
    let b = load("bpe-small", &[128]).unwrap();
    assert_eq!(b.versions().api, "2.3.2 (fake)");
    assert_eq!(b.versions().release(), "2.3.2");
    assert_eq!(b.versions().driver, "0.9.8");
    assert_eq!(b.name(), "rknn");
}

#[test]
fn runtime_2_4_2_is_refused_naming_the_constant_vector_problem() {
    in_child(
        "runtime_2_4_2_is_refused_naming_the_constant_vector_problem",
        &[("FAKE_RKNN_SDK_VERSION", "2.4.2 (8d4e2e0@2025-06-01)"), ("FAKE_RKNN_DRV_VERSION", "0.9.8")],
        || {
            let err = load("bpe-small", &[128]).err().expect("refused");
            let msg = err.to_string();
            assert!(matches!(err, RknnError::RuntimeRefused { .. }), "{msg}");
            assert!(msg.contains("2.4.2 (8d4e2e0@2025-06-01)") && msg.contains("constant vector"), "{msg}");
            assert!(msg.contains("0.9.8") && msg.contains("2.3.2"), "{msg}");
            // The allowlist is the bundle's: one that names 2.4.2 lets it load.
            let mut cfg = config();
            cfg.runtime_allowlist.push("2.4.2".into());
            RknnBackend::load(&graphs("bpe-small", &[128]), &cfg, 0).expect("allowed");
        },
    );
}

#[test]
fn bit_identical_logits_for_two_different_rows_are_fatal() {
    in_child("bit_identical_logits_for_two_different_rows_are_fatal", &[("FAKE_RKNN_CONSTANT_OUTPUT", "1")], || {
        let mut b = load("bpe-small", &[128]).unwrap();
        let (r1, r2) = (row(20, 3, 0), row(30, 3, 1));
        b.run(&[&r1]).unwrap();
        // The same row again is not evidence.
        b.run(&[&r1]).unwrap();
        let (code, msg) = fatal(b.run(&[&r2]).unwrap_err());
        assert_eq!(code, None);
        assert!(msg.contains("constant output"), "{msg}");
    });
}

#[test]
fn a_timeout_during_a_run_is_fatal_with_its_code() {
    in_child("a_timeout_during_a_run_is_fatal_with_its_code", &[("FAKE_RKNN_FAIL_CODE", "-2")], || {
        let mut b = load("bpe-small", &[128]).unwrap();
        let (code, msg) = fatal(b.run(&[&row(10, 2, 0)]).unwrap_err());
        assert_eq!(code, Some(-2));
        assert!(msg.contains("rknn_run") && msg.contains("RKNN_ERR_TIMEOUT") && msg.contains("hung"), "{msg}");
    });
}

#[test]
fn rknn_err_fail_after_a_run_is_the_drivers_job_timeout_and_fatal() {
    in_child(
        "rknn_err_fail_after_a_run_is_the_drivers_job_timeout_and_fatal",
        &[("FAKE_RKNN_FAIL_CODE", "-1"), ("FAKE_RKNN_FAIL_ON_RUN", "2")],
        || {
            let mut b = load("bpe-small", &[128]).unwrap();
            b.run(&[&row(10, 2, 0)]).expect("the first run works");
            let (code, msg) = fatal(b.run(&[&row(12, 2, 1)]).unwrap_err());
            assert_eq!(code, Some(-1));
            assert!(msg.contains("RKNN_ERR_FAIL") && msg.contains("hung"), "{msg}");
        },
    );
}

#[test]
fn other_error_codes_during_a_run_are_fatal_with_their_names() {
    for (code, name) in
        [("-9", "RKNN_ERR_OUTPUT_INVALID"), ("-3", "RKNN_ERR_DEVICE_UNAVAILABLE"), ("-42", "undocumented")]
    {
        in_child(
            "other_error_codes_during_a_run_are_fatal_with_their_names",
            &[("FAKE_RKNN_FAIL_CODE", code), ("LAYA_RKNN_TEST_NAME", name)],
            || {
                let name = std::env::var("LAYA_RKNN_TEST_NAME").unwrap();
                let want: i64 = std::env::var("FAKE_RKNN_FAIL_CODE").unwrap().parse().unwrap();
                let mut b = load("bpe-small", &[128]).unwrap();
                let (code, msg) = fatal(b.run(&[&row(10, 2, 0)]).unwrap_err());
                assert_eq!(code, Some(want));
                assert!(msg.contains(&name) && !msg.contains("hung"), "{msg}");
            },
        );
        if std::env::var_os(CHILD).is_some() {
            return;
        }
    }
}

#[test]
fn an_init_failure_is_a_named_error() {
    in_child("an_init_failure_is_a_named_error", &[("FAKE_RKNN_FAIL_INIT", "-10")], || {
        let err = load("bpe-small", &[128]).err().expect("init fails");
        assert_eq!(err.status(), Some(Status::DeviceUnmatch));
        let msg = err.to_string();
        assert!(msg.contains("rknn_init") && msg.contains("RKNN_ERR_DEVICE_UNMATCH (-10)"), "{msg}");
    });
}

#[test]
fn a_file_that_is_not_a_graph_fails_init_as_an_invalid_model() {
    let file = fake_graph(&model_dir("bpe-small"), 128).with_extension("bad");
    std::fs::write(&file, b"RKNN\x00 not really").unwrap();
    let g = [RknnGraph { file, seq_len: 128, marker_slots: 64 }];
    let err = RknnBackend::load(&g, &config(), 0).err().expect("refused");
    assert_eq!(err.status(), Some(Status::ModelInvalid), "{err}");
    assert!(err.to_string().contains("RKNN_ERR_MODEL_INVALID"), "{err}");
}

#[test]
fn a_graph_whose_shape_differs_from_the_bundle_is_refused() {
    let file = fake_graph(&model_dir("bpe-small"), 128);
    let err =
        RknnBackend::load(&[RknnGraph { file, seq_len: 256, marker_slots: 64 }], &config(), 0).err().expect("refused");
    let msg = err.to_string();
    assert!(matches!(err, RknnError::Graph { .. }), "{msg}");
    assert!(msg.contains("input_ids") && msg.contains("[1, 128]") && msg.contains("[1, 256]"), "{msg}");
    let file = fake_graph_with_slots(&model_dir("bpe-small"), 128, 32);
    let err =
        RknnBackend::load(&[RknnGraph { file, seq_len: 128, marker_slots: 64 }], &config(), 0).err().expect("refused");
    assert!(err.to_string().contains("marker_pos"), "{err}");
}

#[test]
fn short_rows_run_on_the_smallest_graph_and_every_graph_gets_all_cores_with_one_context() {
    let trace = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("rknn-trace-{}.txt", std::process::id()));
    let _ = std::fs::remove_file(&trace);
    in_child(
        "short_rows_run_on_the_smallest_graph_and_every_graph_gets_all_cores_with_one_context",
        &[("FAKE_RKNN_TRACE", trace.to_str().unwrap())],
        || {
            let one = RknnConfig { contexts: 1, ..config() };
            let mut b = RknnBackend::load(&graphs("bpe-small", &[512, 128]), &one, 0).unwrap();
            assert_eq!(b.graphs().map(|g| g.seq_len).collect::<Vec<_>>(), [128, 512]);
            let (short, edge, long) = (row(65, 3, 0), row(128, 3, 1), row(129, 3, 2));
            b.run(&[&short, &edge, &long]).unwrap();
        },
    );
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let text = std::fs::read_to_string(&trace).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "core_mask=0xffff seq_len=128",
            "core_mask=0xffff seq_len=512",
            "run=1 seq_len=128 tokens=65 options=3",
            "run=2 seq_len=128 tokens=128 options=3",
            "run=3 seq_len=512 tokens=129 options=3",
        ]
    );
    std::fs::remove_file(&trace).ok();
}

#[test]
fn a_row_no_graph_holds_is_an_input_error() {
    let mut b = load("bpe-small", &[128]).unwrap();
    for (bad, what) in [(row(129, 2, 0), "129 tokens"), (row(100, 65, 0), "65 options")] {
        match b.run(&[&row(10, 2, 0), &bad]) {
            Err(BackendError::Input(msg)) => {
                assert!(msg.contains(what) && msg.contains("128 tokens x 64 options"), "{msg}")
            }
            other => panic!("expected an input error, got {other:?}"),
        }
    }
    let empty = Row { input_ids: vec![], marker_pos: vec![], qtype: QType::Score, layout: None };
    assert!(matches!(b.run(&[&empty]), Err(BackendError::Input(_))));
    // A parallel row: the graph takes no position ids, so it would answer a different input.
    let parallel = Row { layout: Some(ParallelLayout::sequential(10)), ..row(10, 2, 0) };
    match b.run(&[&parallel]) {
        Err(BackendError::Input(msg)) => assert!(msg.contains("parallel option layout"), "{msg}"),
        other => panic!("expected an input error, got {other:?}"),
    }
    // The backend still works afterwards.
    assert_eq!(b.run(&[&row(10, 2, 0)]).unwrap()[0].logits.len(), 2);
}

#[test]
fn the_library_comes_from_the_config_or_rknn_lib() {
    let lib = fake_library().to_str().unwrap().to_owned();
    in_child("the_library_comes_from_the_config_or_rknn_lib", &[("RKNN_LIB", &lib)], || {
        let cfg = RknnConfig::from_config_or_env(None).unwrap();
        assert_eq!(cfg.library, fake_library());
        assert_eq!(cfg.core_mask, 0xFFFF);
        assert_eq!(cfg.runtime_allowlist, ["2.3.2"]);
        RknnBackend::load(&graphs("bpe-small", &[128]), &cfg, 0).expect("loads from RKNN_LIB");
        // The configured path wins over RKNN_LIB.
        let cfg = RknnConfig::from_config_or_env(Some(Path::new("/nonexistent/librknnrt.so"))).unwrap();
        let err = RknnBackend::load(&graphs("bpe-small", &[128]), &cfg, 0).err().unwrap();
        assert!(matches!(err, RknnError::LibraryNotFound(_)), "{err}");
    });
}

#[test]
fn no_library_given_is_an_error_never_a_guess() {
    if std::env::var_os(CHILD).is_none() {
        // In a child without RKNN_LIB, whatever this process's environment says.
        let test = "no_library_given_is_an_error_never_a_guess";
        let out = child(test, &[]).env_remove("RKNN_LIB").output().unwrap();
        crate::support::assert_child_ran_one_test(&out, test);
        return;
    }
    let err = RknnConfig::from_config_or_env(None).expect_err("no library");
    assert!(matches!(err, RknnError::NoLibrary));
    assert!(err.to_string().contains("RKNN_LIB") && err.to_string().contains("never searches"), "{err}");
    let err = RknnBackend::load(&graphs("bpe-small", &[128]), &RknnConfig::new(""), 0).err().unwrap();
    assert!(matches!(err, RknnError::NoLibrary), "{err}");
}

#[test]
fn a_file_that_is_not_a_library_is_refused() {
    let not_a_lib = fake_graph(&model_dir("bpe-small"), 128);
    let err = RknnBackend::load(&graphs("bpe-small", &[128]), &RknnConfig::new(&not_a_lib), 0).err().unwrap();
    assert!(matches!(err, RknnError::Load { .. }), "{err}");
}

#[test]
fn a_hung_run_blocks_until_the_process_is_killed() {
    let marker = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("rknn-hang-{}.txt", std::process::id()));
    if std::env::var_os(CHILD).is_some() {
        let mut b = load("bpe-small", &[128]).unwrap();
        b.run(&[&row(10, 2, 0)]).unwrap();
        std::fs::write(std::env::var("LAYA_RKNN_TEST_MARKER").unwrap(), "first run done").unwrap();
        let _ = b.run(&[&row(11, 2, 1)]);
        panic!("the second run returned");
    }
    let _ = std::fs::remove_file(&marker);
    let mut proc = child("a_hung_run_blocks_until_the_process_is_killed", &[("FAKE_RKNN_HANG_ON_RUN", "2")])
        .env("LAYA_RKNN_TEST_MARKER", &marker)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !marker.exists() {
        assert!(proc.try_wait().unwrap().is_none(), "the child ended before its first run");
        assert!(start.elapsed() < Duration::from_secs(300), "the child never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert!(proc.try_wait().unwrap().is_none(), "the hung run returned");
    proc.kill().unwrap();
    proc.wait().unwrap();
    std::fs::remove_file(&marker).ok();
}

/// The fake's latency in the multi-context tests: long enough that runs side by side overlap
/// whatever the host does between them.
const LATENCY_MS: u64 = 400;

/// The runs `FAKE_RKNN_SPANS` recorded: each one's core mask and the span it held its cores.
fn spans(file: &Path) -> Vec<(String, u128, u128)> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|l| {
            let field = |k: &str| l.split(' ').find_map(|f| f.strip_prefix(k)).unwrap_or_else(|| panic!("{k} in {l}"));
            (field("mask=").to_owned(), field("start_us=").parse().unwrap(), field("end_us=").parse().unwrap())
        })
        .collect()
}

#[test]
fn three_contexts_are_pinned_to_one_core_each_and_run_three_questions_side_by_side() {
    let trace = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("rknn-trace3-{}.txt", std::process::id()));
    let runs = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("rknn-spans3-{}.txt", std::process::id()));
    let _ = std::fs::remove_file(&trace);
    let _ = std::fs::remove_file(&runs);
    let latency = LATENCY_MS.to_string();
    in_child(
        "three_contexts_are_pinned_to_one_core_each_and_run_three_questions_side_by_side",
        &[
            ("FAKE_RKNN_TRACE", trace.to_str().unwrap()),
            ("FAKE_RKNN_SPANS", runs.to_str().unwrap()),
            ("FAKE_RKNN_LATENCY_MS", &latency),
        ],
        || {
            let rows = [row(20, 2, 0), row(30, 3, 1), row(40, 4, 2)];
            let refs: Vec<&Row> = rows.iter().collect();
            let mut three = load("bpe-small", &[128]).unwrap();
            assert_eq!(three.contexts(), 3);
            three.run(&refs).unwrap();
            drop(three);
            let mut one =
                RknnBackend::load(&graphs("bpe-small", &[128]), &RknnConfig { contexts: 1, ..config() }, 0).unwrap();
            one.run(&refs).unwrap();
        },
    );
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let text = std::fs::read_to_string(&trace).unwrap();
    let masks: Vec<&str> = text.lines().filter(|l| l.starts_with("core_mask")).collect();
    assert_eq!(
        masks,
        [
            "core_mask=0x1 seq_len=128",
            "core_mask=0x2 seq_len=128",
            "core_mask=0x4 seq_len=128",
            "core_mask=0xffff seq_len=128"
        ]
    );
    // What the fake recorded of each run: the three contexts' runs of one call held their cores
    // at the same time (each began before any of them ended), one context's ran one after
    // another.
    let all = spans(&runs);
    assert_eq!(all.len(), 6, "{all:?}");
    let (three, one) = all.split_at(3);
    let mut pinned: Vec<&str> = three.iter().map(|(m, _, _)| m.as_str()).collect();
    pinned.sort();
    assert_eq!(pinned, ["0x1", "0x2", "0x4"], "{all:?}");
    let last_start = three.iter().map(|s| s.1).max().unwrap();
    let first_end = three.iter().map(|s| s.2).min().unwrap();
    assert!(last_start < first_end, "the three contexts' runs did not overlap: {three:?}");
    let mut serial = one.to_vec();
    serial.sort_by_key(|s| s.1);
    assert!(serial.windows(2).all(|w| w[1].1 >= w[0].2), "one context's runs overlapped: {serial:?}");
    std::fs::remove_file(&trace).ok();
    std::fs::remove_file(&runs).ok();
}

#[test]
fn rows_spread_over_three_contexts_get_exactly_the_single_context_logits_in_row_order() {
    // Rows of different lengths, option counts and types, two graphs; more rows than contexts.
    let mut rows: Vec<Row> = (0..10).map(|i| row(10 + 23 * i, 2 + i % 5, i as u32)).collect();
    rows[3].qtype = QType::Score;
    rows[7].qtype = QType::Noul;
    rows[7].marker_pos = vec![3];
    let refs: Vec<&Row> = rows.iter().collect();
    let mut three = load("bpe-small", &[512, 128]).unwrap();
    let mut one =
        RknnBackend::load(&graphs("bpe-small", &[512, 128]), &RknnConfig { contexts: 1, ..config() }, 0).unwrap();
    let (a, b) = (three.run(&refs).unwrap(), one.run(&refs).unwrap());
    assert_eq!(a.len(), rows.len());
    for (r, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x.logits.len(), rows[r].marker_pos.len(), "row {r}");
        assert_eq!(x, y, "row {r}");
    }
    // Different rows got different logits: the comparison compares something.
    assert_ne!(a[0].logits, a[1].logits[..2]);
}

#[test]
fn a_failure_in_one_context_fails_the_call_with_its_code() {
    in_child(
        "a_failure_in_one_context_fails_the_call_with_its_code",
        &[("FAKE_RKNN_FAIL_CODE", "-2"), ("FAKE_RKNN_FAIL_ON_RUN", "5")],
        || {
            let mut b = load("bpe-small", &[128]).unwrap();
            let rows: Vec<Row> = (0..6).map(|i| row(10 + i, 2, i as u32)).collect();
            let refs: Vec<&Row> = rows.iter().collect();
            let (code, message) = fatal(b.run(&refs).unwrap_err());
            assert_eq!(code, Some(-2), "{message}");
            // The contexts are still usable for the next call (the supervisor decides).
            assert_eq!(b.run(&refs[..3]).unwrap().len(), 3);
        },
    );
}

#[test]
fn more_contexts_than_cores_are_refused() {
    for n in [0, 4] {
        let err = RknnBackend::load(&graphs("bpe-small", &[128]), &RknnConfig { contexts: n, ..config() }, 0)
            .err()
            .expect("refused");
        assert!(matches!(err, RknnError::BadContexts(m) if m == n), "{err}");
    }
}
