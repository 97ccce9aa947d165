//! `topics::jev` against what laya.serve 0.4.15 itself answered
//! (`tests/fixtures/laya-serve-0.4.15/cases.jsonl`, `contract.json`).
//!
//! Replayed: every recorded refusal on a decision route that laya.serve decides without the
//! model (rows 5 to 18b of `docs/http-contract.md`) gives the same status and `detail` from the
//! recorded body bytes; every recorded 200 on a decision route passes the checks; and every
//! recorded 200 body is rendered back from the laya result it holds (the body without
//! `routing` and `x_jev_confidence`), strict and not.
//!
//! Skipped classes, because the pure checks cannot see them: authentication (401, the `keyed`
//! and `tight` servers), admission (503), the body's size while reading and its read timeout
//! (413 `request body too large`, 408), laya's own `ValueError`s that need the model (422
//! `question ...`, options over the budget on `small`; an unknown `task` is replayed, through
//! `ModelNames::resolve_task`), inference failures
//! (500), and the routes Starlette answers (404, 405, 307, `/health`, `/docs`).

use std::collections::BTreeMap;

use laya_topics::jev::{self, Kind, Routing, Settings};
use laya_topics::json::{self, ParseOptions, Style};
use laya_topics::{Map, Value};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/laya-serve-0.4.15");

fn read_json_lines(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(format!("{FIXTURES}/{name}")).expect("fixture file");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| json::parse_str(l, ParseOptions { max_depth: 10_000 }).expect("a JSON line"))
        .collect()
}

fn base64(text: &str) -> Vec<u8> {
    let digit = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let clean: Vec<u8> = text.bytes().filter(|c| *c != b'=').collect();
    let mut out = Vec::new();
    for chunk in clean.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= u32::from(digit(*c)) << (18 - 6 * i);
        }
        out.extend_from_slice(&acc.to_be_bytes()[1..chunk.len()]);
    }
    out
}

/// The body bytes a case sent.
fn body_bytes(request: &Value) -> Vec<u8> {
    if let Some(Value::Str(b)) = request.get("body") {
        return b.as_bytes().to_vec();
    }
    if let Some(Value::Str(b)) = request.get("body_base64") {
        return base64(b);
    }
    if let Some(Value::Array(parts)) = request.get("body_parts") {
        let mut out = String::new();
        for part in parts {
            let p = part.as_array().expect("[text, repeat]");
            let n = p[1].as_i64().expect("a repeat count");
            out.push_str(&p[0].as_str().expect("text").repeat(usize::try_from(n).expect("a count")));
        }
        return out.into_bytes();
    }
    Vec::new()
}

struct Case {
    id: String,
    server: String,
    path: String,
    body: Vec<u8>,
    status: i64,
    response: Value,
}

fn cases() -> Vec<Case> {
    read_json_lines("cases.jsonl")
        .into_iter()
        .map(|c| {
            let text = |v: Option<&Value>| v.and_then(Value::as_str).expect("a string").to_string();
            let request = c.get("request").expect("request");
            let response = c.get("response").expect("response");
            Case {
                id: text(c.get("id")),
                server: text(c.get("server")),
                path: text(request.get("path")),
                body: body_bytes(request),
                status: response.get("status").and_then(Value::as_i64).expect("status"),
                response: response.get("body").cloned().unwrap_or(Value::Null),
            }
        })
        .collect()
}

fn settings() -> Settings {
    Settings { models: jev::ModelNames::laya_0_4_15(&["edge"]), ..Settings::default() }
}

/// The refusal the pure checks give for a body on `path` (`Ok` when they accept it).
fn check(path: &str, body: &[u8]) -> Result<(), jev::Refusal> {
    match path {
        "/v1/systemone" => jev::check_single(body, &settings()).and_then(|s| route(&s.controls)),
        "/v1/systemone/batch" => jev::check_batch(body, &settings()).and_then(|b| route(&b.controls)),
        other => panic!("not a decision route: {other}"),
    }
}

