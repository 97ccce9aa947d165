//! A question request as it arrives: `{"id"?, "state", "questions", "lang"?, "max_len"?,
//! "head_max_len"?, "deadline_ms"?}`.
//!
//! Only the envelope is checked here. Each question definition stays a [`Value`] because laya
//! validates questions one by one and an invalid question is answered with an error in its own
//! place, while the request's other questions are still answered.

use crate::value::{Map, Value};

/// A decoded request envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The caller's request id, echoed in the reply (any JSON value; usually a string).
    pub id: Option<Value>,
    /// The state the questions are asked about: text, an object, or a conversation list.
    pub state: Value,
    /// Question id -> definition, in the order the caller wrote them.
    pub questions: Map,
    /// Language tag for per-language temperatures (`de`, `de-DE`, ...).
    pub lang: Option<String>,
    /// Per-request override of the checkpoint's `max_len`.
    pub max_len: Option<i64>,
    /// Per-request override of the checkpoint's `head_max_len`.
    pub head_max_len: Option<i64>,
    /// The caller's deadline in milliseconds from receipt.
    pub deadline_ms: Option<u64>,
    /// laya 0.4.15's confidence gate, as sent (a number, a per-bucket map, or null: none). Its
    /// validation is laya's, by the agent serving the model.
    pub min_confidence: Option<Value>,
}

/// Why an envelope was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("a request must be a JSON object, got {0}")]
    NotAnObject(&'static str),
    #[error("a request needs a 'state'")]
    MissingState,
    #[error("'questions' must be an object of question id -> definition, got {0}")]
    QuestionsNotAnObject(&'static str),
    #[error("'{field}' must be {expected}")]
    BadField { field: &'static str, expected: &'static str },
}

impl Request {
    /// Reads the envelope out of a decoded document.
    pub fn from_value(value: Value) -> Result<Request, RequestError> {
        let Value::Object(mut map) = value else {
            return Err(RequestError::NotAnObject(value.python_type_name()));
        };
        let state = map.shift_remove("state").ok_or(RequestError::MissingState)?;
        let questions = match map.shift_remove("questions") {
            None => Map::new(),
            Some(Value::Object(q)) => q,
            Some(other) => return Err(RequestError::QuestionsNotAnObject(other.python_type_name())),
        };
        let lang = match map.shift_remove("lang") {
            None | Some(Value::Null) => None,
            Some(Value::Str(s)) => Some(s),
            Some(_) => return Err(RequestError::BadField { field: "lang", expected: "a string" }),
        };
        let int_field = |map: &mut Map, field: &'static str| match map.shift_remove(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Int(i)) => i
                .to_i64()
                .map(Some)
                .ok_or(RequestError::BadField { field, expected: "an integer that fits in 64 bits" }),
            Some(_) => Err(RequestError::BadField { field, expected: "an integer" }),
        };
        let max_len = int_field(&mut map, "max_len")?;
        let head_max_len = int_field(&mut map, "head_max_len")?;
        let deadline_ms = match int_field(&mut map, "deadline_ms")? {
            None => None,
            Some(ms) => Some(
                u64::try_from(ms)
                    .map_err(|_| RequestError::BadField { field: "deadline_ms", expected: "a non-negative integer" })?,
            ),
        };
        let id = map.shift_remove("id");
        let min_confidence = map.shift_remove("min_confidence").filter(|v| *v != Value::Null);
        Ok(Request { id, state, questions, lang, max_len, head_max_len, deadline_ms, min_confidence })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::{ParseOptions, parse_str};

    fn req(s: &str) -> Result<Request, RequestError> {
        Request::from_value(parse_str(s, ParseOptions::default()).unwrap())
    }

    #[test]
    fn a_full_envelope_is_read_with_question_order_kept() {
        let r = req(r#"{"id": "r1", "state": "s", "questions": {"b": {}, "a": {}}, "lang": "de", "max_len": 128}"#)
            .unwrap();
        assert_eq!(r.id, Some(Value::from("r1")));
        assert_eq!(r.questions.keys().collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!(r.lang.as_deref(), Some("de"));
        assert_eq!(r.max_len, Some(128));
    }

    #[test]
    fn envelope_mistakes_are_named() {
        assert_eq!(req("[]").unwrap_err(), RequestError::NotAnObject("list"));
        assert_eq!(req(r#"{"questions": {}}"#).unwrap_err(), RequestError::MissingState);
        assert_eq!(req(r#"{"state": 1, "questions": []}"#).unwrap_err(), RequestError::QuestionsNotAnObject("list"));
        assert!(matches!(req(r#"{"state": 1, "max_len": "9"}"#), Err(RequestError::BadField { field: "max_len", .. })));
        assert!(matches!(
            req(r#"{"state": 1, "deadline_ms": -1}"#),
            Err(RequestError::BadField { field: "deadline_ms", .. })
        ));
    }
}
