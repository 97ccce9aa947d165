//! The periodic telemetry document: counters, the serving backend and the load figures.

use super::event::{BackendState, ProbeFigures, Role};
use crate::load::Load;
use crate::value::{Map, Value};

/// How often the agent found a question's instructions and options already tokenized.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenMemo {
    pub hits: u64,
    pub misses: u64,
    /// Texts remembered now.
    pub entries: u64,
}

/// The periodic telemetry document, published at QoS 0 and not retained.
#[derive(Debug, Clone, PartialEq)]
pub struct Telemetry {
    pub device: String,
    pub uptime_s: u64,
    /// Answers published (error replies are counted in `refused`).
    pub answered: u64,
    /// Replies re-sent from the reply cache for redelivered requests.
    pub resent: u64,
    /// Messages that could not even be answered with an error (no reply topic).
    pub dropped: u64,
    /// Error replies by error code.
    pub refused: Vec<(String, u64)>,
    /// Calls queued for or running on the backend.
    pub in_flight: u64,
    pub backend: String,
    pub backend_state: BackendState,
    /// Whether the configured backend serves or the CPU fallback does (`serving`).
    pub serving: Role,
    pub degraded: bool,
    /// Worker restarts by reason.
    pub restarts: Vec<(String, u64)>,
    pub token_memo: TokenMemo,
    /// The last probe run, when the bundle has a probe.
    pub probe: Option<ProbeFigures>,
    /// Rates, latency percentiles, busy fraction, memory and temperature (`load::Load`).
    pub load: Load,
}

impl Telemetry {
    pub fn to_value(&self) -> Value {
        let counts = |pairs: &[(String, u64)]| -> Value {
            Value::Object(pairs.iter().map(|(k, v)| (k.clone(), Value::Int((*v).into()))).collect())
        };
        let mut memo = Map::new();
        memo.insert("hits".into(), Value::Int(self.token_memo.hits.into()));
        memo.insert("misses".into(), Value::Int(self.token_memo.misses.into()));
        memo.insert("entries".into(), Value::Int(self.token_memo.entries.into()));
        let mut m = Map::new();
        m.insert("device".into(), self.device.as_str().into());
        m.insert("uptime_s".into(), Value::Int(self.uptime_s.into()));
        m.insert("answered".into(), Value::Int(self.answered.into()));
        m.insert("resent".into(), Value::Int(self.resent.into()));
        m.insert("dropped".into(), Value::Int(self.dropped.into()));
        m.insert("refused".into(), counts(&self.refused));
        m.insert("in_flight".into(), Value::Int(self.in_flight.into()));
        m.insert("backend".into(), self.backend.as_str().into());
        m.insert("backend_state".into(), self.backend_state.as_str().into());
        m.insert("serving".into(), self.serving.as_str().into());
        m.insert("degraded".into(), Value::Bool(self.degraded));
        m.insert("restarts".into(), counts(&self.restarts));
        m.insert("token_memo".into(), Value::Object(memo));
        m.insert("probe".into(), self.probe.as_ref().map_or(Value::Null, ProbeFigures::to_value));
        self.load.extend(&mut m);
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json;
    use crate::load::Load;
    #[test]
    fn telemetry_names_every_counter_and_the_serving_role() {
        let t = Telemetry {
            device: "d1".into(),
            uptime_s: 7,
            answered: 5,
            resent: 1,
            dropped: 0,
            refused: vec![("overloaded".into(), 2)],
            in_flight: 3,
            backend: "qnn".into(),
            backend_state: BackendState::Degraded,
            serving: Role::Fallback,
            degraded: true,
            restarts: vec![("deadline".into(), 4)],
            token_memo: TokenMemo { hits: 9, misses: 2, entries: 2 },
            probe: None,
            load: Load::default(),
        };
        assert_eq!(
            json::to_string(&t.to_value(), json::Style::COMPACT),
            concat!(
                r#"{"device":"d1","uptime_s":7,"answered":5,"resent":1,"dropped":0,"refused":{"overloaded":2},"#,
                r#""in_flight":3,"backend":"qnn","backend_state":"degraded","serving":"fallback","degraded":true,"restarts":{"deadline":4},"#,
                r#""token_memo":{"hits":9,"misses":2,"entries":2},"probe":null,"#,
                r#""interval_s":0.0,"questions":0,"questions_per_s":0.0,"#,
                r#""latency_ms":{"queue":null,"tokenize":null,"infer":null,"decode":null,"total":null},"#,
                r#""busy":0.0,"queue_depth":0,"rss_kb":{"agent":null,"worker":null},"temperature_c":null}"#
            )
        );
    }
}
