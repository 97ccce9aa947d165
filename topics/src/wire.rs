//! Reply, error, status and telemetry payloads, and the choice of encoding.

use crate::answer::PredictResult;
use crate::load::Load;
use crate::value::{Map, Value};
use crate::{cbor, json};

/// The content types laya-edge speaks.
pub const CONTENT_JSON: &str = "application/json";
pub const CONTENT_CBOR: &str = "application/cbor";

/// A payload encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Json,
    Cbor,
}

/// Why a payload could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("invalid JSON: {0}")]
    Json(#[from] json::ParseError),
    #[error("invalid CBOR: {0}")]
    Cbor(#[from] cbor::CborError),
}

impl DecodeError {
    /// Whether the document nests deeper than allowed (a size limit, not malformed input).
    pub fn is_too_deep(&self) -> bool {
        matches!(
            self,
            DecodeError::Json(json::ParseError { kind: json::ParseErrorKind::TooDeep(_), .. })
                | DecodeError::Cbor(cbor::CborError::TooDeep(_))
        )
    }
}

impl Encoding {
    /// From the MQTT 5 content type if it names one, else from the payload's first byte (JSON
    /// documents start with whitespace, `{`, `[`, `"`, a digit, `-`, or a literal's letter).
    pub fn detect(content_type: Option<&str>, payload: &[u8]) -> Encoding {
        match content_type.map(|c| c.split(';').next().unwrap_or(c).trim().to_ascii_lowercase()) {
            Some(c) if c == CONTENT_CBOR => return Encoding::Cbor,
            Some(c) if c == CONTENT_JSON => return Encoding::Json,
            _ => {}
        }
        match payload.first() {
            Some(
                b'{'
                | b'['
                | b'"'
                | b' '
                | b'\t'
                | b'\n'
                | b'\r'
                | b'-'
                | b'0'..=b'9'
                | b't'
                | b'f'
                | b'n'
                | b'N'
                | b'I',
            ) => Encoding::Json,
            Some(0xEF) => Encoding::Json, // UTF-8 BOM
            _ => Encoding::Cbor,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Json => CONTENT_JSON,
            Encoding::Cbor => CONTENT_CBOR,
        }
    }

    /// Decodes a payload with a nesting limit.
    pub fn decode(self, payload: &[u8], max_depth: usize) -> Result<Value, DecodeError> {
        Ok(match self {
            Encoding::Json => json::parse(payload, json::ParseOptions { max_depth })?,
            Encoding::Cbor => cbor::decode(payload, max_depth)?,
        })
    }

    /// Encodes a document (compact JSON).
    pub fn encode(self, value: &Value) -> Vec<u8> {
        match self {
            Encoding::Json => json::to_string(value, json::Style::COMPACT).into_bytes(),
            Encoding::Cbor => cbor::encode(value),
        }
    }
}

/// Error codes of an error reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    BadRequest,
    TooLarge,
    Overloaded,
    DeadlineExceeded,
    BackendUnavailable,
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::DeadlineExceeded => "deadline_exceeded",
            ErrorCode::BackendUnavailable => "backend_unavailable",
            ErrorCode::Internal => "internal",
        }
    }

    /// Whether sending the same request again may succeed.
    pub fn retryable(self) -> bool {
        matches!(self, ErrorCode::Overloaded | ErrorCode::BackendUnavailable | ErrorCode::Internal)
    }

    pub fn parse(s: &str) -> Option<ErrorCode> {
        [
            ErrorCode::BadRequest,
            ErrorCode::TooLarge,
            ErrorCode::Overloaded,
            ErrorCode::DeadlineExceeded,
            ErrorCode::BackendUnavailable,
            ErrorCode::Internal,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }
}

/// `{"id", "error": {"code", "message", "retryable"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorReply {
    pub id: Option<Value>,
    pub code: ErrorCode,
    pub message: String,
}

impl ErrorReply {
    pub fn to_value(&self) -> Value {
        let mut e = Map::new();
        e.insert("code".into(), self.code.as_str().into());
        e.insert("message".into(), self.message.as_str().into());
        e.insert("retryable".into(), Value::Bool(self.code.retryable()));
        let mut m = Map::new();
        m.insert("id".into(), self.id.clone().unwrap_or(Value::Null));
        m.insert("error".into(), Value::Object(e));
        Value::Object(m)
    }
}

/// A question that could not be answered where its client listens, published on
/// `{prefix}/{device}/errors` (QoS 1, not retained): an MQTT 3.1.1 request whose id cannot be a
/// topic level (empty, longer than 256 bytes, or containing `/`, `+`, `#`), one without an id,
/// or an MQTT 5 response topic outside the allowlist. The error part is an error reply's;
/// `response_topic` is the refused one, if there was one.
///
/// `{"id", "error": {"code", "message", "retryable"}, "response_topic"?}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Undeliverable {
    pub error: ErrorReply,
    pub response_topic: Option<String>,
}

