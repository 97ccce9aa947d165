//! What the model is asked: laya's question validation, option rendering, state serialization
//! and token layout, reproduced exactly.
//!
//! `prompt` turns a request into token rows and never sees a tensor; `decide` turns the model's
//! logits back into answers. Everything here is checked against fixtures recorded from
//! `laya==0.3.20` and `laya==0.4.15` themselves (tests/fixtures/laya-0.3.20, laya-0.4.15): the
//! rules are those of the version the model is served as ([`LayaVersion`]).

pub mod capacity;
pub mod layout;
pub mod parallel;
pub mod pyrepr;
pub mod question;
pub mod render;
pub mod tokenizer;

use laya_topics::wire::LayaVersion;
use laya_topics::{Request, Value};

pub use capacity::{Capacity, RowShape};
pub use layout::{EncodedState, LayoutError, LayoutStats, Limits, OptionLayout, Row};
pub use question::{QType, Question, QuestionError, QuestionErrorKind};
pub use tokenizer::{Tokenizer, TokenizerError};

/// A question ready for the model, or the reason it is not.
#[derive(Debug)]
pub struct Prepared {
    pub qid: String,
    pub outcome: Result<(Question, Row), QuestionError>,
    /// What the budget did to the row (the reply's `usage` under laya 0.4.15); none where the
    /// question was refused before or during layout.
    pub stats: Option<LayoutStats>,
}

/// laya 0.4.15's refusal of a request whose state is `null` (laya 0.3.20 reads it as the text
/// `null`): the message laya raises, or none.
pub fn check_state(laya: LayaVersion, state: &Value) -> Result<(), String> {
    if laya.is_0_4() && *state == Value::Null {
        return Err("state must not be None; pass a string, dict, or list".to_owned());
    }
    Ok(())
}

/// Validates every question of a request with laya 0.3.20's rules and lays out the valid ones,
/// tokenizing the state once ([`prepare_as`]).
pub fn prepare(tok: &Tokenizer, request: &Request, limits: Limits) -> Result<Vec<Prepared>, TokenizerError> {
    prepare_as(LayaVersion::V0_3_20, OptionLayout::Sequential, tok, request, limits)
}

/// Validates every question of a request with the rules of `laya`'s version and lays out the
/// valid ones in the checkpoint's option `layout`, tokenizing the state once.
///
/// An invalid question does not stop the others: it carries its error in its place. Only a
/// tokenizer failure fails the request as a whole.
pub fn prepare_as(
    laya: LayaVersion,
    layout: OptionLayout,
    tok: &Tokenizer,
    request: &Request,
    limits: Limits,
) -> Result<Vec<Prepared>, TokenizerError> {
    let parsed: Vec<(String, Result<Question, QuestionError>)> =
        request.questions.iter().map(|(qid, def)| (qid.clone(), question::parse_question_as(laya, qid, def))).collect();
    let mut state: Option<EncodedState> = None;
    let mut out = Vec::with_capacity(parsed.len());
    for (qid, q) in parsed {
        let (outcome, stats) = match q {
            Err(e) => (Err(e), None),
            Ok(q) => {
                let encoded = match state.take() {
                    Some(s) => s,
                    None => layout::encode_state(tok, &request.state)?,
                };
                let row = layout::build_row(tok, &qid, &q, &encoded, limits, laya, layout);
                state = Some(encoded);
                match row {
                    Ok((row, stats)) => (Ok((q, row)), Some(stats)),
                    Err(LayoutError::Question(e)) => (Err(e), None),
                    Err(LayoutError::Tokenizer(e)) => return Err(e),
                }
            }
        };
        out.push(Prepared { qid, outcome, stats });
    }
    Ok(out)
}
