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

/// What laya 0.4.15's confidence gate (`min_confidence`) made of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abstention {
    /// The answer's confidence cleared the threshold.
    Passed,
    /// It fell below (the answer also carries `low_confidence: true`).
    Abstained,
    /// The answer carried no usable confidence.
    Unevaluated,
}

impl Abstention {
    /// laya's name for it (`abstention`).
    pub fn as_str(self) -> &'static str {
        match self {
            Abstention::Passed => "passed",
            Abstention::Abstained => "abstained",
            Abstention::Unevaluated => "unevaluated",
        }
    }
}

/// The gate's verdict on one answer: `abstention` and the `abstention_threshold` it was gated at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gate {
    pub abstention: Abstention,
    pub threshold: f64,
}

/// One question's answer, or the error that stands in its place.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Choice {
        /// The chosen label as the caller wrote it (a string; under laya 0.4.15 also a number
        /// or a bool).
        choice: Value,
        /// Label (as a JSON key) -> probability, in the question's option order.
        probabilities: Vec<(String, f64)>,
        confidence: f64,
        answer_confidence: f64,
        action: Action,
        /// The confidence gate's verdict, when the request set `min_confidence`.
        gate: Option<Gate>,
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
        gate: Option<Gate>,
    },
    Noul {
        /// P(true).
        noul: f64,
        confidence: f64,
        answer_confidence: f64,
        action: Action,
        gate: Option<Gate>,
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
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// laya 0.4.15's account of what fit (none under laya 0.3.20, and for a request with no
    /// question answered).
    pub fit: Option<Fit>,
}

/// Whether the state fit, and which questions lost options to the head budget (laya 0.4.15).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fit {
    /// The state's tokens before any cut.
    pub state_tokens: u64,
    /// The most any question's row dropped of them (the questions share one state).
    pub state_tokens_dropped: u64,
    /// The questions whose row dropped state tokens, in question order.
    pub truncated_questions: Vec<String>,
    /// The questions whose options no longer all have a token span of their own (`options`,
    /// present only when there is one).
    pub collapsed: Vec<(String, Collapsed)>,
}

/// One question's collapsed options: how many it defines, how many stayed distinguishable, and
/// the cut applied to each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Collapsed {
    pub total: u64,
    pub distinct: u64,
    pub tokens_per_option: Option<u64>,
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

impl Gate {
    /// Adds laya's gate fields to an answer: `low_confidence` (only when abstained), then
    /// `abstention` and `abstention_threshold`.
    fn write(gate: &Option<Gate>, m: &mut Map) {
        let Some(g) = gate else { return };
        if g.abstention == Abstention::Abstained {
            m.insert("low_confidence".into(), Value::Bool(true));
        }
        m.insert("abstention".into(), g.abstention.as_str().into());
        m.insert("abstention_threshold".into(), Value::Float(g.threshold));
    }
}

impl Answer {
    /// The answer as laya writes it.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        match self {
            Answer::Choice { choice, probabilities, confidence, answer_confidence, action, gate } => {
                m.insert("type".into(), "choice".into());
                m.insert("choice".into(), choice.clone());
                m.insert("probabilities".into(), probs(probabilities));
                m.insert("confidence".into(), Value::Float(*confidence));
                m.insert("answer_confidence".into(), Value::Float(*answer_confidence));
                m.insert("action".into(), action.to_value());
                Gate::write(gate, &mut m);
            }
            Answer::Score { score, legend, probabilities, confidence, answer_confidence, action, gate } => {
                m.insert("type".into(), "score".into());
                m.insert("score".into(), Value::Float(*score));
                m.insert("legend".into(), Value::Object(legend.iter().cloned().collect()));
                m.insert("probabilities".into(), probs(probabilities));
                m.insert("confidence".into(), Value::Float(*confidence));
                m.insert("answer_confidence".into(), Value::Float(*answer_confidence));
                m.insert("action".into(), action.to_value());
                Gate::write(gate, &mut m);
            }
            Answer::Noul { noul, confidence, answer_confidence, action, gate } => {
                m.insert("type".into(), "noul".into());
                m.insert("noul".into(), Value::Float(*noul));
                m.insert("confidence".into(), Value::Float(*confidence));
                m.insert("answer_confidence".into(), Value::Float(*answer_confidence));
                m.insert("action".into(), action.to_value());
                Gate::write(gate, &mut m);
            }
            Answer::Error(e) => return e.to_value(),
        }
        Value::Object(m)
    }
}

impl PredictResult {
    /// `{"model", "answers", "usage"}` in laya's order.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("model".into(), self.model.as_str().into());
        m.insert(
            "answers".into(),
            Value::Object(self.answers.iter().map(|(k, a)| (k.clone(), a.to_value())).collect()),
        );
        m.insert("usage".into(), self.usage.to_value());
        Value::Object(m)
    }
}

impl Usage {
    /// `usage` in laya's key order (0.4.15's figures after the token counts).
    pub fn to_value(&self) -> Value {
        let int = |n: u64| Value::Int(n.into());
        let mut usage = Map::new();
        usage.insert("input_tokens".into(), int(self.input_tokens));
        usage.insert("output_tokens".into(), int(self.output_tokens));
        if let Some(fit) = &self.fit {
            usage.insert("state_tokens".into(), int(fit.state_tokens));
            usage.insert("state_tokens_dropped".into(), int(fit.state_tokens_dropped));
            usage.insert("truncated".into(), Value::Bool(fit.state_tokens_dropped > 0));
            usage.insert(
                "truncated_questions".into(),
                Value::Array(fit.truncated_questions.iter().map(|q| Value::from(q.as_str())).collect()),
            );
            if !fit.collapsed.is_empty() {
                let options = fit
                    .collapsed
                    .iter()
                    .map(|(qid, c)| {
                        let mut o = Map::new();
                        o.insert("total".into(), int(c.total));
                        o.insert("distinct".into(), int(c.distinct));
                        o.insert("tokens_per_option".into(), c.tokens_per_option.map_or(Value::Null, int));
                        (qid.clone(), Value::Object(o))
                    })
                    .collect();
                usage.insert("options".into(), Value::Object(options));
            }
        }
        Value::Object(usage)
    }
}
