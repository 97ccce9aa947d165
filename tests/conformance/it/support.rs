//! Shared helpers of this binary's modules: where the fixtures are and how to read them.
//!
//! The fixtures in `tests/fixtures/laya-0.3.20` were recorded by `tools/fixtures/generate.py`
//! from laya's own code; nothing here computes an expected value.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use laya_edge::bundle::HostBundle;
use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};
pub use test_kit::{build_fake_library, fixtures_dir, model_dir, text};

/// Reads a JSON file with Python's semantics.
pub fn read_json(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    json::parse(&bytes, ParseOptions { max_depth: 10_000 })
        .unwrap_or_else(|e| panic!("cannot parse {}: {e}", path.display()))
}

/// One recorded case: a request and what laya did with it.
#[derive(Debug, Clone)]
pub struct Case {
    pub id: String,
    pub model: String,
    pub record: Value,
}

impl Case {
    /// A field of the record (panics with the case id if absent: the fixture is malformed).
    pub fn field(&self, key: &str) -> &Value {
        self.record.get(key).unwrap_or_else(|| panic!("case {} has no {key:?}", self.id))
    }
}

/// Every case of the 0.3.20 `cases.jsonl`, in file order.
pub fn cases() -> &'static [Case] {
    static CASES: OnceLock<Vec<Case>> = OnceLock::new();
    CASES.get_or_init(|| read_cases(&fixtures_dir().join("cases.jsonl")))
}

/// The cases of a `cases.jsonl`, in file order.
pub fn read_cases(path: &Path) -> Vec<Case> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let record = json::parse_str(line, ParseOptions { max_depth: 10_000 }).expect("a fixture line parses");
            let id = record.get("id").and_then(Value::as_str).expect("case id").to_owned();
            let model = record.get("model").and_then(Value::as_str).expect("case model").to_owned();
            Case { id, model, record }
        })
        .collect()
}

/// laya's error record: `{"type": "ValueError", "message": ...}`.
pub fn laya_error(v: &Value) -> (&str, &str) {
    (v.get("type").and_then(Value::as_str).unwrap_or(""), v.get("message").and_then(Value::as_str).unwrap_or(""))
}

/// Holds one case's validation verdicts (`check`) against ours: the same questions in order, an
/// error wherever laya raised, laya's `ValueError` message exactly. Returns how many refusals
/// were compared.
pub fn assert_validation(case: &Case, prepared: &[laya_edge::prompt::Prepared]) -> usize {
    let check = case.field("check").as_object().expect("check is an object");
    assert_eq!(prepared.len(), check.len(), "{}", case.id);
    let mut checked = 0;
    for (p, (qid, verdict)) in prepared.iter().zip(check) {
        assert_eq!(&p.qid, qid, "{}: question order", case.id);
        if *verdict == Value::Null {
            continue;
        }
        checked += 1;
        let (kind, message) = laya_error(verdict);
        let err =
            p.outcome.as_ref().err().unwrap_or_else(|| panic!("{} {qid}: laya raised {kind}: {message}", case.id));
        if kind == "ValueError" {
            assert_eq!(err.kind, laya_edge::prompt::QuestionErrorKind::Invalid, "{} {qid}", case.id);
            assert_eq!(err.message, message, "{} {qid}", case.id);
        }
    }
    checked
}

/// Holds a request laya refused as a whole (`predict_all`'s error) against ours: some question
/// is refused, a validation error first (laya validates every question before it lays any out),
/// with laya's `ValueError` message. Returns whether laya refused it.
pub fn assert_whole_request_refusal(case: &Case, prepared: &[laya_edge::prompt::Prepared]) -> Option<bool> {
    let err = case.field("predict_all").get("error")?;
    let (kind, message) = laya_error(err);
    let first = prepared
        .iter()
        .filter_map(|p| p.outcome.as_ref().err())
        .min_by_key(|e| e.kind != laya_edge::prompt::QuestionErrorKind::Invalid)
        .unwrap_or_else(|| panic!("{}: laya raised {kind}: {message}", case.id));
    let value_error = kind == "ValueError";
    if value_error {
        assert_eq!(first.message, message, "{}", case.id);
    }
    Some(value_error)
}

/// The budget laya 0.3.20 used for a recorded request (tools/fixtures/generate.py): the
/// request's `max_len`/`head_max_len` over the model's, whatever their size. laya-edge never
/// lets a request raise them (`pipeline::limits_for`); recorded layouts are compared at laya's
/// own values, so they stay byte-exact.
pub fn laya_limits(request: &laya_topics::Request, b: &HostBundle) -> laya_edge::prompt::Limits {
    laya_edge::prompt::Limits {
        max_len: request.max_len.unwrap_or(b.config.limits.max_len),
        head_max_len: request.head_max_len.unwrap_or(b.config.limits.head_max_len),
    }
}

