//! From logits to laya's answers: temperatures, softmax, typed answers.
//!
//! `decide` never sees text or tokens beyond the validated question; it gets each question's
//! logits from the engine and produces the wire [`laya_topics::Answer`].

pub mod answer;
pub mod numpy;
pub mod temperature;

pub use answer::{act_probabilities, answer};
pub use temperature::{TemperatureError, Temperatures};

use laya_topics::{Answer, AnswerError, PredictResult, Usage};

use crate::prompt::Prepared;
use laya_topics::MODEL_NAME;

/// What the model returned for one question row.
#[derive(Debug, Clone, PartialEq)]
pub struct RowOutput {
    /// One logit per option, in option order.
    pub logits: Vec<f32>,
    /// The act head's probabilities (after its softmax).
    pub act_probs: Vec<f32>,
}

/// Why outputs could not be matched to questions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssembleError {
    #[error("the model returned {got} rows for {want} questions")]
    RowCount { got: usize, want: usize },
    #[error("question {qid:?} has {want} options but the model returned {got} logits")]
    LogitCount { qid: String, got: usize, want: usize },
}

/// laya's result for a request: an answer per valid question (outputs in the same order as the
/// valid questions), an error in place of each invalid one, and the tokens read.
pub fn assemble(
    prepared: &[Prepared],
    outputs: &[RowOutput],
    temperatures: &Temperatures,
    lang: Option<&str>,
) -> Result<PredictResult, AssembleError> {
    let want = prepared.iter().filter(|p| p.outcome.is_ok()).count();
    if outputs.len() != want {
        return Err(AssembleError::RowCount { got: outputs.len(), want });
    }
    let mut rows = outputs.iter();
    let mut answers = Vec::with_capacity(prepared.len());
    let mut input_tokens = 0u64;
    for p in prepared {
        let a = match &p.outcome {
            Err(e) => Answer::Error(AnswerError { code: e.code().to_owned(), message: e.message.clone() }),
            Ok((q, row)) => {
                let out = rows.next().ok_or(AssembleError::RowCount { got: outputs.len(), want })?;
                let k = row.marker_pos.len();
                if out.logits.len() != k {
                    return Err(AssembleError::LogitCount { qid: p.qid.clone(), got: out.logits.len(), want: k });
                }
                input_tokens += row.input_ids.len() as u64;
                let t = temperatures.for_question(q.qtype, k, lang);
                answer(q, &out.logits, out.act_probs.first().copied().unwrap_or(0.0), t)
            }
        };
        answers.push((p.qid.clone(), a));
    }
    Ok(PredictResult { model: MODEL_NAME.to_owned(), answers, usage: Usage { input_tokens, output_tokens: 0 } })
}
