//! Backend events on `{prefix}/{device}/events`, and the names the wire gives to what the engine
//! and the service do: [`EventKind`], [`Role`] and [`BackendState`]. Each is an enum whose
//! `Display` is its wire string and whose `FromStr` reads it back, so the agent writes and the
//! fleet view reads one type, and a name is compared as a value, not as a string, at each use.

use crate::value::{Map, Value};

wire_names! {
    /// What an event on the events topic reports (its `event`).
    ///
    /// ```
    /// use laya_topics::wire::EventKind;
    /// for kind in EventKind::ALL {
    ///     assert_eq!(kind.to_string().parse::<EventKind>(), Ok(*kind));
    /// }
    /// assert_eq!("worker_restart".parse::<EventKind>(), Ok(EventKind::WorkerRestart));
    /// assert!("restarted".parse::<EventKind>().is_err());
    /// ```
    pub enum EventKind ("event") {
        /// A worker was restarted (`reason` says why).
        WorkerRestart = "worker_restart",
        /// The primary backend is degraded.
        BackendDegraded = "backend_degraded",
        /// The primary backend serves again.
        BackendRecovered = "backend_recovered",
        /// A probe run found the backend not answering like the float model.
        ProbeFailed = "probe_failed",
        /// A worker refused its vendor runtime (a version the bundle does not allow).
        RuntimeRejected = "runtime_rejected",
        /// A reload took over.
        Reloaded = "reloaded",
        /// A reload was refused or failed; the serving engine goes on.
        ReloadRejected = "reload_rejected",
        /// Another client with this agent's client id took its session.
        SessionTakenOver = "session_taken_over",
        /// `serve` refused its configuration at start.
        ConfigError = "config_error",
        /// A newer reload request came before this one's engine passed its health call: its
        /// candidate was stopped and the newer request goes on.
        ReloadSuperseded = "reload_superseded",
    }
}

wire_names! {
    /// Which worker serves or is concerned: the configured backend or the CPU fallback.
    ///
    /// ```
    /// use laya_topics::wire::Role;
    /// for role in Role::ALL {
    ///     assert_eq!(role.to_string().parse::<Role>(), Ok(*role));
    /// }
    /// assert_eq!(Role::Fallback.as_str(), "fallback");
    /// ```
    pub enum Role ("role") {
        /// The configured backend (an NPU on a board).
        Primary = "primary",
        /// The CPU reference, while the primary is degraded.
        Fallback = "fallback",
    }
}

wire_names! {
    /// Whether questions are being answered, not just received (`backend_state` of the status
    /// and telemetry documents).
    ///
    /// ```
    /// use laya_topics::wire::BackendState;
    /// for state in BackendState::ALL {
    ///     assert_eq!(state.to_string().parse::<BackendState>(), Ok(*state));
    /// }
    /// assert_eq!("ready".parse::<BackendState>(), Ok(BackendState::Ready));
    /// ```
    pub enum BackendState ("backend state") {
        /// No worker has passed its health call yet.
        Starting = "starting",
        /// A healthy primary serves.
        Ready = "ready",
        /// The primary is degraded: the fallback serves, or questions are refused.
        Degraded = "degraded",
    }
}

/// A backend event on `{prefix}/{device}/events`, published when it happens (QoS 1, not retained):
/// `{event, reason, code, name, message, deadline_ms, role}`.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineEvent {
    /// What happened.
    pub event: EventKind,
    /// What failed: `deadline`, `crash`, `fatal`, `load_failed` (none for a recovery).
    pub reason: Option<String>,
    /// The runtime's error code, for a fatal error that has one.
    pub code: Option<i64>,
    /// The runtime's name for the error (`RKNN_ERR_TIMEOUT`, ...), when known.
    pub name: Option<String>,
    /// What happened, in a sentence (the runtime's own explanation included).
    pub message: String,
    /// The deadline a call missed.
    pub deadline_ms: Option<u64>,
    /// Which worker it concerns; none for an event of the whole agent (a reload, a takeover),
    /// written as `""`.
    pub role: Option<Role>,
    /// The probe's figures, for `probe_failed`.
    pub probe: Option<ProbeFigures>,
    /// Which reload request a `reloaded`, `reload_rejected` or `reload_superseded` event settles.
    pub reload: Option<ReloadRef>,
    /// On a reload's outcome: what serves once it is settled (the new model after `reloaded`, the
    /// one serving on after a rejection).
    pub serving: Option<super::status::ServedModel>,
}

