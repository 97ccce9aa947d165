//! The agent as thin-edge.io sees it (`[thin_edge]`, issue #42): its topics and documents in
//! thin-edge's own formats, as pure functions of the agent's wire documents. The agent's bridge
//! (`agent/src/thin_edge.rs`) does only the I/O: it reads the agent's retained status, its
//! telemetry and its events and publishes what these functions return, so a thin-edge fleet
//! (its mapper, `tedge mqtt sub 'te/#'`, Cumulocity) sees the agent as one of its services.
//!
//! ```text
//! {root}/device/{device}/service/{service}                      registration (retained)
//! {root}/device/{device}/service/{service}/status/health        {"status": "up" | "down"} (retained; the will: down)
//! {root}/device/{device}/service/{service}/m/laya_edge          telemetry's numbers as a measurement
//! {root}/device/{device}/service/{service}/e/{event}            each engine event, reload outcomes included
//! {root}/device/{device}/service/{service}/cmd/health/check     thin-edge asks this service for its health
//! {root}/device/{device}///cmd/health/check                     thin-edge asks every service of the device
//! ```
//!
//! thin-edge's formats (its documentation, "MQTT API" and "Thin Edge JSON"): an entity is
//! registered by a retained `{"@type": "service", ...}` on its topic; a service keeps its health
//! retained on `status/health` and registers a `down` Last Will; a measurement is an object of
//! numbers, each either a single value or a group one level deep (`{"group": {"a": 1}}`), with
//! keys of letters, digits and `_` not starting with `_`, `time` and `type` reserved; an event has
//! a `text` (and any other fragments). Without a `time`, thin-edge stamps a message when it
//! receives it.
//!
//! ```
//! use laya_topics::thin_edge::Service;
//! let s = Service::new("te", "main", "laya-edge").unwrap();
//! assert_eq!(s.entity(), "te/device/main/service/laya-edge");
//! assert_eq!(s.health_topic(), "te/device/main/service/laya-edge/status/health");
//! assert_eq!(s.will().payload, br#"{"status":"down"}"#);
//! ```

use crate::json;
use crate::value::{Map, Value};
use crate::wire::{BackendState, Status};

/// `[thin_edge] topic_root`'s default: thin-edge's own root.
pub const DEFAULT_ROOT: &str = "te";
/// `[thin_edge] device`'s default: thin-edge's name for the device it runs on.
pub const DEFAULT_DEVICE: &str = "main";
/// `[thin_edge] service`'s default.
pub const DEFAULT_SERVICE: &str = "laya-edge";
/// The measurement type telemetry is published as (`.../m/laya_edge`).
pub const MEASUREMENT_TYPE: &str = "laya_edge";
/// The longest device or service name, and the longest root, in bytes: thin-edge's entity ids
/// become cloud identifiers (`{device}:device:{child}:service:{service}` in Cumulocity), so short.
pub const NAME_MAX: usize = 64;
/// The most measurement series one telemetry document becomes; beyond them the rest are left out
/// (a document is the agent's own, but anyone who may publish on its telemetry topic could send
/// one with a million keys).
pub const SERIES_MAX: usize = 512;
/// The longest event `text`, in bytes (cut on a character boundary, with `...`).
pub const TEXT_MAX: usize = 1024;

/// Why a `[thin_edge]` name cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error(
        "thin_edge.{what} {value:?} must be 1 to {NAME_MAX} bytes of letters, digits, '-', '_' and '.' (a thin-edge entity id, a topic level)"
    )]
    BadName { what: &'static str, value: String },
    #[error(
        "thin_edge.topic_root {0:?} must be 1 to {NAME_MAX} bytes of topic levels of letters, digits, '-', '_' and '.', separated by '/'"
    )]
    BadRoot(String),
}

fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= NAME_MAX
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s != "."
        && s != ".."
}

/// One published message: where, what, and whether the broker keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub topic: String,
    pub payload: Vec<u8>,
    pub retain: bool,
}

/// A service's health as thin-edge names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Up,
    Down,
}

impl Health {
    /// The wire string, `up` or `down`.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Up => "up",
            Health::Down => "down",
        }
    }

    /// The agent's health from its status document: `up` while it is online and a healthy
    /// primary serves (`backend_state` `ready`); `down` when it is offline, still starting, or
    /// degraded (the fallback serves, or questions are refused: the status does not say which,
    /// and either way the configured backend is not serving).
    pub fn of(status: &Status) -> Health {
        if status.online && status.backend_state == Some(BackendState::Ready) { Health::Up } else { Health::Down }
    }
}