impl Undeliverable {
    pub fn to_value(&self) -> Value {
        let mut v = self.error.to_value();
        if let (Value::Object(m), Some(t)) = (&mut v, &self.response_topic) {
            m.insert("response_topic".into(), t.as_str().into());
        }
        v
    }
}

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
    /// `primary` (the configured backend) or `fallback`.
    pub serving: String,
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

/// The retained status document.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub online: bool,
    pub version: String,
    pub backend: String,
    pub model: String,
    /// Seconds since the Unix epoch.
    pub started_at: u64,
    pub degraded: bool,
    /// `starting | ready | degraded`: whether questions are being answered, not just received.
    pub backend_state: String,
    /// This run's birth number: larger for a later start of the same device, so a consumer can
    /// tell a stale retained status from the current one (the start time in milliseconds).
    pub birth: u64,
    /// The vendor runtime's version the serving worker loaded (librknnrt's, QAIRT's build id);
    /// empty when the backend has none (`cpu`, `null`) or no worker is ready yet.
    pub runtime: String,
    /// The model's name: the manifest's `name`, else the model directory's name.
    pub model_name: String,
    /// The sha256 of the bundle's `laya-bundle.json` (none: a plain checkpoint directory).
    pub bundle_sha256: Option<String>,
    /// The fleet the device serves (`mqtt.fleet`; empty: none).
    pub fleet: String,
    /// How often in this run another client connected with this device's client id and took its
    /// session (DISCONNECT 0x8E): above zero, two devices share one client id (a cloned image).
    pub takeovers: u64,
}

impl Status {
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("state".into(), if self.online { "online" } else { "offline" }.into());
        m.insert("version".into(), self.version.as_str().into());
        m.insert("backend".into(), self.backend.as_str().into());
        m.insert("model".into(), self.model.as_str().into());
        m.insert("started_at".into(), Value::Int(self.started_at.into()));
        m.insert("degraded".into(), Value::Bool(self.degraded));
        m.insert("backend_state".into(), self.backend_state.as_str().into());
        m.insert("birth".into(), Value::Int(self.birth.into()));
        m.insert("runtime".into(), self.runtime.as_str().into());
        m.insert("model_name".into(), self.model_name.as_str().into());
        m.insert("bundle_sha256".into(), self.bundle_sha256.as_deref().map_or(Value::Null, Value::from));
        m.insert("fleet".into(), self.fleet.as_str().into());
        m.insert("takeovers".into(), Value::Int(self.takeovers.into()));
        Value::Object(m)
    }

    /// Reads a status document back (a consumer's side, `laya-edge fleet`): `None` unless it has
    /// a `state`; keys an older agent did not send read as empty or zero.
    pub fn from_value(v: &Value) -> Option<Status> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
        let u = |k: &str| v.get(k).and_then(Value::as_i64).and_then(|x| u64::try_from(x).ok()).unwrap_or(0);
        Some(Status {
            online: v.get("state")?.as_str()? == "online",
            version: s("version"),
            backend: s("backend"),
            model: s("model"),
            started_at: u("started_at"),
            degraded: v.get("degraded").is_some_and(Value::is_truthy),
            backend_state: s("backend_state"),
            birth: u("birth"),
            runtime: s("runtime"),
            model_name: s("model_name"),
            bundle_sha256: v.get("bundle_sha256").and_then(Value::as_str).map(str::to_owned),
            fleet: s("fleet"),
            takeovers: u("takeovers"),
        })
    }
}

/// A backend event on `{prefix}/{device}/events`, published when it happens (QoS 1, not retained):
/// `{event, reason, code, name, message, deadline_ms, role}`.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineEvent {
    /// `worker_restart`, `backend_degraded` or `backend_recovered`.
    pub event: String,
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
    /// `primary` or `fallback`: which worker it concerns.
    pub role: String,
    /// The probe's figures, for `probe_failed`.
    pub probe: Option<ProbeFigures>,
}