/// The host bundle of a fixture model, loaded once per test binary.
pub fn bundle(name: &str) -> Arc<HostBundle> {
    static BUNDLES: OnceLock<Mutex<HashMap<String, Arc<HostBundle>>>> = OnceLock::new();
    let map = BUNDLES.get_or_init(Default::default);
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    map.entry(name.to_owned())
        .or_insert_with(|| {
            Arc::new(HostBundle::load(&model_dir(name)).unwrap_or_else(|e| panic!("cannot load model {name}: {e}")))
        })
        .clone()
}

/// A JSON array of numbers as `f32` (the recorded values are float32 widened to double).
pub fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| match x {
            Value::Float(f) => *f as f32,
            Value::Int(i) => i.to_f64() as f32,
            other => panic!("not a number: {other:?}"),
        })
        .collect()
}

/// A JSON array of integers.
pub fn ints(v: &Value) -> Vec<i64> {
    v.as_array().expect("an array").iter().map(|x| x.as_i64().expect("an integer")).collect()
}

/// A string as a JSON string literal (quoted and escaped), for writing JSON files by hand.
pub fn json_str(s: &str) -> String {
    text(&Value::Str(s.to_owned()))
}

/// The fake runtime library of `package` (see [`build_fake_library`]), built at most once per
/// process: the path in the environment variable `lib_var` if set (what [`in_child`] hands its
/// children, so they do not run cargo again), else the library cargo builds.
pub fn cached_fake_library(lib_var: &str, package: &str, target: &str) -> &'static Path {
    static LIBS: OnceLock<Mutex<HashMap<String, &'static Path>>> = OnceLock::new();
    let map = LIBS.get_or_init(Default::default);
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    map.entry(package.to_owned()).or_insert_with(|| {
        let lib = match std::env::var_os(lib_var) {
            Some(p) => PathBuf::from(p),
            None => build_fake_library(package, target),
        };
        Box::leak(lib.into_boxed_path())
    })
}

/// The name libtest gives test `test` of the module at `module_path` (its `module_path!()`: this
/// binary's crate name, then the modules), which `--exact` matches: `rknn::some_test`.
pub fn test_path(module_path: &str, test: &str) -> String {
    match module_path.split_once("::") {
        Some((_crate, modules)) => format!("{modules}::{test}"),
        None => test.to_owned(),
    }
}

/// The command that runs only the test `test` (its full name, [`test_path`]) of this test binary
/// in a child process, with `child_var=1`, `lib_var` = `lib` (the fake library) and `env` set.
pub fn child_command(child_var: &str, lib_var: &str, lib: &Path, test: &str, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    // --include-ignored: the child runs the test its parent runs, which was asked for even
    // where it is ignored by default (the simulator's).
    cmd.args([test, "--exact", "--include-ignored", "--test-threads=1", "--nocapture"])
        .env(child_var, "1")
        .env(lib_var, lib)
        .envs(env.iter().copied());
    cmd
}

/// Runs `body` in a child process ([`child_command`]) and asserts that it passed; in the child
/// (`child_var` set), runs `body` directly. Fake runtimes read their knobs from the environment,
/// which is process-wide, so tests that set knobs run this way and never change their own.
pub fn in_child(child_var: &str, lib_var: &str, lib: &Path, test: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    if std::env::var_os(child_var).is_some() {
        body();
        return;
    }
    let out = child_command(child_var, lib_var, lib, test, env).output().expect("the test binary runs");
    assert_child_ran_one_test(&out, test);
}

/// Asserts that a child started by [`child_command`] ran exactly one test and it passed: a child
/// whose `--exact` name matches nothing (a renamed test) runs 0 tests and exits 0, which would
/// otherwise pass unseen.
pub fn assert_child_ran_one_test(out: &std::process::Output, test: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let explain = || format!("child {test}:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "failed: {}", explain());
    // libtest's summary: `test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; ...`.
    let summary =
        stdout.lines().find(|l| l.starts_with("test result: ")).unwrap_or_else(|| panic!("no summary: {}", explain()));
    assert!(
        summary.starts_with("test result: ok. 1 passed; 0 failed; 0 ignored;"),
        "not exactly one test ran: {}",
        explain()
    );
}
