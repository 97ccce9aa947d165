//! The `laya-edge` binary on every request recorded from laya 0.3.20 and, with `--laya 0.4.15`,
//! from laya 0.4.15: `layout` gives laya's token rows and validation messages exactly, `predict
//! --backend cpu` laya's answers within the tolerance of the in-process CPU model test
//! (tests/conformance/it/cpu_model.rs: 1e-3, the same choice wherever laya's decision is clear)
//! and laya's usage (0.4.15's with its truncation figures).
//!
//! Cases that ask more than the model's budget (`max_len`/`head_max_len` above the checkpoint's)
//! are left out: laya-edge answers them at the model's budget
//! (tests/conformance/it/request_limits.rs), laya at the request's, as cpu_model.rs does.
//!
//! The in-process tests (tests/conformance/it/host_pipeline.rs and cpu_model.rs) prove the library;
//! these prove the binary a board runs: tools/cross/aarch64.sh runs them against an aarch64 release
//! build under qemu-user (`LAYA_EDGE_BIN`).

use std::collections::BTreeMap;
use std::ffi::OsStr;

use crate::support;
use std::path::PathBuf;

use laya_edge::bundle::HostBundle;
use laya_edge::pipeline;
use laya_edge::prompt::Limits;
use laya_topics::json::{self, ParseOptions, Style};
use laya_topics::wire::LayaVersion;
use laya_topics::{Request, Value};
use test_kit::{fixtures_0415_dir, fixtures_dir, model_dir_0415};

/// One set of recorded fixtures: where they are and which laya recorded them.
#[derive(Clone, Copy)]
struct Fixtures {
    laya: LayaVersion,
}

const LAYA_0_3_20: Fixtures = Fixtures { laya: LayaVersion::V0_3_20 };
const LAYA_0_4_15: Fixtures = Fixtures { laya: LayaVersion::V0_4_15 };

impl Fixtures {
    fn cases_file(self) -> PathBuf {
        match self.laya {
            LayaVersion::V0_3_20 => fixtures_dir().join("cases.jsonl"),
            LayaVersion::V0_4_15 => fixtures_0415_dir().join("cases.jsonl"),
        }
    }

    fn model_dir(self, model: &str) -> PathBuf {
        match self.laya {
            LayaVersion::V0_3_20 => fixtures_dir().join("models").join(model),
            LayaVersion::V0_4_15 => model_dir_0415(model),
        }
    }

    /// `--laya` for the commands.
    fn flag(self) -> [&'static str; 2] {
        ["--laya", self.laya.as_str()]
    }
}

/// The recorded cases, by model, in file order, without those over the model's budget; and how
/// many were left out.
fn cases_by_model(fixtures: Fixtures) -> (BTreeMap<String, Vec<Value>>, usize) {
    let text = std::fs::read_to_string(fixtures.cases_file()).expect("cases.jsonl");
    let mut by_model: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let case = json::parse_str(line, ParseOptions { max_depth: 10_000 }).expect("a case");
        let model = case.get("model").and_then(Value::as_str).expect("model").to_owned();
        by_model.entry(model).or_default().push(case);
    }
    let mut over = 0;
    for (model, cases) in &mut by_model {
        let bundle = HostBundle::load_as(&fixtures.model_dir(model), fixtures.laya).expect("the fixture model");
        let before = cases.len();
        cases.retain(|c| !over_budget(c, &bundle));
        over += before - cases.len();
        cases.retain(within_emulated_rows);
    }
    (by_model, over)
}

/// `LAYA_FIXTURE_MAX_TOKENS`, if set: only the cases none of whose rows laya laid out longer.
/// tools/cross sets it for the emulated run, where a 512-token row costs seconds (the full set
/// took over half an hour under qemu on 2 cores); unset, every case is compared.
fn max_tokens() -> Option<usize> {
    std::env::var("LAYA_FIXTURE_MAX_TOKENS").ok().map(|v| v.parse().expect("LAYA_FIXTURE_MAX_TOKENS is a number"))
}

