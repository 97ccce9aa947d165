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

/// One worker role's probe runs (telemetry's `probes`): its last run and its last failed one,
/// kept however many runs passed since, so that after a degradation the fallback's passing runs
/// do not hide why the primary failed.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeHistory {
    pub last: ProbeFigures,
    pub last_failure: Option<ProbeFigures>,
}

impl ProbeHistory {
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("last".into(), self.last.to_value());
        m.insert("last_failure".into(), self.last_failure.as_ref().map_or(Value::Null, ProbeFigures::to_value));
        Value::Object(m)
    }
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
    /// The configured backend's (the primary's) last probe run, else the fallback's, when the
    /// bundle has a probe (`probe`, the same document as before issue #28; `role` says whose).
    pub probe: Option<ProbeFigures>,
    /// Each role's probe runs, the primary's first (`probes`: `{role: {"last", "last_failure"}}`).
    pub probes: Vec<ProbeHistory>,
    /// Rates, latency percentiles, busy fraction, memory and temperature (`load::Load`).
    pub load: Load,
    /// The model that serves (`model`: name, version, bundle sha256, since when).
    pub model: Option<super::status::ServedModel>,
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
        m.insert(
            "probes".into(),
            Value::Object(self.probes.iter().map(|h| (h.last.role.as_str().to_owned(), h.to_value())).collect()),
        );
        self.load.extend(&mut m);
        m.insert("model".into(), self.model.as_ref().map_or(Value::Null, super::status::ServedModel::to_value));
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
            probes: Vec::new(),
            load: Load::default(),
            model: Some(crate::wire::ServedModel {
                name: "tickets".into(),
                version: "v2".into(),
                bundle_sha256: None,
                since: 1_700_000_000,
            }),
        };
        assert_eq!(
            json::to_string(&t.to_value(), json::Style::COMPACT),
            concat!(
                r#"{"device":"d1","uptime_s":7,"answered":5,"resent":1,"dropped":0,"refused":{"overloaded":2},"#,
                r#""in_flight":3,"backend":"qnn","backend_state":"degraded","serving":"fallback","degraded":true,"restarts":{"deadline":4},"#,
                r#""token_memo":{"hits":9,"misses":2,"entries":2},"probe":null,"probes":{},"#,
                r#""interval_s":0.0,"questions":0,"questions_per_s":0.0,"#,
                r#""latency_ms":{"queue":null,"tokenize":null,"infer":null,"decode":null,"total":null},"#,
                r#""busy":0.0,"queue_depth":0,"rss_kb":{"agent":null,"worker":null},"temperature_c":null,"#,
                r#""model":{"name":"tickets","version":"v2","bundle_sha256":null,"since":1700000000}}"#
            )
        );
    }

    fn figures(role: Role, backend: &str, passed: bool) -> ProbeFigures {
        ProbeFigures {
            role,
            backend: backend.into(),
            rows: 56,
            agree: Some(if passed { 56 } else { 38 }),
            clear: Some(50),
            clear_agree: Some(if passed { 50 } else { 32 }),
            mean_dp: Some(0.001),
            max_dp: Some(0.01),
            mean_cosine: Some(0.999),
            collapse: None,
            passed,
            verdict: if passed { String::new() } else { "graph 256: argmax agreement 0.250 < 0.95".into() },
            graphs: Vec::new(),
        }
    }

    #[test]
    fn telemetry_keeps_each_roles_last_probe_run_and_the_primarys_last_failure() {
        let failed = figures(Role::Primary, "qnn", false);
        let t = Telemetry {
            device: "d1".into(),
            uptime_s: 7,
            answered: 0,
            resent: 0,
            dropped: 0,
            refused: vec![],
            in_flight: 0,
            backend: "qnn".into(),
            backend_state: BackendState::Degraded,
            serving: Role::Fallback,
            degraded: true,
            restarts: vec![],
            token_memo: TokenMemo::default(),
            probe: Some(failed.clone()),
            probes: vec![
                ProbeHistory { last: failed.clone(), last_failure: Some(failed) },
                ProbeHistory { last: figures(Role::Fallback, "cpu", true), last_failure: None },
            ],
            load: Load::default(),
            model: None,
        };
        let v = t.to_value();
        let probes = v.get("probes").and_then(Value::as_object).expect("probes");
        assert_eq!(probes.keys().collect::<Vec<_>>(), ["primary", "fallback"]);
        let primary = probes.get("primary").expect("primary");
        let verdict = |p: &Value| p.get("verdict").and_then(Value::as_str).map(str::to_owned);
        assert_eq!(
            primary.get("last_failure").and_then(verdict).as_deref(),
            Some("graph 256: argmax agreement 0.250 < 0.95")
        );
        let fallback = probes.get("fallback").expect("fallback");
        assert_eq!(fallback.get("last").and_then(|l| l.get("passed")), Some(&Value::Bool(true)));
        assert_eq!(fallback.get("last_failure"), Some(&Value::Null));
        // `probe` is the document it always was, now the primary's.
        assert_eq!(v.get("probe").and_then(|p| p.get("role")).and_then(Value::as_str), Some("primary"));
    }
}