/// The door's next step: a `task` without a `model` names the checkpoint.
fn route(controls: &jev::Controls) -> Result<(), jev::Refusal> {
    match (&controls.model, &controls.task) {
        (jev::ModelChoice::Auto, Some(task)) => settings().models.resolve_task(task).map(|_| ()),
        _ => Ok(()),
    }
}

/// Why a recorded refusal is out of the pure checks' reach, or `None` when it is in.
fn skipped_class(case: &Case) -> Option<&'static str> {
    let detail = case.response.get("detail").and_then(Value::as_str).unwrap_or("");
    if !matches!(case.path.as_str(), "/v1/systemone" | "/v1/systemone/batch") {
        return Some("a route Starlette answers");
    }
    match case.status {
        401 => Some("authentication"),
        503 => Some("admission"),
        408 => Some("the body's read timeout"),
        500 => Some("inference failed"),
        404 | 405 | 307 => Some("a route Starlette answers"),
        413 if detail == Kind::BodyTooLarge.template() => Some("the body's size while reading"),
        422 if detail.starts_with("question ") => Some("laya's ValueError for a question (the model)"),
        422 if case.server == "small" => Some("laya's ValueError for the token budget (the model)"),
        _ => None,
    }
}

#[test]
fn every_refusal_laya_serve_decides_without_the_model_is_given_with_its_status_and_detail() {
    let mut replayed = 0;
    let mut skipped: BTreeMap<&str, usize> = BTreeMap::new();
    for case in cases().iter().filter(|c| c.status != 200) {
        if let Some(class) = skipped_class(case) {
            *skipped.entry(class).or_default() += 1;
            continue;
        }
        let detail = case.response.get("detail").and_then(Value::as_str).expect("a detail");
        let refusal = check(&case.path, &case.body).expect_err(&format!("{} should be refused", case.id));
        assert_eq!(
            (i64::from(refusal.status), refusal.detail.as_str()),
            (case.status, detail),
            "{}: status and detail",
            case.id
        );
        assert_eq!(refusal.body(), json::to_string(&case.response, Style::COMPACT), "{}: body", case.id);
        replayed += 1;
    }
    // Of the 147 recorded refusals, 96 are decided without the model (an unknown task included).
    assert_eq!(replayed, 96, "replayed refusals (skipped: {skipped:?})");
}

#[test]
fn every_recorded_success_passes_the_checks() {
    let mut checked = 0;
    for case in cases().iter().filter(|c| c.status == 200 && c.path.starts_with("/v1/systemone")) {
        if let Err(r) = check(&case.path, &case.body) {
            panic!("{}: refused with {} {}", case.id, r.status, r.detail);
        }
        checked += 1;
    }
    assert_eq!(checked, 66, "decision-route successes");
}

/// laya's result inside a recorded non-strict body: the body without `routing`, and without
/// `x_jev_confidence` in its answers.
fn laya_result(body: &Value) -> (Value, Routing) {
    let mut m = body.as_object().expect("an object").clone();
    let routing = m.shift_remove("routing").expect("routing");
    if let Some(Value::Object(answers)) = m.get_mut("answers") {
        for a in answers.values_mut() {
            if let Value::Object(a) = a {
                a.shift_remove("x_jev_confidence");
            }
        }
    }
    let text = |k: &str| routing.get(k).cloned().unwrap_or(Value::Null);
    let routing = Routing {
        model: text("model"),
        repo: text("repo"),
        reason: text("reason").as_str().expect("a reason").to_string(),
        detection: text("detection"),
        workflow: text("workflow"),
    };
    (Value::Object(m), routing)
}

fn render_case(path: &str, body: &Value, strict: bool) -> Value {
    if path.ends_with("/batch") {
        let results: Vec<(Value, Routing)> =
            body.get("results").and_then(Value::as_array).expect("results").iter().map(laya_result).collect();
        jev::render_batch(&results, strict)
    } else {
        let (result, routing) = laya_result(body);
        jev::render(&result, &routing, strict)
    }
}

