//! The host pipeline served as laya 0.4.15 (`[model] laya = "0.4.15"`) against laya 0.4.15
//! itself (tests/fixtures/laya-0.4.15, recorded by tools/fixtures/generate_0415.py): request
//! refusals, question validation, token layouts with their budget figures, decoded answers with
//! `usage`, `option_order`, `min_confidence`, calibration and language tables, and the load-time
//! refusals of malformed language, calibration and layout files, all exactly as laya has them.
//! The 0.3.20 fixtures' requests are in it too, re-answered by 0.4.15.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::support::{
    Case, assert_validation, assert_whole_request_refusal, f32s, ints, laya_error, laya_limits, read_cases, text,
};
use laya_edge::bundle::HostBundle;
use laya_edge::decide::{self, MinConfidence, RowOutput};
use laya_edge::pipeline::{self, PipelineError};
use laya_edge::prompt::{self, QuestionErrorKind};
use laya_topics::json::{self, ParseOptions};
use laya_topics::wire::LayaVersion;
use laya_topics::{Request, Value};
use test_kit::{fixtures_0415_dir, model_dir_0415};

const LAYA: LayaVersion = LayaVersion::V0_4_15;

/// Every case of the 0.4.15 `cases.jsonl`, in file order.
fn cases() -> &'static [Case] {
    static CASES: OnceLock<Vec<Case>> = OnceLock::new();
    CASES.get_or_init(|| read_cases(&fixtures_0415_dir().join("cases.jsonl")))
}

/// A fixture model loaded as laya 0.4.15 serves it, once per test binary.
fn bundle(name: &str) -> Arc<HostBundle> {
    static BUNDLES: OnceLock<Mutex<HashMap<String, Arc<HostBundle>>>> = OnceLock::new();
    let mut map = BUNDLES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    map.entry(name.to_owned())
        .or_insert_with(|| {
            let b = HostBundle::load_as(&model_dir_0415(name), LAYA).unwrap_or_else(|e| panic!("{name}: {e}"));
            Arc::new(b)
        })
        .clone()
}

fn request_of(case: &Case) -> Request {
    Request::from_value(case.field("request").clone()).unwrap_or_else(|e| panic!("{}: {e}", case.id))
}

/// Cases laya answered question by question (no request-wide refusal).
fn answered_cases() -> impl Iterator<Item = &'static Case> {
    cases().iter().filter(|c| *c.field("request_check") == Value::Null)
}

fn prepared_of(case: &Case) -> Vec<prompt::Prepared> {
    let b = bundle(&case.model);
    let request = request_of(case);
    prompt::prepare_as(LAYA, b.config.option_layout, &b.tokenizer, &request, laya_limits(&request, &b))
        .unwrap_or_else(|e| panic!("{}: {e}", case.id))
}

#[test]
fn the_fixtures_cover_every_model_and_feature_of_laya_0_4_15() {
    let count = |model: &str| cases().iter().filter(|c| c.model == model).count();
    for (model, least) in [
        ("bpe-t5", 250),
        ("wp-t4", 170),
        ("bpe-small", 170),
        ("bpe-t5-parallel", 60),
        ("bpe-t5-calibrated", 30),
        ("bpe-t5-lang", 20),
    ] {
        assert!(count(model) >= least, "{model}: only {} cases", count(model));
    }
    let requests = |key: &str| cases().iter().filter(|c| c.field("request").get(key).is_some()).count();
    assert!(requests("min_confidence") >= 20, "min_confidence in {} requests", requests("min_confidence"));
    let with_order = cases()
        .iter()
        .filter(|c| {
            c.field("request")
                .get("questions")
                .and_then(Value::as_object)
                .is_some_and(|q| q.values().any(|d| d.get("option_order").is_some()))
        })
        .count();
    assert!(with_order >= 20, "option_order in {with_order} requests");
}