fn within_emulated_rows(case: &Value) -> bool {
    let Some(max) = max_tokens() else { return true };
    case.get("layout").and_then(Value::as_object).is_none_or(|layout| {
        layout.values().all(|q| q.get("input_ids").and_then(Value::as_array).is_none_or(|ids| ids.len() <= max))
    })
}

/// Whether laya-edge lays `case` out under a lower budget than laya did: the request's
/// `max_len`/`head_max_len` exceed the model's, which laya-edge clamps and laya does not.
fn over_budget(case: &Value, bundle: &HostBundle) -> bool {
    let Ok(request) = Request::from_value(field(case, "request").clone()) else { return false };
    let laya = Limits {
        max_len: request.max_len.unwrap_or(bundle.config.limits.max_len),
        head_max_len: request.head_max_len.unwrap_or(bundle.config.limits.head_max_len),
    };
    pipeline::limits_for(&request, bundle.capacity.limits) != laya
}

fn field<'a>(case: &'a Value, name: &str) -> &'a Value {
    case.get(name).unwrap_or_else(|| panic!("case without {name}"))
}

fn case_id(case: &Value) -> String {
    case.get("id").map(|v| json::to_string(v, Style::COMPACT)).unwrap_or_default()
}

/// Runs `laya-edge COMMAND --model MODEL --laya V [extra]` on every case's request of `model`,
/// one output line per request.
fn run_on_cases(fixtures: Fixtures, command: &str, model: &str, cases: &[Value], extra: &[&str]) -> Vec<Value> {
    let input: String = cases.iter().map(|c| json::to_string(field(c, "request"), Style::COMPACT) + "\n").collect();
    let dir = fixtures.model_dir(model);
    let mut args: Vec<&OsStr> = vec![OsStr::new(command), OsStr::new("--model"), dir.as_os_str()];
    args.extend(fixtures.flag().into_iter().map(OsStr::new));
    args.extend(extra.iter().map(OsStr::new));
    let (stdout, stderr, ok) = support::run_cli(&args, &[], &input);
    assert!(ok, "laya-edge {command} on {model} failed: {stderr}");
    let lines: Vec<Value> =
        stdout.lines().map(|l| json::parse_str(l, ParseOptions { max_depth: 10_000 }).expect("a JSON line")).collect();
    assert_eq!(lines.len(), cases.len(), "{command} on {model}: one line per request");
    lines
}

/// laya's error record `{"type", "message"}`; only a `ValueError`'s message is laya's text to match.
fn value_error_message(record: &Value) -> Option<&str> {
    (record.get("type").and_then(Value::as_str) == Some("ValueError"))
        .then(|| record.get("message").and_then(Value::as_str))
        .flatten()
}

#[test]
fn layout_gives_layas_rows_and_messages_for_every_recorded_request_within_the_budget() {
    layout_matches(LAYA_0_3_20, 1000);
}

#[test]
fn layout_with_laya_0_4_15_gives_its_rows_and_messages_for_every_recorded_request_within_the_budget() {
    layout_matches(LAYA_0_4_15, 1500);
}