#[test]
fn every_recorded_answer_is_rendered_back_from_its_laya_result() {
    let all = cases();
    let mut rendered = 0;
    let mut strict_rendered = 0;
    for case in all.iter().filter(|c| c.status == 200 && c.path.starts_with("/v1/systemone")) {
        if case.server == "strict" {
            // The same request on the open server holds laya's whole result.
            let request = jev::body::loads(&case.body).expect("a JSON body").value;
            let Some(open) = all.iter().find(|o| {
                o.server == "open"
                    && o.status == 200
                    && o.path == case.path
                    && jev::body::loads(&o.body).is_ok_and(|b| b.value == request)
            }) else {
                continue;
            };
            let got = jev::body_text(&render_case(&open.path, &open.response, true));
            assert_eq!(got, json::to_string(&case.response, Style::COMPACT), "{} (strict, from {})", case.id, open.id);
            strict_rendered += 1;
            continue;
        }
        let got = jev::body_text(&render_case(&case.path, &case.response, false));
        assert_eq!(got, json::to_string(&case.response, Style::COMPACT), "{}", case.id);
        rendered += 1;
    }
    assert_eq!((rendered, strict_rendered), (61, 3), "rendered (non-strict, strict)");
}

#[test]
fn a_strict_result_keeps_only_jevs_fields_in_jevs_order() {
    let all = cases();
    for case in all.iter().filter(|c| c.server == "strict" && c.status == 200) {
        // Projecting again changes nothing: the recorded strict body is already Jev's shape.
        let got = jev::body_text(&if case.path.ends_with("/batch") {
            let results: Vec<(Value, Routing)> = case
                .response
                .get("results")
                .and_then(Value::as_array)
                .expect("results")
                .iter()
                .map(|r| (r.clone(), Routing::explicit_model("edge", "unused")))
                .collect();
            jev::render_batch(&results, true)
        } else {
            jev::render(&case.response, &Routing::explicit_model("edge", "unused"), true)
        });
        assert_eq!(got, json::to_string(&case.response, Style::COMPACT), "{}", case.id);
    }
}

#[test]
fn the_routing_report_for_a_named_model_is_the_one_laya_serve_wrote() {
    for case in cases().iter().filter(|c| c.status == 200 && c.path == "/v1/systemone" && c.server == "open") {
        let Some(routing) = case.response.get("routing") else { continue };
        let name = routing.get("model").and_then(Value::as_str).expect("a name");
        let repo = routing.get("repo").and_then(Value::as_str).expect("a repo");
        let reason = routing.get("reason").and_then(Value::as_str).expect("a reason");
        let ours = match reason.strip_prefix("explicit task=") {
            Some(_) => {
                let body = jev::check_single(&case.body, &settings()).expect("accepted");
                let task = body.controls.task.as_ref().and_then(Value::as_str).expect("a task");
                Routing::explicit_task(name, repo, task)
            }
            None => Routing::explicit_model(name, repo),
        };
        assert_eq!(ours.to_value(), *routing, "{}", case.id);
    }
}

