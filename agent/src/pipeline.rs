//! One request through the whole pipeline: `prompt` (validate, lay out within the model's
//! capacity) -> a [`Backend`] (logits) -> `decide` (answers). The JSON-lines commands, the probe
//! and the MQTT service all answer requests through here: [`prepare`] before the rows are run,
//! [`finish`] after (the service runs them on its engine in between, [`answer_within`] on a
//! backend in this thread).

use laya_topics::wire::ErrorCode;
use laya_topics::{PredictResult, Request};

use crate::backend::{Backend, BackendError, RowResult};
use crate::bundle::HostBundle;
use crate::decide::{self, AssembleError, MinConfidence, RowOutput};
use crate::prompt::{self, Limits, Prepared, Row, TokenizerError};

/// A request laid out for the model, with what answering it needs after inference: its
/// questions (rows or errors), its language and its confidence gate. The rest of the request
/// (its state, the larger part of its memory) is not kept.
#[derive(Debug)]
pub struct PreparedRequest {
    pub questions: Vec<Prepared>,
    pub lang: Option<String>,
    pub gate: Option<MinConfidence>,
}

impl PreparedRequest {
    /// The rows the model runs: the laid-out questions', in question order.
    pub fn rows(&self) -> impl Iterator<Item = &Row> {
        self.questions.iter().filter_map(|p| p.outcome.as_ref().ok().map(|(_, r)| r))
    }
}

/// Why a request as a whole could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The request's rows carry more tokens than `[limits] max_request_tokens`.
    #[error(
        "the request's questions lay out to {tokens} tokens, more than the {limit} one request may carry (limits.max_request_tokens); send fewer questions or a shorter state"
    )]
    TooManyTokens { tokens: usize, limit: usize },
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Assemble(#[from] AssembleError),
    /// The request as a whole breaks a rule of the laya it is answered as (a null state, a
    /// malformed `min_confidence` under laya 0.4.15): laya's message.
    #[error("{0}")]
    Refused(String),
}

impl PipelineError {
    /// The wire error code of the reply that stands for the request.
    pub fn code(&self) -> ErrorCode {
        match self {
            PipelineError::TooManyTokens { .. } => ErrorCode::TooLarge,
            PipelineError::Backend(BackendError::Input(_)) | PipelineError::Refused(_) => ErrorCode::BadRequest,
            // A failure the backend may recover from: the request can be sent again.
            PipelineError::Backend(BackendError::Transient(_)) => ErrorCode::BackendUnavailable,
            PipelineError::Tokenizer(_) | PipelineError::Backend(_) | PipelineError::Assemble(_) => ErrorCode::Internal,
        }
    }
}

/// Validates and lays out every question of `request` within the bundle's capacity, with the
/// rules of the laya the bundle is served as: the budget clamped by [`limits_for`], and a
/// question whose row this bundle's graphs cannot run gets `too_large` in its place. The request
/// fails as a whole only if its rows together carry more than `max_request_tokens` tokens, if
/// it breaks a request-wide rule of that laya (a null state, a malformed `min_confidence`), or
/// if the tokenizer fails.
pub fn prepare(
    bundle: &HostBundle,
    request: &Request,
    max_request_tokens: usize,
) -> Result<PreparedRequest, PipelineError> {
    let laya = bundle.laya;
    // In laya's order: the threshold before the state.
    let gate = MinConfidence::of_request(laya, request).map_err(PipelineError::Refused)?;
    prompt::check_state(laya, &request.state).map_err(PipelineError::Refused)?;
    let capacity = &bundle.capacity;
    let mut prepared = prompt::prepare_as(
        laya,
        bundle.config.option_layout,
        &bundle.tokenizer,
        request,
        capacity.limits_for(request),
    )?;
    for p in &mut prepared {
        if let Ok((_, row)) = &p.outcome
            && let Err(e) = capacity.check(&p.qid, row)
        {
            p.outcome = Err(e);
        }
    }
    let tokens: usize = prepared.iter().filter_map(|p| p.outcome.as_ref().ok()).map(|(_, r)| r.input_ids.len()).sum();
    if tokens > max_request_tokens {
        return Err(PipelineError::TooManyTokens { tokens, limit: max_request_tokens });
    }
    Ok(PreparedRequest { questions: prepared, lang: request.lang.clone(), gate })
}

/// Answers every valid question of `request` in one batch; invalid ones (and ones this
/// bundle's graphs cannot run) get their error in place. Requests are held to the default
/// `[limits] max_request_tokens`; [`answer_within`] takes the configured one.
pub fn answer(
    bundle: &HostBundle,
    backend: &mut dyn Backend,
    request: &Request,
) -> Result<PredictResult, PipelineError> {
    answer_within(bundle, backend, request, crate::config::Limits::default().max_request_tokens)
}

/// [`answer`] with a request token limit of the caller's.
pub fn answer_within(
    bundle: &HostBundle,
    backend: &mut dyn Backend,
    request: &Request,
    max_request_tokens: usize,
) -> Result<PredictResult, PipelineError> {
    let prepared = prepare(bundle, request, max_request_tokens)?;
    let rows: Vec<&Row> = prepared.rows().collect();
    let results = if rows.is_empty() { Vec::new() } else { backend.run(&rows)? };
    finish(bundle, &prepared, results)
}

/// The answer to a prepared request, from the model's outputs for its rows (one result per
/// valid question, in order; none when no question was valid): the decisions, with each
/// invalid question's error in its place.
pub fn finish(
    bundle: &HostBundle,
    prepared: &PreparedRequest,
    results: Vec<RowResult>,
) -> Result<PredictResult, PipelineError> {
    let outputs: Vec<RowOutput> = results
        .into_iter()
        .map(|r| RowOutput { act_probs: decide::act_probabilities(&r.act_logits), logits: r.logits })
        .collect();
    Ok(decide::assemble_as(
        bundle.laya,
        &prepared.questions,
        &outputs,
        &bundle.config.temperatures,
        prepared.lang.as_deref(),
        prepared.gate.as_ref(),
    )?)
}

/// The request's budget: its `max_len`/`head_max_len` where they lower `model`'s, `model`'s
/// otherwise (never more: see [`prompt::capacity`]). `model` is a bundle's
/// `capacity.limits`.
pub fn limits_for(request: &Request, model: Limits) -> Limits {
    prompt::Capacity::of_checkpoint(model).limits_for(request)
}