/// The agent as one thin-edge service: `{root}/device/{device}/service/{service}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    root: String,
    device: String,
    service: String,
}

impl Default for Service {
    fn default() -> Service {
        Service { root: DEFAULT_ROOT.into(), device: DEFAULT_DEVICE.into(), service: DEFAULT_SERVICE.into() }
    }
}

fn document(v: &Value) -> Vec<u8> {
    json::to_string(v, json::Style::COMPACT).into_bytes()
}

impl Service {
    /// The service `service` of the device `device` under `root` (checked: names of letters,
    /// digits, `-`, `_`, `.`, at most [`NAME_MAX`] bytes; a root of such levels).
    pub fn new(root: &str, device: &str, service: &str) -> Result<Service, NameError> {
        if root.len() > NAME_MAX || !root.split('/').all(name_ok) {
            return Err(NameError::BadRoot(root.to_owned()));
        }
        for (what, value) in [("device", device), ("service", service)] {
            if !name_ok(value) {
                return Err(NameError::BadName { what, value: value.to_owned() });
            }
        }
        Ok(Service { root: root.to_owned(), device: device.to_owned(), service: service.to_owned() })
    }

    /// The service's entity topic, `{root}/device/{device}/service/{service}`.
    pub fn entity(&self) -> String {
        format!("{}/device/{}/service/{}", self.root, self.device, self.service)
    }

    /// `{entity}/status/health`.
    pub fn health_topic(&self) -> String {
        format!("{}/status/health", self.entity())
    }

    /// `{entity}/m/{kind}`.
    pub fn measurement_topic(&self, kind: &str) -> String {
        format!("{}/m/{kind}", self.entity())
    }

    /// `{entity}/e/{kind}`.
    pub fn event_topic(&self, kind: &str) -> String {
        format!("{}/e/{kind}", self.entity())
    }

    /// The health check commands the service answers by publishing its health again: its own
    /// and the device's (`{root}/device/{device}///cmd/health/check`, for every service).
    pub fn health_check_topics(&self) -> [String; 2] {
        [
            format!("{}/cmd/health/check", self.entity()),
            format!("{}/device/{}///cmd/health/check", self.root, self.device),
        ]
    }

    /// The retained registration: `{"@parent": "device/{device}//", "@type": "service", "name",
    /// "type": "service"}`, as thin-edge's own services register.
    pub fn registration(&self) -> Message {
        let mut m = Map::new();
        m.insert("@parent".into(), format!("device/{}//", self.device).into());
        m.insert("@type".into(), "service".into());
        m.insert("name".into(), self.service.as_str().into());
        m.insert("type".into(), "service".into());
        Message { topic: self.entity(), payload: document(&Value::Object(m)), retain: true }
    }

    /// The retained health: `{"status", "pid"?, "time"?}` (`time` in seconds since the Unix
    /// epoch). What the bridge publishes itself carries both; the will has neither.
    pub fn health(&self, health: Health, pid: Option<u32>, time: Option<u64>) -> Message {
        let mut m = Map::new();
        if let Some(pid) = pid {
            m.insert("pid".into(), Value::Int(u64::from(pid).into()));
        }
        m.insert("status".into(), health.as_str().into());
        if let Some(t) = time {
            m.insert("time".into(), Value::Int(t.into()));
        }
        Message { topic: self.health_topic(), payload: document(&Value::Object(m)), retain: true }
    }

    /// The Last Will: `{"status": "down"}`, retained.
    pub fn will(&self) -> Message {
        self.health(Health::Down, None, None)
    }

    /// A telemetry document's numbers as one measurement on `{entity}/m/laya_edge`, not retained:
    /// each top-level number a single value; each top-level object a group whose series are its
    /// numbers at any depth, named by their path below it joined with `_`
    /// (`probes.primary.last.mean_dp` is `probes: {primary_last_mean_dp}`); booleans as 0 or 1;
    /// strings, nulls, arrays and numbers that are not finite left out; keys made of thin-edge's
    /// characters (others become `_`), `time` and `type` not used. `None` when nothing numeric
    /// is left.
    pub fn measurement(&self, telemetry: &Value) -> Option<Message> {
        let top = telemetry.as_object()?;
        let mut out = Map::new();
        let mut series = 0usize;
        for (key, value) in top {
            let Some(key) = series_key(key).filter(|k| k != "time" && k != "type") else { continue };
            if series >= SERIES_MAX {
                break;
            }
            if let Some(n) = number(value) {
                out.insert(key, n);
                series += 1;
            } else if let Value::Object(inner) = value {
                let mut group = Map::new();
                flatten(inner, "", &mut group, &mut series, 1);
                if !group.is_empty() {
                    out.insert(key, Value::Object(group));
                }
            }
        }
        (!out.is_empty()).then(|| Message {
            topic: self.measurement_topic(MEASUREMENT_TYPE),
            payload: document(&Value::Object(out)),
            retain: false,
        })
    }

