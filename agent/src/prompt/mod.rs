//! What the model is asked: laya's question validation, option rendering, state serialization
//! and token layout, reproduced exactly.
//!
//! `prompt` turns a request into token rows and never sees a tensor; `decide` turns the model's
//! logits back into answers. Everything here is checked against fixtures recorded from
//! `laya==0.3.20` itself (tests/fixtures/laya-0.3.20).

pub mod capacity;
pub mod layout;
pub mod parallel;
pub mod pyrepr;
pub mod question;
pub mod render;
pub mod tokenizer;

use laya_topics::Request;

pub use capacity::{Capacity, RowShape};
pub use layout::{EncodedState, LayoutError, Limits, Row};
pub use question::{QType, Question, QuestionError, QuestionErrorKind};
pub use tokenizer::{Tokenizer, TokenizerError};

/// A question ready for the model, or the reason it is not.
#[derive(Debug)]
pub struct Prepared {
    pub qid: String,
    pub outcome: Result<(Question, Row), QuestionError>,
}

/// Validates every question of a request and lays out the valid ones, tokenizing the state once.
///
/// An invalid question does not stop the others: it carries its error in its place. Only a
/// tokenizer failure fails the request as a whole.
pub fn prepare(tok: &Tokenizer, request: &Request, limits: Limits) -> Result<Vec<Prepared>, TokenizerError> {
    let parsed: Vec<(String, Result<Question, QuestionError>)> =
        request.questions.iter().map(|(qid, def)| (qid.clone(), question::parse_question(qid, def))).collect();
    let mut state: Option<EncodedState> = None;
    let mut out = Vec::with_capacity(parsed.len());
    for (qid, q) in parsed {
        let outcome = match q {
            Err(e) => Err(e),
            Ok(q) => {
                let encoded = match state.take() {
                    Some(s) => s,
                    None => layout::encode_state(tok, &request.state)?,
                };
                let row = layout::build_row(tok, &qid, &q, &encoded, limits);
                state = Some(encoded);
                match row {
                    Ok(row) => Ok((q, row)),
                    Err(LayoutError::Question(e)) => Err(e),
                    Err(LayoutError::Tokenizer(e)) => return Err(e),
                }
            }
        };
        out.push(Prepared { qid, outcome });
    }
    Ok(out)
}