#[test]
fn the_refusal_table_is_the_one_contract_json_records() {
    let contract = json::parse_str(
        &std::fs::read_to_string(format!("{FIXTURES}/contract.json")).expect("contract.json"),
        ParseOptions::default(),
    )
    .expect("JSON");
    let rows = contract.get("refusals").and_then(Value::as_array).expect("refusals");
    let ids: Vec<&str> = rows.iter().filter_map(|r| r.get("id").and_then(Value::as_str)).collect();
    let ours: Vec<&str> = Kind::ALL.iter().map(|k| k.id()).collect();
    assert_eq!(ours, ids, "the same rows in the same order");
    for (kind, row) in Kind::ALL.iter().zip(rows) {
        let text = row.get("detail").or_else(|| row.get("detail_template")).and_then(Value::as_str);
        assert_eq!(Some(kind.template()), text, "{}", kind.id());
        assert_eq!(Some(i64::from(kind.status())), row.get("status").and_then(Value::as_i64), "{}", kind.id());
    }
    let limits = contract.get("limits").expect("limits");
    let limit = |k: &str| limits.get(k).and_then(Value::as_i64).and_then(|v| u64::try_from(v).ok());
    use laya_topics::jev::contract as c;
    let table: [(&str, u64); 12] = [
        ("max_body_bytes", c::MAX_BODY_BYTES as u64),
        ("max_state_chars", c::MAX_STATE_CHARS as u64),
        ("max_questions", c::MAX_QUESTIONS as u64),
        ("max_batch_states", c::MAX_BATCH_STATES as u64),
        ("max_choice_options", c::MAX_CHOICE_OPTIONS as u64),
        ("max_choice_options_with_tournament", c::MAX_TOURNAMENT_CHOICE_OPTIONS as u64),
        ("max_score_levels", c::MAX_SCORE_LEVELS as u64),
        ("max_total_options", c::MAX_TOTAL_OPTIONS as u64),
        ("max_token_budget_default", c::DEFAULT_MAX_TOKEN_BUDGET),
        ("max_batch_tokens_default", c::DEFAULT_MAX_BATCH_TOKENS),
        ("batch_row_tokens_assumed", c::BATCH_ROW_TOKENS_ASSUMED),
        ("state_probe_values", c::STATE_PROBE_VALUES as u64),
    ];
    for (key, ours) in table {
        assert_eq!(limit(key), Some(ours), "{key}");
    }
    assert_eq!(Kind::Busy.refusal(&[]).retry_after, Some(1));
    assert_eq!(Kind::NotJson.refusal(&[]).retry_after, None);
}

#[test]
fn a_refused_question_refuses_the_request_with_the_first_ones_text() {
    use laya_topics::{Answer, AnswerError, PredictResult, Usage};
    let error = |m: &str| Answer::Error(AnswerError { code: "invalid_question".into(), message: m.into() });
    let noul = Answer::Noul {
        noul: 0.5,
        confidence: 0.5,
        answer_confidence: 0.5,
        action: laya_topics::Action { act_probability: 0.5 },
        gate: None,
    };
    let mut result = PredictResult {
        model: "laya-rl-agent".into(),
        answers: vec![
            ("a".into(), noul.clone()),
            ("b1".into(), error("question 'b1': unknown type 'x'; use one of ['choice', 'noul', 'score']")),
            ("b2".into(), error("question 'b2': no 'instructions'; add the text the model should answer")),
        ],
        usage: Usage::default(),
    };
    let refusal = jev::question_refusal(&result).expect("refused");
    assert_eq!((refusal.status, refusal.kind), (422, Kind::LayaValueError));
    assert_eq!(refusal.detail, "question 'b1': unknown type 'x'; use one of ['choice', 'noul', 'score']");
    result.answers.retain(|(q, _)| q == "a");
    assert_eq!(jev::question_refusal(&result), None);
    let body = jev::render_result(&result, &Routing::explicit_model("edge", "/models/edge"), false);
    let answer: &Map = body.get("answers").and_then(|a| a.get("a")).and_then(Value::as_object).expect("a");
    assert!(!answer.contains_key("x_jev_confidence"), "a noul answer has no Jev confidence");
}

fn refused(path: &str, body: &str) -> (u16, String) {
    let r = check(path, body.as_bytes()).expect_err("refused");
    (r.status, r.detail)
}

