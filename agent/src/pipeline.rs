//! One request through the whole pipeline: `prompt` (validate, lay out) -> a [`Backend`]
//! (logits) -> `decide` (answers). The JSON-lines commands and the MQTT service both answer
//! requests through here.

use laya_topics::{PredictResult, Request};

use crate::bundle::HostBundle;
use crate::decide::{self, AssembleError, RowOutput};
use crate::engine::{Backend, BackendError};
use crate::prompt::{self, Limits, Row, TokenizerError};

/// Why a request as a whole could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Assemble(#[from] AssembleError),
}

/// Answers every valid question of `request` in one batch; invalid ones get their error in place.
pub fn answer(
    bundle: &HostBundle,
    backend: &mut dyn Backend,
    request: &Request,
) -> Result<PredictResult, PipelineError> {
    let prepared = prompt::prepare(&bundle.tokenizer, request, limits_for(request, bundle.config.limits))?;
    let rows: Vec<&Row> = prepared.iter().filter_map(|p| p.outcome.as_ref().ok().map(|(_, r)| r)).collect();
    let results = if rows.is_empty() { Vec::new() } else { backend.run(&rows)? };
    let outputs: Vec<RowOutput> = results
        .into_iter()
        .map(|r| RowOutput { act_probs: decide::act_probabilities(&r.act_logits), logits: r.logits })
        .collect();
    Ok(decide::assemble(&prepared, &outputs, &bundle.config.temperatures, request.lang.as_deref())?)
}

/// The request's budget: its overrides over the checkpoint's.
pub fn limits_for(request: &Request, checkpoint: Limits) -> Limits {
    Limits {
        max_len: request.max_len.unwrap_or(checkpoint.max_len),
        head_max_len: request.head_max_len.unwrap_or(checkpoint.head_max_len),
    }
}