/// A reload request, as its events name it: `{"request": N, "model": DIR}`. Requests are
/// numbered from 1 in each run of the agent (one per SIGHUP it acted on); each gets exactly one
/// outcome event. `model` is the model directory the request's configuration names (null when
/// the configuration could not be read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadRef {
    pub request: u64,
    pub model: Option<String>,
}

impl ReloadRef {
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("request".into(), Value::Int(self.request.into()));
        m.insert("model".into(), self.model.as_deref().map_or(Value::Null, Value::from));
        Value::Object(m)
    }

    /// Reads back what [`ReloadRef::to_value`] wrote (for consumers such as `model install`).
    pub fn from_value(v: &Value) -> Option<ReloadRef> {
        let request = v.get("request").and_then(Value::as_i64).and_then(|n| u64::try_from(n).ok())?;
        let model = v.get("model").and_then(Value::as_str).map(str::to_owned);
        Some(ReloadRef { request, model })
    }
}

/// One run of a bundle's probe: how closely the backend answered like the float model.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeFigures {
    /// Which worker ran it.
    pub role: Role,
    /// The backend it ran on (`qnn`, `rknn`, `cpu`).
    pub backend: String,
    pub rows: u64,
    /// The figures below are null when the backend did not answer the probe rows at all (its
    /// own guard or a runtime error stopped it; `verdict` says which).
    /// Rows whose best option is the float model's.
    pub agree: Option<u64>,
    /// Rows the float model decides clearly (top-two margin > 0.02), and those that agree.
    pub clear: Option<u64>,
    pub clear_agree: Option<u64>,
    pub mean_dp: Option<f64>,
    pub max_dp: Option<f64>,
    pub mean_cosine: Option<f64>,
    /// Why the outputs look collapsed, if they do.
    pub collapse: Option<String>,
    pub passed: bool,
    /// What fell below the bundle's thresholds (empty when passed), naming the graph.
    pub verdict: String,
    /// Each graph's own figures and verdict, shortest graph first (empty when the backend did
    /// not answer the probe rows). Written as `graphs`; a consumer of an older agent sees none.
    pub graphs: Vec<ProbeGraph>,
}

/// One graph's part of a probe run: the rows that run on it (issue #28: each graph is judged on
/// its own rows, so a broken long graph is not hidden by many good short rows).
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeGraph {
    /// The graph's sequence length; `None` (written `null`) for a backend that runs rows of any
    /// length (the CPU): one entry for all rows.
    pub seq_len: Option<u64>,
    pub rows: u64,
    pub agree: u64,
    pub clear: u64,
    pub clear_agree: u64,
    pub mean_dp: f64,
    pub max_dp: f64,
    pub mean_cosine: f64,
    pub collapse: Option<String>,
    pub passed: bool,
    pub verdict: String,
}

impl ProbeGraph {
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("seq_len".into(), self.seq_len.map_or(Value::Null, |l| Value::Int(l.into())));
        m.insert("rows".into(), Value::Int(self.rows.into()));
        m.insert("agree".into(), Value::Int(self.agree.into()));
        m.insert("clear".into(), Value::Int(self.clear.into()));
        m.insert("clear_agree".into(), Value::Int(self.clear_agree.into()));
        m.insert("mean_dp".into(), Value::Float(self.mean_dp));
        m.insert("max_dp".into(), Value::Float(self.max_dp));
        m.insert("mean_cosine".into(), Value::Float(self.mean_cosine));
        m.insert("collapse".into(), self.collapse.as_deref().map_or(Value::Null, Value::from));
        m.insert("passed".into(), Value::Bool(self.passed));
        m.insert("verdict".into(), self.verdict.as_str().into());
        Value::Object(m)
    }
}

