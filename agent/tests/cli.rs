//! The `laya-edge` binary end to end.

mod common;

use std::ffi::OsStr;
use std::path::PathBuf;

use laya_topics::Value;
use laya_topics::json::{ParseOptions, parse_str};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/laya-0.3.20")
}

fn run(args: &[&str], stdin: &str) -> (String, String, bool) {
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    common::run_cli(&args, &[], stdin)
}

#[test]
fn layout_prints_lavas_rows_and_goes_on_after_a_bad_line() {
    let cases = std::fs::read_to_string(fixtures().join("cases.jsonl")).expect("cases");
    let first = parse_str(cases.lines().next().expect("a case"), ParseOptions::default()).expect("json");
    let request =
        laya_topics::json::to_string(first.get("request").expect("request"), laya_topics::json::Style::COMPACT);
    let input = format!(
        "{request}\nnot json\n\n{{\"state\": 1, \"questions\": {{\"q\": {{\"type\": \"bogus\"}}}}}}\n{request}\n"
    );
    let model = fixtures().join("models/bpe-t5");
    let (stdout, stderr, ok) = run(&["layout", "--model", model.to_str().expect("utf-8 path")], &input);
    assert!(ok, "stderr: {stderr}");
    let lines: Vec<Value> = stdout.lines().map(|l| parse_str(l, ParseOptions::default()).expect("json line")).collect();
    assert_eq!(lines.len(), 4, "one line per non-blank input line: {stdout}");
    let want = first.get("layout").expect("layout");
    for qid in ["refund", "dept", "urgency"] {
        let got = lines[0].get("questions").and_then(|q| q.get(qid)).expect("question row");
        assert_eq!(got.get("input_ids"), want.get(qid).and_then(|w| w.get("input_ids")));
        assert_eq!(got.get("marker_pos"), want.get(qid).and_then(|w| w.get("marker_pos")));
    }
    assert_eq!(lines[1].get("error").and_then(|e| e.get("code")), Some(&Value::from("bad_request")));
    let bogus =
        lines[2].get("questions").and_then(|q| q.get("q")).and_then(|q| q.get("error")).expect("error in place");
    assert_eq!(
        bogus.get("message"),
        Some(&Value::from("question 'q': unknown type 'bogus'; use one of ['choice', 'noul', 'score']"))
    );
    assert_eq!(lines[3], lines[0]);
}

#[test]
fn a_missing_model_directory_is_a_clear_error() {
    let (_, stderr, ok) = run(&["layout", "--model", "/nonexistent/model"], "");
    assert!(!ok);
    assert!(stderr.contains("/nonexistent/model"), "{stderr}");
}

#[test]
fn predict_answers_each_line_and_reports_bad_lines() {
    let cases = std::fs::read_to_string(fixtures().join("cases.jsonl")).expect("cases");
    let first = parse_str(cases.lines().next().expect("a case"), ParseOptions::default()).expect("json");
    let request =
        laya_topics::json::to_string(first.get("request").expect("request"), laya_topics::json::Style::COMPACT);
    let input = format!(
        "{request}\n[1, 2]\n{{\"id\": 7, \"state\": \"x\", \"questions\": {{\"ok\": {{\"type\": \"noul\", \"instructions\": \"fine?\"}}, \"bad\": {{\"type\": \"score\", \"instructions\": \"?\", \"criteria\": []}}}}}}\n"
    );
    let model = fixtures().join("models/bpe-t5");
    let (stdout, stderr, ok) =
        run(&["predict", "--model", model.to_str().expect("utf-8 path"), "--threads", "1"], &input);
    assert!(ok, "stderr: {stderr}");
    let lines: Vec<Value> = stdout.lines().map(|l| parse_str(l, ParseOptions::default()).expect("json line")).collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    let want = first.get("result").expect("laya's result");
    assert_eq!(lines[0].get("id"), first.get("request").and_then(|r| r.get("id")));
    assert_eq!(lines[0].get("model"), want.get("model"));
    assert_eq!(lines[0].get("usage"), want.get("usage"));
    let choice = |v: &Value| v.get("answers").and_then(|a| a.get("dept")).and_then(|d| d.get("choice")).cloned();
    assert_eq!(choice(&lines[0]), choice(want));
    assert_eq!(lines[1].get("error").and_then(|e| e.get("code")), Some(&Value::from("bad_request")));
    let answers = lines[2].get("answers").expect("answers");
    assert_eq!(answers.get("ok").and_then(|a| a.get("type")), Some(&Value::from("noul")));
    assert_eq!(
        answers.get("bad").and_then(|a| a.get("error")).and_then(|e| e.get("message")),
        Some(&Value::from("question 'bad': a score question needs at least one level"))
    );
}
