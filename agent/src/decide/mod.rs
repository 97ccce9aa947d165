//! From logits to laya's answers: temperatures, softmax, typed answers.
//!
//! `decide` never sees text or tokens beyond the validated question; it gets each question's
//! logits from the engine and produces the wire [`laya_topics::Answer`].

pub mod answer;
pub mod calibration;
pub mod gate;
pub mod numpy;
pub mod temperature;

pub use answer::{Decoding, act_probabilities, answer};
pub use gate::MinConfidence;
pub use temperature::{TemperatureError, Temperatures};

use laya_topics::wire::LayaVersion;
use laya_topics::{Answer, AnswerError, Collapsed, Fit, PredictResult, Usage};

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

/// laya 0.3.20's result for a request: an answer per valid question (outputs in the same order
/// as the valid questions), an error in place of each invalid one, and the tokens read.
pub fn assemble(
    prepared: &[Prepared],
    outputs: &[RowOutput],
    temperatures: &Temperatures,
    lang: Option<&str>,
) -> Result<PredictResult, AssembleError> {
    assemble_as(LayaVersion::V0_3_20, prepared, outputs, temperatures, lang, None)
}

/// [`assemble`] as `laya`'s version answers: under 0.4.15 with its `usage` figures, binning and
/// the request's confidence `gate` (errors in place of answers are not gated: they are no
/// answers).
pub fn assemble_as(
    laya: LayaVersion,
    prepared: &[Prepared],
    outputs: &[RowOutput],
    temperatures: &Temperatures,
    lang: Option<&str>,
    gate: Option<&MinConfidence>,
) -> Result<PredictResult, AssembleError> {
    let none = indexmap::IndexMap::new();
    // A language table answers without the binning map (laya's `lang_override`).
    let binning = if laya.is_0_4() && !temperatures.has_language(lang) { &temperatures.binning } else { &none };
    let decoding = Decoding { laya, binning, gate };
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
                answer::answer_as(q, &out.logits, out.act_probs.first().copied().unwrap_or(0.0), t, &decoding)
            }
        };
        answers.push((p.qid.clone(), a));
    }
    let fit = if laya.is_0_4() { fit(prepared) } else { None };
    Ok(PredictResult { model: MODEL_NAME.to_owned(), answers, usage: Usage { input_tokens, output_tokens: 0, fit } })
}

/// laya 0.4.15's account of what fit, over the answered questions' rows: none when no question
/// was answered (laya answers such a request with the token counts alone).
fn fit(prepared: &[Prepared]) -> Option<Fit> {
    let rows: Vec<(&str, &crate::prompt::LayoutStats)> = prepared
        .iter()
        .filter(|p| p.outcome.is_ok())
        .filter_map(|p| p.stats.as_ref().map(|s| (p.qid.as_str(), s)))
        .collect();
    let first = rows.first()?;
    Some(Fit {
        state_tokens: first.1.state_tokens as u64,
        state_tokens_dropped: rows.iter().map(|(_, s)| s.state_tokens_dropped as u64).max().unwrap_or(0),
        truncated_questions: rows.iter().filter(|(_, s)| s.truncated()).map(|(q, _)| (*q).to_owned()).collect(),
        collapsed: rows
            .iter()
            .filter(|(_, s)| s.options_distinct < s.options)
            .map(|(q, s)| {
                let c = Collapsed {
                    total: s.options as u64,
                    distinct: s.options_distinct as u64,
                    tokens_per_option: s.tokens_per_option.map(|t| t as u64),
                };
                ((*q).to_owned(), c)
            })
            .collect(),
    })
}