fn layout_matches(fixtures: Fixtures, least_rows: usize) {
    let (mut rows, mut errors) = (0, 0);
    let (by_model, over) = cases_by_model(fixtures);
    assert!(over < 50, "{over} cases over the model's budget left out");
    for (model, cases) in by_model {
        let lines = run_on_cases(fixtures, "layout", &model, &cases, &[]);
        for (case, line) in cases.iter().zip(&lines) {
            let id = case_id(case);
            // A request laya refused as a whole (laya 0.4.15: a null state, a bad min_confidence).
            if let Some(want) = case.get("request_check").filter(|v| **v != Value::Null) {
                let message = line.get("error").and_then(|e| e.get("message")).and_then(Value::as_str);
                assert_eq!(message, want.get("message").and_then(Value::as_str), "{id}: {line:?}");
                errors += 1;
                continue;
            }
            let ours = line.get("questions").and_then(Value::as_object).unwrap_or_else(|| panic!("{id}: {line:?}"));
            let check = field(case, "check").as_object().expect("check is an object");
            let layout = field(case, "layout").as_object().expect("layout is an object");
            assert_eq!(ours.keys().collect::<Vec<_>>(), check.keys().collect::<Vec<_>>(), "{id}: questions");
            for (qid, got) in ours {
                // Refused by laya's validation, or by its layout (does not fit), or laid out.
                let laya_error = match (&check[qid], layout.get(qid)) {
                    (Value::Null, Some(want)) => want.get("error"),
                    (verdict, _) => Some(verdict),
                };
                if let Some(err) = laya_error {
                    let message = got.get("error").and_then(|e| e.get("message")).and_then(Value::as_str);
                    assert!(message.is_some(), "{id} {qid}: laya refused it, we laid it out");
                    if let Some(want) = value_error_message(err) {
                        assert_eq!(message, Some(want), "{id} {qid}");
                    }
                    errors += 1;
                    continue;
                }
                let want = &layout[qid];
                for key in ["input_ids", "marker_pos", "qtype", "position_ids", "option_ids"] {
                    assert_eq!(got.get(key), want.get(key), "{id} {qid}: {key}");
                }
                rows += 1;
            }
        }
    }
    let least = if max_tokens().is_some() { least_rows / 2 } else { least_rows };
    assert!(rows >= least && errors >= 50, "compared {rows} rows and {errors} refusals");
}

#[test]
fn predict_on_the_cpu_gives_layas_answers_and_usage_for_every_recorded_request_within_the_budget() {
    predict_matches(LAYA_0_3_20, 400);
}

#[test]
fn predict_on_the_cpu_with_laya_0_4_15_gives_its_answers_and_usage_for_every_recorded_request_within_the_budget() {
    predict_matches(LAYA_0_4_15, 550);
}

fn predict_matches(fixtures: Fixtures, least_requests: usize) {
    let mut compared = 0;
    for (model, cases) in cases_by_model(fixtures).0 {
        let lines = run_on_cases(fixtures, "predict", &model, &cases, &["--backend", "cpu"]);
        for (case, ours) in cases.iter().zip(&lines) {
            let id = case_id(case);
            if let Some(want) = case.get("request_check").filter(|v| **v != Value::Null) {
                let message = ours.get("error").and_then(|e| e.get("message")).and_then(Value::as_str);
                assert_eq!(message, want.get("message").and_then(Value::as_str), "{id}: {ours:?}");
                continue;
            }
            let laya = field(case, "result");
            if laya.get("error").is_some() {
                assert!(ours.get("error").is_some(), "{id}: laya refused the request, we answered it: {ours:?}");
                continue;
            }
            let laya_answers = laya.get("answers").and_then(Value::as_object).expect("laya's answers");
            let ours_answers =
                ours.get("answers").and_then(Value::as_object).unwrap_or_else(|| panic!("{id}: {ours:?}"));
            for (qid, a) in ours_answers {
                match laya_answers.get(qid) {
                    Some(want) => test_kit::assert_like_laya(&id, qid, a, want, 1e-3),
                    // laya answered only the valid questions; ours carries the error in place.
                    None => assert!(a.get("error").is_some(), "{id} {qid}: laya had no answer"),
                }
            }
            assert_eq!(ours.get("usage"), laya.get("usage"), "{id}: usage");
            assert_eq!(ours.get("model"), laya.get("model"), "{id}: model");
            compared += 1;
        }
    }
    let least = if max_tokens().is_some() { least_requests * 5 / 8 } else { least_requests };
    assert!(compared >= least, "compared only {compared} requests");
}
