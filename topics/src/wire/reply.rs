//! The answer to a question: laya's result with the device, the backend that answered and where
//! the time went. Kept apart from the error replies (`wire`) because only this one carries a
//! `PredictResult`.

use super::event::Role;
use crate::answer::PredictResult;
use crate::value::{Map, Value};

/// Where the time of a request went, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Timing {
    pub queue: f64,
    pub tokenize: f64,
    pub infer: f64,
    pub decode: f64,
    pub total: f64,
}

/// A successful reply: laya's result plus `id`, `device`, `backend`, `timing_ms`.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub id: Option<Value>,
    pub device: String,
    /// The backend that answered (`cpu` when the CPU fallback did).
    pub backend: String,
    /// The configured backend (`primary`) or the CPU fallback.
    pub serving: Role,
    pub result: PredictResult,
    pub timing: Timing,
}

fn ms(x: f64) -> Value {
    Value::Float((x * 1000.0).round() / 1000.0)
}

impl Reply {
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("id".into(), self.id.clone().unwrap_or(Value::Null));
        if let Value::Object(r) = self.result.to_value() {
            m.extend(r);
        }
        m.insert("device".into(), self.device.as_str().into());
        m.insert("backend".into(), self.backend.as_str().into());
        m.insert("serving".into(), self.serving.as_str().into());
        let mut t = Map::new();
        t.insert("queue".into(), ms(self.timing.queue));
        t.insert("tokenize".into(), ms(self.timing.tokenize));
        t.insert("infer".into(), ms(self.timing.infer));
        t.insert("decode".into(), ms(self.timing.decode));
        t.insert("total".into(), ms(self.timing.total));
        m.insert("timing_ms".into(), Value::Object(t));
        Value::Object(m)
    }
}
