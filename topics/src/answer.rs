//! Typed answers in laya's shape, and the result envelope `{"model", "answers", "usage"}`.
//!
//! Field order matters to anyone diffing against laya, so [`Answer::to_value`] writes the keys in
//! the order `laya.Agent` builds its dicts.

use crate::value::{Map, Value};

/// What the act head says about acting on the answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Action {
    /// Probability of the first act class (laya's `act_probability`), rounded to 4 places.
    pub act_probability: f64,
}

/// One question's answer, or the error that stands in its place.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Choice {
        choice: String,
        /// Label -> probability, in the question's option order.
        probabilities: Vec<(String, f64)>,
        confidence: f64,
        answer_confidence: f64,
        action: Action,
    },
    Score {
        /// Expected level.
        score: f64,
        /// Level index (as text) -> the caller's level description, echoed.
        legend: Vec<(String, Value)>,
        probabilities: Vec<(String, f64)>,
        confidence: f64,
        answer_confidence: f64,
        action: Action,
    },
    Noul {
        /// P(true).
        noul: f64,
        confidence: f64,
        answer_confidence: f64,
        action: Action,
    },
    /// The question could not be answered; the request's other questions still are.
    Error(AnswerError),
}

/// An error in place of an answer: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerError {
    pub code: String,
    pub message: String,
}

/// Token accounting, as laya reports it (`output_tokens` is always 0: nothing is generated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// laya's result for one state.
#[derive(Debug, Clone, PartialEq)]
pub struct PredictResult {
    pub model: String,
    /// Question id -> answer, in request order.
    pub answers: Vec<(String, Answer)>,
    pub usage: Usage,
}

fn probs(p: &[(String, f64)]) -> Value {
    Value::Object(p.iter().map(|(k, v)| (k.clone(), Value::Float(*v))).collect())
}

impl Action {
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("act_probability".into(), Value::Float(self.act_probability));
        Value::Object(m)
    }
}

impl AnswerError {
    pub fn to_value(&self) -> Value {
        let mut inner = Map::new();
        inner.insert("code".into(), Value::from(self.code.as_str()));
        inner.insert("message".into(), Value::from(self.message.as_str()));
        let mut m = Map::new();
        m.insert("error".into(), Value::Object(inner));
        Value::Object(m)
    }
}

impl Answer {
    /// The answer as laya writes it.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        match self {
            Answer::Choice { choice, probabilities, confidence, answer_confidence, action } => {
                m.insert("type".into(), "choice".into());
                m.insert("choice".into(), choice.as_str().into());
                m.insert("probabilities".into(), probs(probabilities));
                m.insert("confidence".into(), Value::Float(*confidence));
                m.insert("answer_confidence".into(), Value::Float(*answer_confidence));
                m.insert("action".into(), action.to_value());
            }
            Answer::Score { score, legend, probabilities, confidence, answer_confidence, action } => {
                m.insert("type".into(), "score".into());
                m.insert("score".into(), Value::Float(*score));
                m.insert("legend".into(), Value::Object(legend.iter().cloned().collect()));
                m.insert("probabilities".into(), probs(probabilities));
                m.insert("confidence".into(), Value::Float(*confidence));
                m.insert("answer_confidence".into(), Value::Float(*answer_confidence));
                m.insert("action".into(), action.to_value());
            }
            Answer::Noul { noul, confidence, answer_confidence, action } => {
                m.insert("type".into(), "noul".into());
                m.insert("noul".into(), Value::Float(*noul));
                m.insert("confidence".into(), Value::Float(*confidence));
                m.insert("answer_confidence".into(), Value::Float(*answer_confidence));
                m.insert("action".into(), action.to_value());
            }
            Answer::Error(e) => return e.to_value(),
        }
        Value::Object(m)
    }
}

impl PredictResult {
    /// `{"model", "answers", "usage"}` in laya's order.
    pub fn to_value(&self) -> Value {
        let mut usage = Map::new();
        usage.insert("input_tokens".into(), Value::Int(self.usage.input_tokens.into()));
        usage.insert("output_tokens".into(), Value::Int(self.usage.output_tokens.into()));
        let mut m = Map::new();
        m.insert("model".into(), self.model.as_str().into());
        m.insert(
            "answers".into(),
            Value::Object(self.answers.iter().map(|(k, a)| (k.clone(), a.to_value())).collect()),
        );
        m.insert("usage".into(), Value::Object(usage));
        Value::Object(m)
    }
}