    /// An event of the agent's events topic as a thin-edge event on `{entity}/e/{event}` (the
    /// agent's own name: `reloaded`, `reload_rejected`, `reload_superseded`, `worker_restart`,
    /// ...), not retained: `{"text", "reason"?, "role"?, "reload"?, "serving"?}`. The `text`
    /// names the event and says its message; a reload outcome's names the request and the model
    /// that serves once it is settled. `None` for a document without an `event` name.
    pub fn event(&self, event: &Value) -> Option<Message> {
        let kind = event.get("event").and_then(Value::as_str).and_then(series_key)?;
        let message = event.get("message").and_then(Value::as_str).unwrap_or_default();
        let reload = event.get("reload").filter(|r| r.as_object().is_some());
        let serving = event.get("serving").filter(|s| s.as_object().is_some());
        let mut text = match reload.and_then(|r| r.get("request")).and_then(Value::as_i64) {
            Some(n) => format!("{kind} (reload request {n})"),
            None => kind.clone(),
        };
        if !message.is_empty() {
            text.push_str(&format!(": {message}"));
        }
        if let Some(s) = serving {
            let name = s.get("name").and_then(Value::as_str).unwrap_or_default();
            let version = s.get("version").and_then(Value::as_str).unwrap_or_default();
            text.push_str(&format!("; serving {name} version {version}"));
        }
        let mut m = Map::new();
        m.insert("text".into(), cut(&text, TEXT_MAX).into());
        for key in ["reason", "role"] {
            if let Some(s) = event.get(key).and_then(Value::as_str).filter(|s| !s.is_empty()) {
                m.insert(key.into(), cut(s, TEXT_MAX).into());
            }
        }
        if let Some(r) = reload {
            m.insert("reload".into(), r.clone());
        }
        if let Some(s) = serving {
            m.insert("serving".into(), s.clone());
        }
        Some(Message { topic: self.event_topic(&kind), payload: document(&Value::Object(m)), retain: false })
    }
}

/// A number thin-edge takes: an integer, a finite float, a boolean as 0 or 1.
fn number(v: &Value) -> Option<Value> {
    match v {
        Value::Int(_) => Some(v.clone()),
        Value::Float(f) if f.is_finite() => Some(v.clone()),
        Value::Bool(b) => Some(Value::int(i64::from(*b))),
        _ => None,
    }
}

/// The deepest level flattened into a group: deeper objects are left out.
const DEPTH_MAX: usize = 8;

/// Every number below `map` into `group`, named by its path from the group joined with `_`.
fn flatten(map: &Map, path: &str, group: &mut Map, series: &mut usize, depth: usize) {
    for (key, value) in map {
        if *series >= SERIES_MAX {
            return;
        }
        let Some(key) = series_key(key) else { continue };
        let name = if path.is_empty() { key } else { format!("{path}_{key}") };
        if let Some(n) = number(value) {
            group.insert(name, n);
            *series += 1;
        } else if let Value::Object(inner) = value
            && depth < DEPTH_MAX
        {
            flatten(inner, &name, group, series, depth + 1);
        }
    }
}

/// A key in thin-edge's characters: letters, digits and `_`, not starting with `_` (others
/// become `_`, leading ones are dropped); none when nothing is left.
fn series_key(key: &str) -> Option<String> {
    let k: String = key.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    let k = k.trim_start_matches('_');
    (!k.is_empty()).then(|| k.to_owned())
}