/// One run of a bundle's probe: how closely the backend answered like the float model.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeFigures {
    /// `primary` or `fallback`: which worker ran it.
    pub role: String,
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
    /// What fell below the bundle's thresholds (empty when passed).
    pub verdict: String,
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
        m.insert("role".into(), self.role.as_str().into());
        if let Some(p) = &self.probe {
            m.insert("probe".into(), p.to_value());
        }
        Value::Object(m)
    }
}

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
    /// `starting | ready | degraded`.
    pub backend_state: String,
    /// Whether the configured backend serves (`primary`) or the CPU fallback does (`fallback`).
    pub primary: bool,
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
        m.insert("serving".into(), if self.primary { "primary" } else { "fallback" }.into());
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

    #[test]
    fn encoding_follows_the_content_type_then_the_first_byte() {
        assert_eq!(Encoding::detect(Some("application/cbor"), b"{"), Encoding::Cbor);
        assert_eq!(Encoding::detect(Some("application/json; charset=utf-8"), &[0xa1]), Encoding::Json);
        assert_eq!(Encoding::detect(None, b" {\"a\":1}"), Encoding::Json);
        assert_eq!(Encoding::detect(None, &[0xa2, 0x61]), Encoding::Cbor);
        assert_eq!(Encoding::detect(Some("text/plain"), b"{}"), Encoding::Json);
    }

    #[test]
    fn error_replies_say_whether_to_retry() {
        let e = ErrorReply { id: Some("r".into()), code: ErrorCode::Overloaded, message: "queue full".into() };
        assert_eq!(
            json::to_string(&e.to_value(), json::Style::COMPACT),
            r#"{"id":"r","error":{"code":"overloaded","message":"queue full","retryable":true}}"#
        );
        assert!(!ErrorCode::BadRequest.retryable());
        assert_eq!(ErrorCode::parse("too_large"), Some(ErrorCode::TooLarge));
    }

    #[test]
    fn an_undeliverable_question_names_its_id_reason_and_refused_topic() {
        let e = ErrorReply { id: Some("".into()), code: ErrorCode::BadRequest, message: "empty id".into() };
        let u = Undeliverable { error: e.clone(), response_topic: None };
        assert_eq!(
            json::to_string(&u.to_value(), json::Style::COMPACT),
            r#"{"id":"","error":{"code":"bad_request","message":"empty id","retryable":false}}"#
        );
        let u = Undeliverable { error: e, response_topic: Some("factory/valves".into()) };
        assert_eq!(
            json::to_string(&u.to_value(), json::Style::COMPACT),
            r#"{"id":"","error":{"code":"bad_request","message":"empty id","retryable":false},"response_topic":"factory/valves"}"#
        );
    }

    #[test]
    fn an_engine_event_carries_the_errors_meaning() {
        let e = EngineEvent {
            event: "worker_restart".into(),
            reason: Some("fatal".into()),
            code: Some(-7),
            name: Some("RKNN_ERR_TIMEOUT".into()),
            message: "rknn_run: RKNN_ERR_TIMEOUT (-7)".into(),
            deadline_ms: None,
            role: "primary".into(),
            probe: None,
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
            backend_state: "degraded".into(),
            primary: false,
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

    #[test]
    fn a_status_reads_back_what_it_wrote_and_an_older_agents_status_still_reads() {
        let s = Status {
            online: true,
            version: "0.1.0".into(),
            backend: "rknn".into(),
            model: "/opt/laya/bundle".into(),
            started_at: 1_700_000_000,
            degraded: false,
            backend_state: "ready".into(),
            birth: 1_700_000_000_123,
            runtime: "2.3.2 (429f97ae6b@2025-04-09T09:09:27)".into(),
            model_name: "tickets-v3".into(),
            bundle_sha256: Some("ab".repeat(32)),
            fleet: "line-3".into(),
            takeovers: 3,
        };
        assert_eq!(Status::from_value(&s.to_value()), Some(s));
        let old = json::parse_str(r#"{"state":"offline","backend":"cpu"}"#, Default::default()).unwrap();
        let read = Status::from_value(&old).unwrap();
        assert!(!read.online);
        assert_eq!((read.backend.as_str(), read.birth, read.bundle_sha256), ("cpu", 0, None));
        assert_eq!(Status::from_value(&Value::Object(Map::new())), None);
    }

    #[test]
    fn a_probe_failure_event_carries_the_figures() {
        let figures = ProbeFigures {
            role: "primary".into(),
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
            verdict: "argmax agreement 0.500 < 0.9".into(),
        };
        let e = EngineEvent {
            event: "probe_failed".into(),
            reason: None,
            code: None,
            name: None,
            message: "probe failed".into(),
            deadline_ms: None,
            role: "primary".into(),
            probe: Some(figures),
        };
        assert_eq!(
            json::to_string(&e.to_value(), json::Style::COMPACT),
            concat!(
                r#"{"event":"probe_failed","reason":null,"code":null,"name":null,"message":"probe failed","deadline_ms":null,"role":"primary","#,
                r#""probe":{"role":"primary","backend":"qnn","rows":36,"agree":18,"clear":30,"clear_agree":14,"mean_dp":0.25,"max_dp":0.5,"#,
                r#""mean_cosine":0.5,"collapse":"all 36 probe rows came back near-uniform","passed":false,"verdict":"argmax agreement 0.500 < 0.9"}}"#
            )
        );
    }
}