impl ProbeFigures {
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("role".into(), self.role.as_str().into());
        m.insert("backend".into(), self.backend.as_str().into());
        m.insert("rows".into(), Value::Int(self.rows.into()));
        let int = |v: Option<u64>| v.map_or(Value::Null, |x| Value::Int(x.into()));
        let float = |v: Option<f64>| v.map_or(Value::Null, Value::Float);
        m.insert("agree".into(), int(self.agree));
        m.insert("clear".into(), int(self.clear));
        m.insert("clear_agree".into(), int(self.clear_agree));
        m.insert("mean_dp".into(), float(self.mean_dp));
        m.insert("max_dp".into(), float(self.max_dp));
        m.insert("mean_cosine".into(), float(self.mean_cosine));
        m.insert("collapse".into(), self.collapse.as_deref().map_or(Value::Null, Value::from));
        m.insert("passed".into(), Value::Bool(self.passed));
        m.insert("verdict".into(), self.verdict.as_str().into());
        m.insert("graphs".into(), Value::Array(self.graphs.iter().map(ProbeGraph::to_value).collect()));
        Value::Object(m)
    }
}

impl EngineEvent {
    pub fn to_value(&self) -> Value {
        let opt_str = |v: &Option<String>| v.as_deref().map_or(Value::Null, Value::from);
        let opt_int = |v: Option<i64>| v.map_or(Value::Null, |x| Value::Int(x.into()));
        let mut m = Map::new();
        m.insert("event".into(), self.event.as_str().into());
        m.insert("reason".into(), opt_str(&self.reason));
        m.insert("code".into(), opt_int(self.code));
        m.insert("name".into(), opt_str(&self.name));
        m.insert("message".into(), self.message.as_str().into());
        m.insert("deadline_ms".into(), self.deadline_ms.map_or(Value::Null, |x| Value::Int(x.into())));
        m.insert("role".into(), self.role.map_or("", Role::as_str).into());
        if let Some(p) = &self.probe {
            m.insert("probe".into(), p.to_value());
        }
        if let Some(r) = &self.reload {
            m.insert("reload".into(), r.to_value());
        }
        if let Some(s) = &self.serving {
            m.insert("serving".into(), s.to_value());
        }
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json;
    #[test]
    fn an_engine_event_carries_the_errors_meaning() {
        let e = EngineEvent {
            event: EventKind::WorkerRestart,
            reason: Some("fatal".into()),
            code: Some(-7),
            name: Some("RKNN_ERR_TIMEOUT".into()),
            message: "rknn_run: RKNN_ERR_TIMEOUT (-7)".into(),
            deadline_ms: None,
            role: Some(Role::Primary),
            probe: None,
            reload: None,
            serving: None,
        };
        assert_eq!(
            json::to_string(&e.to_value(), json::Style::COMPACT),
            concat!(
                r#"{"event":"worker_restart","reason":"fatal","code":-7,"name":"RKNN_ERR_TIMEOUT","#,
                r#""message":"rknn_run: RKNN_ERR_TIMEOUT (-7)","deadline_ms":null,"role":"primary"}"#
            )
        );
    }

    #[test]
    fn a_probe_failure_event_carries_the_figures() {
        let figures = ProbeFigures {
            role: Role::Primary,
            backend: "qnn".into(),
            rows: 36,
            agree: Some(18),
            clear: Some(30),
            clear_agree: Some(14),
            mean_dp: Some(0.25),
            max_dp: Some(0.5),
            mean_cosine: Some(0.5),
            collapse: Some("all 36 probe rows came back near-uniform".into()),
            passed: false,
            verdict: "graph 256: argmax agreement 0.500 < 0.9".into(),
            graphs: vec![ProbeGraph {
                seq_len: Some(256),
                rows: 36,
                agree: 18,
                clear: 30,
                clear_agree: 14,
                mean_dp: 0.25,
                max_dp: 0.5,
                mean_cosine: 0.5,
                collapse: Some("all 36 probe rows came back near-uniform".into()),
                passed: false,
                verdict: "argmax agreement 0.500 < 0.9".into(),
            }],
        };
        let e = EngineEvent {
            event: EventKind::ProbeFailed,
            reason: None,
            code: None,
            name: None,
            message: "probe failed".into(),
            deadline_ms: None,
            role: Some(Role::Primary),
            probe: Some(figures),
            reload: None,
            serving: None,
        };
        assert_eq!(
            json::to_string(&e.to_value(), json::Style::COMPACT),
            concat!(
                r#"{"event":"probe_failed","reason":null,"code":null,"name":null,"message":"probe failed","deadline_ms":null,"role":"primary","#,
                r#""probe":{"role":"primary","backend":"qnn","rows":36,"agree":18,"clear":30,"clear_agree":14,"mean_dp":0.25,"max_dp":0.5,"#,
                r#""mean_cosine":0.5,"collapse":"all 36 probe rows came back near-uniform","passed":false,"verdict":"graph 256: argmax agreement 0.500 < 0.9","#,
                r#""graphs":[{"seq_len":256,"rows":36,"agree":18,"clear":30,"clear_agree":14,"mean_dp":0.25,"max_dp":0.5,"mean_cosine":0.5,"#,
                r#""collapse":"all 36 probe rows came back near-uniform","passed":false,"verdict":"argmax agreement 0.500 < 0.9"}]}}"#
            )
        );
    }

    #[test]
    fn every_wire_name_reads_back_as_the_variant_it_was_written_from() {
        for kind in EventKind::ALL {
            assert_eq!(kind.as_str().parse::<EventKind>(), Ok(*kind));
        }
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>(), Ok(*role));
        }
        for state in BackendState::ALL {
            assert_eq!(state.as_str().parse::<BackendState>(), Ok(*state));
        }
    }

    #[test]
    fn the_wire_names_are_the_strings_agents_have_always_sent() {
        let names: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "worker_restart",
                "backend_degraded",
                "backend_recovered",
                "probe_failed",
                "runtime_rejected",
                "reloaded",
                "reload_rejected",
                "session_taken_over",
                "config_error",
                "reload_superseded"
            ]
        );
        assert_eq!(Role::ALL.iter().map(|r| r.to_string()).collect::<Vec<_>>(), ["primary", "fallback"]);
        assert_eq!(
            BackendState::ALL.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            ["starting", "ready", "degraded"]
        );
    }

    #[test]
    fn a_reload_event_names_its_request_and_reads_it_back() {
        let e = EngineEvent {
            event: EventKind::ReloadSuperseded,
            reason: None,
            code: None,
            name: None,
            message: "superseded".into(),
            deadline_ms: None,
            role: None,
            probe: None,
            reload: Some(ReloadRef { request: 3, model: Some("/m/a".into()) }),
            serving: None,
        };
        let v = e.to_value();
        assert_eq!(
            json::to_string(&v, json::Style::COMPACT),
            concat!(
                r#"{"event":"reload_superseded","reason":null,"code":null,"name":null,"message":"superseded","#,
                r#""deadline_ms":null,"role":"","reload":{"request":3,"model":"/m/a"}}"#
            )
        );
        assert_eq!(v.get("reload").and_then(ReloadRef::from_value), e.reload);
        let unread = ReloadRef { request: 4, model: None };
        assert_eq!(ReloadRef::from_value(&unread.to_value()), Some(unread));
        assert_eq!(ReloadRef::from_value(&Value::Null), None);
    }

    #[test]
    fn an_unknown_name_is_an_error_that_says_what_it_read() {
        let e = "draining".parse::<BackendState>().unwrap_err();
        assert_eq!(e.to_string(), r#"unknown backend state "draining""#);
        assert!("Primary".parse::<Role>().is_err());
        assert!("".parse::<EventKind>().is_err());
    }

    #[test]
    fn an_event_of_the_whole_agent_has_an_empty_role() {
        let e = EngineEvent {
            event: EventKind::Reloaded,
            reason: None,
            code: None,
            name: None,
            message: "now serving".into(),
            deadline_ms: None,
            role: None,
            probe: None,
            reload: None,
            serving: None,
        };
        assert_eq!(
            json::to_string(&e.to_value(), json::Style::COMPACT),
            r#"{"event":"reloaded","reason":null,"code":null,"name":null,"message":"now serving","deadline_ms":null,"role":""}"#
        );
    }
}