/// `s` cut to at most `max` bytes on a character boundary, `...` marking a cut.
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::{self, ParseOptions};
    use crate::wire::{EngineEvent, EventKind, ReloadRef, ServedModel};

    fn parse(text: &str) -> Value {
        json::parse_str(text, ParseOptions::default()).expect("json")
    }

    fn text(m: &Message) -> String {
        String::from_utf8(m.payload.clone()).expect("utf-8")
    }

    fn status(online: bool, state: Option<BackendState>) -> Status {
        let mut s = Status::from_value(&parse(r#"{"state":"online"}"#)).expect("a status");
        s.online = online;
        s.backend_state = state;
        s
    }

    #[test]
    fn the_service_registers_retained_on_its_entity_topic_as_thin_edges_own_services_do() {
        let s = Service::default();
        let r = s.registration();
        assert_eq!(r.topic, "te/device/main/service/laya-edge");
        assert!(r.retain);
        assert_eq!(text(&r), r#"{"@parent":"device/main//","@type":"service","name":"laya-edge","type":"service"}"#);
        let child = Service::new("acme/te", "board-7", "laya").unwrap();
        assert_eq!(child.registration().topic, "acme/te/device/board-7/service/laya");
        assert!(text(&child.registration()).contains(r#""@parent":"device/board-7//""#));
        assert_eq!(child.measurement_topic("laya_edge"), "acme/te/device/board-7/service/laya/m/laya_edge");
        assert_eq!(child.event_topic("reloaded"), "acme/te/device/board-7/service/laya/e/reloaded");
        assert_eq!(
            child.health_check_topics(),
            ["acme/te/device/board-7/service/laya/cmd/health/check", "acme/te/device/board-7///cmd/health/check"]
        );
    }

    #[test]
    fn health_is_up_only_while_online_with_a_ready_backend_and_the_will_says_down_without_a_time() {
        assert_eq!(Health::of(&status(true, Some(BackendState::Ready))), Health::Up);
        for (online, state) in [
            (false, Some(BackendState::Ready)),
            (true, Some(BackendState::Starting)),
            (true, Some(BackendState::Degraded)),
            (true, None),
        ] {
            assert_eq!(Health::of(&status(online, state)), Health::Down, "{online} {state:?}");
        }
        let s = Service::default();
        let up = s.health(Health::Up, Some(42), Some(1_700_000_000));
        assert_eq!(up.topic, "te/device/main/service/laya-edge/status/health");
        assert!(up.retain);
        assert_eq!(text(&up), r#"{"pid":42,"status":"up","time":1700000000}"#);
        let will = s.will();
        assert_eq!((will.topic.as_str(), will.retain), (up.topic.as_str(), true));
        assert_eq!(text(&will), r#"{"status":"down"}"#);
    }

    #[test]
    fn names_that_are_not_one_topic_level_of_plain_characters_are_refused() {
        assert!(Service::new("te", "main", "laya-edge").is_ok());
        assert!(Service::new("a/b.c", "child_01", "x.y-z").is_ok());
        for (root, device, service, what) in [
            ("te", "main", "", "service"),
            ("te", "ma/in", "s", "device"),
            ("te", "main", "s+", "service"),
            ("te", "main#", "s", "device"),
            ("te", "..", "s", "device"),
            ("te", "main", "a b", "service"),
            ("te", &"d".repeat(NAME_MAX + 1), "s", "device"),
        ] {
            let err = Service::new(root, device, service).expect_err(device);
            assert!(matches!(&err, NameError::BadName { what: w, .. } if *w == what), "{err}");
        }
        for root in ["", "/te", "te/", "$SYS", "te/+", "a//b", &"r".repeat(NAME_MAX + 1)] {
            assert!(matches!(Service::new(root, "main", "s"), Err(NameError::BadRoot(_))), "{root:?}");
        }
        let msg = Service::new("te", "main", "a/b").unwrap_err().to_string();
        assert!(msg.contains("thin_edge.service") && msg.contains("\"a/b\""), "{msg}");
    }

    #[test]
    fn telemetry_becomes_a_measurement_of_its_numbers_with_nested_objects_as_groups() {
        let t = parse(
            r#"{"device":"d1","uptime_s":7,"answered":5,"refused":{"overloaded":2,"bad_request":0},
                "backend":"qnn","backend_state":"degraded","serving":"fallback","degraded":true,
                "token_memo":{"hits":9,"misses":2},"busy":0.25,"temperature_c":null,
                "latency_ms":{"total":{"p50":1.5,"p99":3.0},"queue":null},
                "probes":{"primary":{"last":{"mean_dp":0.01,"passed":false,"verdict":"ok","graphs":[{"rows":3}]}}},
                "model":{"name":"m","version":"v3","bundle_sha256":null,"since":1700000000},
                "probe":null,"restarts":{},"time":5,"type":6,"_x":{"-y":1},"nan":NaN}"#,
        );
        let m = Service::default().measurement(&t).expect("a measurement");
        assert_eq!(m.topic, "te/device/main/service/laya-edge/m/laya_edge");
        assert!(!m.retain);
        assert_eq!(
            text(&m),
            concat!(
                r#"{"uptime_s":7,"answered":5,"refused":{"overloaded":2,"bad_request":0},"degraded":1,"#,
                r#""token_memo":{"hits":9,"misses":2},"busy":0.25,"latency_ms":{"total_p50":1.5,"total_p99":3.0},"#,
                r#""probes":{"primary_last_mean_dp":0.01,"primary_last_passed":0},"model":{"since":1700000000},"#,
                r#""x":{"y":1}}"#
            )
        );
        assert_eq!(Service::default().measurement(&parse(r#"{"device":"d","backend":"cpu"}"#)), None);
        assert_eq!(Service::default().measurement(&parse("[1,2]")), None);
    }

    #[test]
    fn a_telemetry_document_with_too_many_numbers_is_cut_at_the_series_bound() {
        let mut inner = Map::new();
        for i in 0..(SERIES_MAX + 100) {
            inner.insert(format!("k{i}"), Value::int(i as i64));
        }
        let mut top = Map::new();
        top.insert("uptime_s".into(), Value::int(1));
        top.insert("flood".into(), Value::Object(inner));
        top.insert("after".into(), Value::int(2));
        let m = Service::default().measurement(&Value::Object(top)).expect("a measurement");
        let v = parse(&text(&m));
        let flood = v.get("flood").and_then(Value::as_object).expect("the group");
        assert_eq!(flood.len(), SERIES_MAX - 1);
        assert!(v.get("after").is_none());
    }

    fn reload_event(kind: EventKind, message: &str) -> Value {
        EngineEvent {
            event: kind,
            reason: None,
            code: None,
            name: None,
            message: message.into(),
            deadline_ms: None,
            role: None,
            probe: None,
            reload: Some(ReloadRef { request: 2, model: Some("/m/v4".into()) }),
            serving: Some(ServedModel {
                name: "tickets".into(),
                version: "v4".into(),
                bundle_sha256: Some("ab".into()),
                since: 1_700_000_100,
            }),
        }
        .to_value()
    }

    #[test]
    fn each_reload_outcome_is_an_event_naming_the_outcome_the_request_and_the_model_that_serves() {
        let s = Service::default();
        let e = s.event(&reload_event(EventKind::Reloaded, "now serving /m/v4")).expect("an event");
        assert_eq!(e.topic, "te/device/main/service/laya-edge/e/reloaded");
        assert!(!e.retain);
        assert_eq!(
            text(&e),
            concat!(
                r#"{"text":"reloaded (reload request 2): now serving /m/v4; serving tickets version v4","#,
                r#""reload":{"request":2,"model":"/m/v4"},"#,
                r#""serving":{"name":"tickets","version":"v4","bundle_sha256":"ab","since":1700000100}}"#
            )
        );
        for kind in [EventKind::ReloadRejected, EventKind::ReloadSuperseded] {
            let e = s.event(&reload_event(kind, "why")).expect("an event");
            assert_eq!(e.topic, format!("te/device/main/service/laya-edge/e/{kind}"));
            assert!(text(&e).starts_with(&format!(r#"{{"text":"{kind} (reload request 2): why; serving tickets"#)));
        }
    }

    #[test]
    fn other_engine_events_are_events_with_a_text_and_their_reason_and_role() {
        let e = parse(
            r#"{"event":"worker_restart","reason":"fatal","code":-7,"name":"RKNN_ERR_TIMEOUT","message":"rknn_run: RKNN_ERR_TIMEOUT (-7)","deadline_ms":null,"role":"primary"}"#,
        );
        let m = Service::default().event(&e).expect("an event");
        assert_eq!(m.topic, "te/device/main/service/laya-edge/e/worker_restart");
        assert_eq!(
            text(&m),
            r#"{"text":"worker_restart: rknn_run: RKNN_ERR_TIMEOUT (-7)","reason":"fatal","role":"primary"}"#
        );
        let quiet = parse(r#"{"event":"session_taken_over","message":"","role":""}"#);
        assert_eq!(text(&Service::default().event(&quiet).unwrap()), r#"{"text":"session_taken_over"}"#);
        // A name that is not a topic level is made one; no name, no event.
        let odd = parse(r#"{"event":"a/b+#","message":"m"}"#);
        assert_eq!(Service::default().event(&odd).unwrap().topic, "te/device/main/service/laya-edge/e/a_b__");
        assert_eq!(Service::default().event(&parse(r#"{"message":"m"}"#)), None);
        let long = parse(&format!(r#"{{"event":"probe_failed","message":"{}"}}"#, "é".repeat(TEXT_MAX)));
        let v = parse(&text(&Service::default().event(&long).unwrap()));
        let t = v.get("text").and_then(Value::as_str).unwrap();
        assert!(t.len() <= TEXT_MAX && t.ends_with("..."), "{}", t.len());
    }
}