#[test]
fn requests_laya_refuses_as_a_whole_are_refused_with_its_message() {
    let mut refused = 0;
    for case in cases() {
        let want = case.field("request_check");
        let b = bundle(&case.model);
        let got = pipeline::prepare(&b, &request_of(case), usize::MAX);
        if *want == Value::Null {
            assert!(!matches!(got, Err(PipelineError::Refused(_))), "{}: refused: {:?}", case.id, got.err());
            continue;
        }
        let (_, message) = laya_error(want);
        match got {
            Err(PipelineError::Refused(m)) => assert_eq!(m, message, "{}", case.id),
            other => panic!("{}: laya refused it ({message}), we: {:?}", case.id, other.map(|_| ())),
        }
        refused += 1;
    }
    assert!(refused >= 10, "only {refused} refused requests");
}

#[test]
fn question_validation_gives_layas_0_4_15_verdicts_and_messages() {
    let checked: usize = answered_cases().map(|case| assert_validation(case, &prepared_of(case))).sum();
    assert!(checked >= 150, "only {checked} invalid questions");
}

#[test]
fn token_layouts_and_their_budget_figures_are_layas_0_4_15() {
    let (mut rows, mut refused, mut parallel_rows) = (0, 0, 0);
    for case in answered_cases() {
        let layout = case.field("layout").as_object().expect("layout is an object");
        for p in prepared_of(case) {
            let Some(want) = layout.get(&p.qid) else {
                assert!(p.outcome.is_err(), "{} {}: laya refused it before layout", case.id, p.qid);
                continue;
            };
            if let Some(err) = want.get("error") {
                let (kind, message) = laya_error(err);
                let got = p.outcome.as_ref().err().unwrap_or_else(|| panic!("{} {}: laya: {message}", case.id, p.qid));
                if kind == "ValueError" {
                    assert_eq!(got.kind, QuestionErrorKind::DoesNotFit, "{} {}", case.id, p.qid);
                    assert_eq!(got.message, message, "{} {}", case.id, p.qid);
                }
                refused += 1;
                continue;
            }
            let id = format!("{} {}", case.id, p.qid);
            let (_, row) = p.outcome.as_ref().unwrap_or_else(|e| panic!("{id}: {e}"));
            let ids: Vec<i64> = row.input_ids.iter().map(|&i| i64::from(i)).collect();
            assert_eq!(ids, ints(want.get("input_ids").unwrap()), "{id}: input_ids");
            let markers: Vec<i64> = row.marker_pos.iter().map(|&i| i64::from(i)).collect();
            assert_eq!(markers, ints(want.get("marker_pos").unwrap()), "{id}: marker_pos");
            assert_eq!(Some(row.qtype.index() as i64), want.get("qtype").and_then(Value::as_i64), "{id}");
            // The parallel checkpoint's rows carry laya's position and option ids; no other does.
            let layout = row.layout.as_ref().map(|l| (l.position_ids.clone(), l.option_ids.clone()));
            let recorded =
                want.get("position_ids").map(|p| (ints(p), ints(want.get("option_ids").expect("option_ids"))));
            let as_i64 = |v: &[u32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>();
            assert_eq!(layout.as_ref().map(|(p, o)| (as_i64(p), as_i64(o))), recorded, "{id}: parallel layout");
            parallel_rows += usize::from(row.layout.is_some());
            let stats = p.stats.unwrap_or_else(|| panic!("{id}: no layout figures"));
            let state = want.get("state_stats").expect("state_stats");
            let n = |v: &Value, k: &str| v.get(k).and_then(Value::as_i64).unwrap_or_else(|| panic!("{id}: {k}"));
            assert_eq!(stats.state_tokens as i64, n(state, "state_tokens"), "{id}");
            assert_eq!(stats.state_tokens_dropped as i64, n(state, "state_tokens_dropped"), "{id}");
            assert_eq!(Some(&Value::Bool(stats.truncated())), state.get("truncated"), "{id}");
            let options = want.get("options").expect("options");
            assert_eq!(stats.options as i64, n(options, "options"), "{id}");
            assert_eq!(stats.options_distinct as i64, n(options, "options_distinct"), "{id}");
            assert_eq!(
                stats.tokens_per_option.map(|t| t as i64),
                options.get("tokens_per_option").and_then(Value::as_i64)
            );
            rows += 1;
        }
    }
    assert!(rows >= 1500 && refused >= 10, "compared {rows} rows and {refused} refusals");
    // 139 rows of the parallel checkpoint in the fixtures.
    assert!(parallel_rows >= 130, "only {parallel_rows} parallel rows");
}

#[test]
fn decoding_layas_logits_gives_layas_0_4_15_answers_usage_and_gate_exactly() {
    let mut compared = 0;
    for case in answered_cases() {
        let result = case.field("result");
        if result.get("error").is_some() {
            continue;
        }
        let prepared = prepared_of(case);
        let forward = case.field("forward");
        let outputs: Vec<RowOutput> = prepared
            .iter()
            .filter(|p| p.outcome.is_ok())
            .map(|p| {
                let f = forward.get(&p.qid).unwrap_or_else(|| panic!("{} {}: no forward record", case.id, p.qid));
                RowOutput { logits: f32s(f.get("logits").unwrap()), act_probs: f32s(f.get("act_probs").unwrap()) }
            })
            .collect();
        let b = bundle(&case.model);
        let request = request_of(case);
        let gate = MinConfidence::of_request(LAYA, &request).unwrap_or_else(|e| panic!("{}: {e}", case.id));
        let ours = decide::assemble_as(
            LAYA,
            &prepared,
            &outputs,
            &b.config.temperatures,
            request.lang.as_deref(),
            gate.as_ref(),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", case.id));
        // laya answered the valid questions only; invalid ones carry our errors in their place.
        let mut ours = ours.to_value();
        if let Value::Object(m) = &mut ours
            && let Some(Value::Object(answers)) = m.get_mut("answers")
        {
            answers.retain(|_, a| a.get("error").is_none());
        }
        assert_eq!(text(&ours), text(result), "{}", case.id);
        compared += 1;
    }
    assert!(compared >= 600, "only {compared} results compared");
}

#[test]
fn a_whole_request_fails_where_laya_0_4_15_fails_with_the_same_first_message() {
    let failed = answered_cases().filter_map(|case| assert_whole_request_refusal(case, &prepared_of(case))).count();
    assert!(failed >= 100, "only {failed} failed requests");
}

/// A scratch copy of a fixture model (its small files; the weights linked) to write a file into.
fn scratch_copy(model: &str, tag: usize) -> PathBuf {
    let from = model_dir_0415(model);
    let to = std::env::temp_dir().join(format!("laya-0415-load-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&to);
    copy_dir(&from, &to);
    to
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dst = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &dst);
        } else {
            std::fs::copy(entry.path(), dst).unwrap();
        }
    }
}

#[test]
fn malformed_language_calibration_and_layout_files_are_refused_at_load_as_laya_refuses_them() {
    let path = fixtures_0415_dir().join("load_errors.jsonl");
    let text = std::fs::read_to_string(&path).expect("load_errors.jsonl");
    let (mut refused, mut loaded) = (0, 0);
    for (n, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let record = json::parse_str(line, ParseOptions { max_depth: 100 }).expect("a line");
        let model = record.get("model").and_then(Value::as_str).expect("model");
        let file = record.get("file").and_then(Value::as_str).expect("file");
        let dir = scratch_copy(model, n);
        let content = json::to_string(record.get("content").expect("content"), json::Style::PYTHON);
        std::fs::write(dir.join(file), content).unwrap();
        let got = HostBundle::load_as(&dir, LAYA);
        let _ = std::fs::remove_dir_all(&dir);
        match record.get("error") {
            Some(Value::Null) | None => {
                got.unwrap_or_else(|e| panic!("line {}: laya loads {file} {line}; we: {e}", n + 1));
                loaded += 1;
            }
            Some(err) => {
                let (kind, message) = laya_error(err);
                let e = got.err().unwrap_or_else(|| panic!("line {}: laya refused it ({message}); we loaded", n + 1));
                if kind == "ValueError" {
                    assert!(e.to_string().ends_with(message), "line {}: {e}\n laya: {message}", n + 1);
                }
                refused += 1;
            }
        }
    }
    assert!(refused >= 50 && loaded >= 10, "{refused} refused, {loaded} loaded");
}
