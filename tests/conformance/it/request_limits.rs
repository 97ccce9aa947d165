//! A request never asks more than the model can do: `max_len`/`head_max_len` above the model's
//! are clamped to it (the state cut as laya cuts it at the model's own budget), and the rows of
//! one request carry at most `[limits] max_request_tokens` tokens.
//!
//! The front ends (`predict`, `serve` over mosquitto, the NPU backends) are tested in
//! agent/tests/it/front_end_limits.rs, rknn_cli.rs and qnn_cli.rs.

use crate::support::{bundle, cases, laya_limits, model_dir};
use laya_edge::backend::cpu::CpuBackend;
use laya_edge::pipeline::{self, PipelineError};
use laya_topics::wire::ErrorCode;
use laya_topics::{Request, Value};

/// The answers with the request's own budget removed.
fn without_budget(request: &Request) -> Request {
    Request { max_len: None, head_max_len: None, ..request.clone() }
}

#[test]
fn a_budget_above_the_models_is_answered_as_at_the_models_own() {
    let mut backends = std::collections::HashMap::new();
    let (mut compared, mut cut) = (0, 0);
    for case in cases() {
        let b = bundle(&case.model);
        let backend = backends
            .entry(case.model.clone())
            .or_insert_with(|| CpuBackend::load(&model_dir(&case.model), &b.config).unwrap());
        let plain = without_budget(&Request::from_value(case.field("request").clone()).unwrap());
        let hostile = Request { max_len: Some(1_000_000), head_max_len: Some(i64::MAX), ..plain.clone() };
        let want = pipeline::answer(&b, backend, &plain).unwrap_or_else(|e| panic!("{}: {e}", case.id)).to_value();
        let got = pipeline::answer(&b, backend, &hostile).unwrap_or_else(|e| panic!("{}: {e}", case.id)).to_value();
        assert_eq!(got, want, "{}", case.id);
        compared += 1;
        // Cases where laya, at the hostile budget, would have read more of the state.
        let full = laya_limits(&hostile, &b);
        let rows = laya_edge::prompt::prepare(&b.tokenizer, &hostile, full).unwrap();
        if rows
            .iter()
            .any(|p| p.outcome.as_ref().is_ok_and(|(_, r)| r.input_ids.len() as i64 > b.config.limits.max_len))
        {
            cut += 1;
        }
    }
    assert!(compared >= 400, "{compared}");
    assert!(cut >= 20, "only {cut} cases have a state longer than the model's budget");
}

#[test]
fn a_max_len_bomb_is_laid_out_within_the_models_budget() {
    let b = bundle("bpe-t5");
    let words: Vec<String> = (0..44_000).map(|i| format!("w{}", i % 977)).collect();
    let state = words.join(" ");
    assert!(state.len() > 200_000);
    let request = Request {
        id: None,
        state: Value::Str(state),
        questions: laya_topics::json::parse_str(
            r#"{"team": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "technical"]}}"#,
            Default::default(),
        )
        .unwrap()
        .as_object()
        .unwrap()
        .clone(),
        lang: None,
        max_len: Some(1_000_000),
        head_max_len: Some(1_000_000),
        deadline_ms: None,
        min_confidence: None,
    };
    let prepared = pipeline::prepare(&b, &request, usize::MAX).unwrap();
    let (_, row) = prepared.questions[0].outcome.as_ref().unwrap();
    assert_eq!(row.input_ids.len(), 512);
    let at_model = pipeline::prepare(&b, &without_budget(&request), usize::MAX).unwrap();
    assert_eq!(Some(row), at_model.questions[0].outcome.as_ref().ok().map(|(_, r)| r));
}

#[test]
fn a_request_whose_rows_carry_more_than_max_request_tokens_is_refused_as_a_whole() {
    let b = bundle("bpe-small");
    let mut backend = CpuBackend::load(&model_dir("bpe-small"), &b.config).unwrap();
    let text = format!(
        r#"{{"state": "{}", "questions": {{"a": {{"type": "noul", "instructions": "Urgent?"}}, "b": {{"type": "noul", "instructions": "A bug?"}}, "c": {{"type": "score", "instructions": "How bad?", "criteria": ["fine", "bad"]}}}}}}"#,
        "The app crashes every time I log in. ".repeat(40)
    );
    let request = Request::from_value(laya_topics::json::parse_str(&text, Default::default()).unwrap()).unwrap();
    let tokens: usize = pipeline::prepare(&b, &request, usize::MAX)
        .unwrap()
        .questions
        .iter()
        .map(|p| p.outcome.as_ref().unwrap().1.input_ids.len())
        .sum();
    assert_eq!(tokens, 3 * 96, "three rows at bpe-small's max_len");
    let answered = pipeline::answer_within(&b, &mut backend, &request, tokens).unwrap();
    assert_eq!(answered.usage.input_tokens, tokens as u64);
    let err = pipeline::answer_within(&b, &mut backend, &request, tokens - 1).unwrap_err();
    assert!(matches!(err, PipelineError::TooManyTokens { tokens: t, limit } if t == tokens && limit == tokens - 1));
    assert_eq!(err.code(), ErrorCode::TooLarge);
    assert!(err.to_string().contains("limits.max_request_tokens"), "{err}");
}