#[test]
fn a_model_name_auto_routes_unless_it_names_a_checkpoint_or_looks_like_a_path() {
    use laya_topics::jev::ModelChoice::{Auto, Named};
    let names = jev::ModelNames::laya_0_4_15(&["edge"]);
    let resolve = |text: &str| {
        let v = json::parse_str(text, ParseOptions::default()).expect("JSON");
        names.resolve(Some(&v)).map_err(|r| r.detail)
    };
    for falsy in ["null", "\"\"", "0", "false", "[]", "{}"] {
        assert_eq!(resolve(falsy), Ok(Auto), "{falsy}");
    }
    assert_eq!(resolve("\" EDGE \""), Ok(Named("edge".into())));
    assert_eq!(resolve("\"ML\""), Ok(Named("multilingual".into())));
    assert_eq!(resolve("\"convaiinnovations/laya-typed-decisions\""), Ok(Named("typed-decisions".into())));
    assert_eq!(resolve("\"ConvAIInnovations/Laya\""), Ok(Auto), "the bundle id auto-routes");
    assert_eq!(resolve("\"jev-1\""), Ok(Auto));
    assert_eq!(resolve("5"), Ok(Auto));
    let refusal = resolve(r#"{"a": "/x"}"#).expect_err("a path inside str() of an object");
    assert!(refusal.starts_with("unknown model {'a': '/x'}; choose one of ['edge', "), "{refusal}");
    assert!(resolve("\"a\\\\b\"").is_err(), "a backslash is a path");
}

#[test]
fn controls_come_back_validated_in_the_form_laya_passes_them_on() {
    let body = r#"{"state": "s", "questions": {}, "model": "Edge", "max_len": 8192, "head_max_len": 1,
        "lang": "de", "lang_guess": null, "task": "english", "min_confidence": {"choice:2": 1, "default": 0.25}}"#;
    let single = jev::check_single(body.as_bytes(), &settings()).expect("accepted");
    let c = &single.controls;
    assert_eq!(c.model, jev::ModelChoice::Named("edge".into()));
    assert_eq!((c.max_len, c.head_max_len), (Some(8192), Some(1)));
    assert_eq!((c.lang.as_deref(), c.lang_guess.as_deref()), (Some("de"), None));
    assert_eq!(c.task, Some(Value::from("english")));
    assert_eq!(
        c.min_confidence.as_ref().map(|m| json::to_string(&m.to_value(), Style::COMPACT)),
        Some(r#"{"choice:2":1.0,"default":0.25}"#.to_string())
    );
    let huge = format!(r#"{{"state": "s", "questions": {{}}, "min_confidence": 1{}}}"#, "0".repeat(400));
    assert_eq!(refused("/v1/systemone", &huge).0, 422, "an integer past float range is out of range");
}

#[test]
fn a_batch_plans_its_passes_as_laya_serve_does() {
    let batch = |extra: &str| {
        let states = vec!["\"s\""; 64].join(", ");
        let questions: Vec<String> =
            (0..8).map(|i| format!(r#""q{i}": {{"type": "noul", "instructions": "?"}}"#)).collect();
        let body = format!(r#"{{"states": [{states}], "questions": {{{}}}{extra}}}"#, questions.join(", "));
        jev::check_batch(body.as_bytes(), &settings()).expect("accepted")
    };
    // 64 states x 8 questions x 512 assumed tokens passes 131072: 256 rows a pass, 32 states.
    assert_eq!(batch("").planned_batch_size(131_072), Some(32));
    assert_eq!(batch(r#", "batch_size": 5"#).planned_batch_size(131_072), Some(5));
    assert_eq!(batch(r#", "batch_size": 99999999999999999999999"#).planned_batch_size(131_072), Some(32));
    assert_eq!(batch(r#", "max_len": 64"#).planned_batch_size(131_072), None, "fits in one pass");
    assert_eq!(batch(r#", "max_len": 64, "sort_by_length": true"#).sort_by_length, Some(true));
}

#[test]
fn the_state_length_counts_code_points_then_the_probe_then_the_python_dump() {
    use laya_topics::jev::refusal::state_length;
    let parse = |t: &str| jev::body::loads(t.as_bytes()).expect("JSON").value;
    assert_eq!(state_length(&parse(r#""ü😀""#)), 2);
    // Numbers stop the probe; the dump counts `", "` and `": "`, escapes and float spellings.
    assert_eq!(state_length(&parse(r#"{"a": [1, 1.0, NaN], "b": "\n"}"#)), r#"{"a": [1, 1.0, NaN], "b": "\n"}"#.len());
    // The probe pops the last value first and stops after 64 pops.
    let many = format!("[{}\"{}\"]", "\"\", ".repeat(100), "x".repeat(50_001));
    assert_eq!(state_length(&parse(&many)), 50_001);
    let hidden = format!("[\"{}\", {}\"\"]", "x".repeat(50_001), "\"\", ".repeat(100));
    // `[` + the quoted string + 101 times `, ""` + `]`, as laya.serve measured it: 50409.
    assert_eq!(state_length(&parse(&hidden)), 50_409, "past the probe: the dump");
}

#[test]
fn jev_confidence_follows_laya_on_single_uniform_and_malformed_answers() {
    let answer =
        |t: &str| json::parse_str(t, ParseOptions::default()).expect("JSON").as_object().cloned().expect("object");
    let conf = |t: &str| jev::render::jev_confidence(&answer(t));
    assert_eq!(conf(r#"{"type": "choice", "probabilities": {"a": 0.3}}"#), Some(1.0));
    assert_eq!(conf(r#"{"type": "choice", "probabilities": {"a": 0, "b": 0}}"#), Some(0.0));
    assert_eq!(conf(r#"{"type": "choice", "probabilities": {"a": true, "b": 0}}"#), None);
    assert_eq!(conf(r#"{"type": "choice", "probabilities": {"a": -0.1, "b": 1.1}}"#), None);
    assert_eq!(conf(r#"{"type": "noul", "probabilities": {"a": 1}}"#), None);
    // Score levels are ordered by their integer value, not as text: "10" comes after "9".
    let levels: Vec<String> = (0..11).map(|i| format!(r#""{i}": {}"#, if i == 10 { "1.0" } else { "0.0" })).collect();
    let scrambled = format!(r#"{{"type": "score", "probabilities": {{{}}}}}"#, levels.join(", "));
    assert_eq!(conf(&scrambled), Some(1.0));
}

/// The typed result the agent would hold for a recorded laya result document.
fn typed_result(doc: &Value) -> laya_topics::PredictResult {
    use laya_topics::{Abstention, Action, Answer, Collapsed, Fit, Gate, PredictResult, Usage};
    let f = |a: &Value, k: &str| a.get(k).and_then(Value::as_f64).unwrap_or_else(|| panic!("{k}"));
    let probs = |a: &Value| -> Vec<(String, f64)> {
        a.get("probabilities")
            .and_then(Value::as_object)
            .expect("probabilities")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_f64().expect("p")))
            .collect()
    };
    let gate = |a: &Value| {
        let abstention = match a.get("abstention").and_then(Value::as_str)? {
            "passed" => Abstention::Passed,
            "abstained" => Abstention::Abstained,
            _ => Abstention::Unevaluated,
        };
        Some(Gate { abstention, threshold: f(a, "abstention_threshold") })
    };
    let answers = doc
        .get("answers")
        .and_then(Value::as_object)
        .expect("answers")
        .iter()
        .map(|(q, a)| {
            let action = Action { act_probability: f(a.get("action").expect("action"), "act_probability") };
            let answer = match a.get("type").and_then(Value::as_str) {
                Some("choice") => Answer::Choice {
                    choice: a.get("choice").cloned().expect("choice"),
                    probabilities: probs(a),
                    confidence: f(a, "confidence"),
                    answer_confidence: f(a, "answer_confidence"),
                    action,
                    gate: gate(a),
                },
                Some("score") => Answer::Score {
                    score: f(a, "score"),
                    legend: a.get("legend").and_then(Value::as_object).expect("legend").clone().into_iter().collect(),
                    probabilities: probs(a),
                    confidence: f(a, "confidence"),
                    answer_confidence: f(a, "answer_confidence"),
                    action,
                    gate: gate(a),
                },
                _ => Answer::Noul {
                    noul: f(a, "noul"),
                    confidence: f(a, "confidence"),
                    answer_confidence: f(a, "answer_confidence"),
                    action,
                    gate: gate(a),
                },
            };
            (q.clone(), answer)
        })
        .collect();
    let u = doc.get("usage").expect("usage");
    let n = |k: &str| u.get(k).and_then(Value::as_i64).map(|v| u64::try_from(v).expect("a count"));
    let fit = n("state_tokens").map(|state_tokens| Fit {
        state_tokens,
        state_tokens_dropped: n("state_tokens_dropped").expect("dropped"),
        truncated_questions: u
            .get("truncated_questions")
            .and_then(Value::as_array)
            .expect("truncated_questions")
            .iter()
            .map(|q| q.as_str().expect("a qid").to_string())
            .collect(),
        collapsed: u
            .get("options")
            .and_then(Value::as_object)
            .map(|o| {
                o.iter()
                    .map(|(q, c)| {
                        let m = |k: &str| c.get(k).and_then(Value::as_i64).map(|v| u64::try_from(v).expect("n"));
                        let total = m("total").expect("total");
                        (
                            q.clone(),
                            Collapsed {
                                total,
                                distinct: m("distinct").expect("distinct"),
                                tokens_per_option: m("tokens_per_option"),
                            },
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
    });
    PredictResult {
        model: doc.get("model").and_then(Value::as_str).expect("model").to_string(),
        answers,
        usage: Usage {
            input_tokens: n("input_tokens").expect("in"),
            output_tokens: n("output_tokens").expect("out"),
            fit,
        },
    }
}

#[test]
fn the_agents_typed_result_renders_as_laya_serve_answered() {
    let mut rendered = 0;
    for case in cases().iter().filter(|c| c.status == 200 && c.path == "/v1/systemone" && c.server != "strict") {
        let (doc, routing) = laya_result(&case.response);
        let typed = typed_result(&doc);
        assert_eq!(jev::question_refusal(&typed), None);
        let got = jev::body_text(&jev::render_result(&typed, &routing, false));
        assert_eq!(got, json::to_string(&case.response, Style::COMPACT), "{}", case.id);
        rendered += 1;
    }
    assert_eq!(rendered, 48, "single-route answers");
}

#[test]
fn an_accepted_body_becomes_the_agents_request_with_the_validated_controls() {
    let body = r#"{"state": {"b": 1}, "questions": {"q": {"type": "noul", "instructions": "?"}}, "lang": "de",
        "max_len": 96, "min_confidence": 1, "hooks": null}"#;
    let request = jev::check_single(body.as_bytes(), &settings()).expect("accepted").request();
    assert_eq!(request.state, json::parse_str(r#"{"b": 1}"#, ParseOptions::default()).expect("JSON"));
    assert_eq!(request.questions.keys().collect::<Vec<_>>(), ["q"]);
    assert_eq!((request.lang.as_deref(), request.max_len, request.head_max_len), (Some("de"), Some(96), None));
    assert_eq!(request.min_confidence, Some(Value::Float(1.0)), "laya passes the threshold on as a float");
    let batch = r#"{"states": ["a", "b"], "questions": {}, "max_len": 8}"#;
    let requests = jev::check_batch(batch.as_bytes(), &settings()).expect("accepted").requests();
    let states: Vec<&Value> = requests.iter().map(|r| &r.state).collect();
    assert_eq!(states, [&Value::from("a"), &Value::from("b")]);
    assert!(requests.iter().all(|r| r.max_len == Some(8)));
}
