//! The fleet view's state, without I/O: what is known of each device from the documents it
//! published (retained status, telemetry, events), and which devices are in trouble.
//!
//! `laya-edge fleet` feeds it every message it receives ([`Fleet::handle`]) and asks for
//! [`Fleet::rows`] to draw (`fleet_view`); time is an argument, so staleness is unit-tested with
//! simulated time. The view is a client of the broker only: it never talks to a board.
//!
//! A status document older than the one held (a smaller `birth`: a retained status or Last Will
//! of an earlier run arriving late) is ignored. A device whose status says online but whose
//! telemetry stopped for three of its intervals is `silent` (a hung agent or a broken link the
//! broker has not noticed yet).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use laya_topics::Value;
use laya_topics::load::Load;
use laya_topics::topic::{Channel, Schema};
use laya_topics::wire::{BackendState, Status};

/// How a device is doing, worst first (the table's order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Health {
    /// Its status says offline (its own goodbye or its Last Will).
    Offline,
    /// Online by its status, but no telemetry for three intervals.
    Silent,
    /// Serving from the CPU fallback, or not at all.
    Degraded,
    /// Telemetry seen, no status yet.
    Unknown,
    /// Its backend is still loading.
    Starting,
    Ok,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Offline => "offline",
            Health::Silent => "silent",
            Health::Degraded => "degraded",
            Health::Unknown => "unknown",
            Health::Starting => "starting",
            Health::Ok => "ok",
        }
    }
}

/// What is known of one device.
#[derive(Debug, Clone, Default)]
struct Device {
    status: Option<Status>,
    /// The last telemetry's load figures, backend state, restart total and when it came.
    load: Option<Load>,
    telemetry_state: Option<BackendState>,
    restarts: u64,
    telemetry_at: Option<Instant>,
    /// The last event: its name, reason and message.
    last_event: Option<(String, Option<String>, String)>,
    /// Whether the backend state of the telemetry is newer than the status's.
    telemetry_newer: bool,
}

/// One line of the view.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub device: String,
    pub health: Health,
    /// `online`, `offline` or empty (no status seen).
    pub state: String,
    pub backend: String,
    /// `starting | ready | degraded`.
    pub backend_state: String,
    pub model: String,
    pub questions_per_s: Option<f64>,
    pub p95_total_ms: Option<f64>,
    pub busy: Option<f64>,
    pub restarts: u64,
    pub temperature_c: Option<f64>,
    /// `event (reason): message`.
    pub last_event: Option<String>,
    pub birth: u64,
}

/// The fleet's state.
#[derive(Debug, Clone)]
pub struct Fleet {
    schema: Schema,
    /// Only devices whose status names this fleet (none: every device).
    fleet: Option<String>,
    devices: BTreeMap<String, Device>,
}

/// Telemetry missing for this many intervals makes an online device silent.
pub const SILENT_AFTER_INTERVALS: u32 = 3;

impl Fleet {
    pub fn new(schema: Schema, fleet: Option<String>) -> Fleet {
        Fleet { schema, fleet, devices: BTreeMap::new() }
    }

    /// The topic filters to subscribe to.
    pub fn subscriptions(&self) -> Vec<String> {
        [Channel::Status, Channel::Telemetry, Channel::Events]
            .iter()
            .filter_map(|c| self.schema.every_device(c))
            .collect()
    }

    /// Takes one received document; anything not a device's status, telemetry or event, or not
    /// decodable, is ignored. Returns whether the view changed.
    pub fn handle(&mut self, now: Instant, topic: &str, doc: Option<&Value>) -> bool {
        let Some(t) = self.schema.parse(topic) else { return false };
        let Some(doc) = doc else { return false };
        match t.channel {
            Channel::Status => {
                let Some(status) = Status::from_value(doc) else { return false };
                let d = self.devices.entry(t.device).or_default();
                if d.status.as_ref().is_some_and(|held| status.birth < held.birth) {
                    return false; // an earlier run's status, arriving late
                }
                d.status = Some(status);
                d.telemetry_newer = false;
                true
            }
            Channel::Telemetry => {
                let d = self.devices.entry(t.device).or_default();
                d.load = Some(Load::from_value(doc));
                d.telemetry_state = doc.get("backend_state").and_then(Value::as_str).and_then(|s| s.parse().ok());
                d.restarts = doc
                    .get("restarts")
                    .and_then(Value::as_object)
                    .map(|m| m.values().filter_map(Value::as_i64).map(|n| n.max(0) as u64).sum())
                    .unwrap_or(0);
                d.telemetry_at = Some(now);
                d.telemetry_newer = true;
                true
            }
            Channel::Events => {
                let Some(event) = doc.get("event").and_then(Value::as_str) else { return false };
                let d = self.devices.entry(t.device).or_default();
                let reason = doc.get("reason").and_then(Value::as_str).map(str::to_owned);
                let message = doc.get("message").and_then(Value::as_str).unwrap_or_default().to_owned();
                d.last_event = Some((event.to_owned(), reason, message));
                true
            }
            _ => false,
        }
    }

    /// Whether a device is online by its status but has sent no telemetry yet (what `fleet
    /// --once` waits for: its figures); false with no device at all.
    pub fn awaiting_telemetry(&self) -> bool {
        self.devices.is_empty()
            || self.devices.values().any(|d| d.status.as_ref().is_some_and(|s| s.online) && d.telemetry_at.is_none())
    }

    fn health(d: &Device, now: Instant) -> Health {
        let Some(status) = &d.status else { return Health::Unknown };
        if !status.online {
            return Health::Offline;
        }
        if let (Some(at), Some(load)) = (d.telemetry_at, &d.load) {
            let interval = Duration::from_secs_f64(load.interval_s.clamp(1.0, 86_400.0));
            if now.saturating_duration_since(at) > interval * SILENT_AFTER_INTERVALS {
                return Health::Silent;
            }
        }
        let state = if d.telemetry_newer { d.telemetry_state } else { None };
        match state.or(status.backend_state) {
            Some(BackendState::Degraded) => Health::Degraded,
            Some(BackendState::Starting) => Health::Starting,
            // Ready, or a state this version does not know (or none, from an older agent).
            Some(BackendState::Ready) | None => Health::Ok,
        }
    }

    /// The devices, trouble first (then by name).
    pub fn rows(&self, now: Instant) -> Vec<Row> {
        let mut rows: Vec<Row> = self
            .devices
            .iter()
            .filter(|(_, d)| match (&self.fleet, &d.status) {
                (None, _) => true,
                (Some(f), Some(s)) => &s.fleet == f,
                (Some(_), None) => false,
            })
            .map(|(id, d)| {
                let health = Fleet::health(d, now);
                let s = d.status.as_ref();
                let backend_state = if d.telemetry_newer { d.telemetry_state } else { None }
                    .or_else(|| s.and_then(|s| s.backend_state))
                    .map(|b| b.to_string())
                    .unwrap_or_default();
                Row {
                    device: id.clone(),
                    health,
                    state: s.map(|s| if s.online { "online" } else { "offline" }.to_owned()).unwrap_or_default(),
                    backend: s.map(|s| s.backend.clone()).unwrap_or_default(),
                    backend_state,
                    model: s.map(|s| s.model_name.clone()).unwrap_or_default(),
                    questions_per_s: d.load.as_ref().map(|l| l.questions_per_s),
                    p95_total_ms: d.load.as_ref().and_then(|l| l.stage("total")).map(|p| p.p95),
                    busy: d.load.as_ref().map(|l| l.busy),
                    restarts: d.restarts,
                    temperature_c: d.load.as_ref().and_then(|l| l.temperature_c),
                    last_event: d.last_event.as_ref().map(|(e, r, m)| match r {
                        Some(r) => format!("{e} ({r}): {m}"),
                        None => format!("{e}: {m}"),
                    }),
                    birth: s.map_or(0, |s| s.birth),
                }
            })
            .collect();
        rows.sort_by(|a, b| a.health.cmp(&b.health).then_with(|| a.device.cmp(&b.device)));
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use laya_topics::json;

    fn doc(text: &str) -> Value {
        json::parse_str(text, Default::default()).unwrap()
    }

    fn status(online: bool, birth: u64, backend_state: &str, fleet: &str) -> Value {
        doc(&format!(
            r#"{{"state":"{}","backend":"rknn","model_name":"tickets","backend_state":"{backend_state}","birth":{birth},"fleet":"{fleet}"}}"#,
            if online { "online" } else { "offline" }
        ))
    }

    fn telemetry(state: &str, restarts: u64) -> Value {
        doc(&format!(
            r#"{{"backend_state":"{state}","restarts":{{"deadline":{restarts},"crash":1}},"interval_s":2.0,"questions_per_s":4.5,"latency_ms":{{"total":{{"p50":10.0,"p95":20.0,"p99":30.0}}}},"busy":0.25,"temperature_c":51.0}}"#
        ))
    }

    fn fleet() -> Fleet {
        Fleet::new(Schema::default(), None)
    }

    #[test]
    fn devices_are_listed_trouble_first_with_their_figures() {
        let mut f = fleet();
        let t0 = Instant::now();
        assert!(f.handle(t0, "laya/v1/b-ok/status", Some(&status(true, 1, "ready", ""))));
        f.handle(t0, "laya/v1/b-ok/telemetry", Some(&telemetry("ready", 2)));
        f.handle(t0, "laya/v1/a-down/status", Some(&status(false, 1, "ready", "")));
        f.handle(t0, "laya/v1/c-deg/status", Some(&status(true, 1, "ready", "")));
        f.handle(t0, "laya/v1/c-deg/telemetry", Some(&telemetry("degraded", 0)));
        f.handle(
            t0,
            "laya/v1/c-deg/events",
            Some(&doc(r#"{"event":"backend_degraded","reason":"crash","message":"worker died"}"#)),
        );
        let rows = f.rows(t0);
        let order: Vec<(&str, Health)> = rows.iter().map(|r| (r.device.as_str(), r.health)).collect();
        assert_eq!(order, [("a-down", Health::Offline), ("c-deg", Health::Degraded), ("b-ok", Health::Ok)]);
        let ok = &rows[2];
        assert_eq!((ok.questions_per_s, ok.p95_total_ms, ok.busy, ok.restarts), (Some(4.5), Some(20.0), Some(0.25), 3));
        assert_eq!((ok.temperature_c, ok.model.as_str(), ok.backend.as_str()), (Some(51.0), "tickets", "rknn"));
        assert_eq!(rows[1].last_event.as_deref(), Some("backend_degraded (crash): worker died"));
        assert_eq!(rows[0].questions_per_s, None);
    }

    #[test]
    fn an_earlier_runs_status_arriving_late_is_ignored() {
        let mut f = fleet();
        let t0 = Instant::now();
        f.handle(t0, "laya/v1/d/status", Some(&status(true, 200, "ready", "")));
        // The Last Will of the run before, delivered after the new run's birth.
        assert!(!f.handle(t0, "laya/v1/d/status", Some(&status(false, 100, "ready", ""))));
        assert_eq!(f.rows(t0)[0].health, Health::Ok);
        // This run's own goodbye counts.
        assert!(f.handle(t0, "laya/v1/d/status", Some(&status(false, 200, "ready", ""))));
        assert_eq!(f.rows(t0)[0].health, Health::Offline);
        // And a new run comes back.
        f.handle(t0, "laya/v1/d/status", Some(&status(true, 300, "starting", "")));
        assert_eq!((f.rows(t0)[0].health, f.rows(t0)[0].birth), (Health::Starting, 300));
    }

    #[test]
    fn an_online_device_whose_telemetry_stops_for_three_intervals_is_silent_until_it_speaks() {
        let mut f = fleet();
        let t0 = Instant::now();
        f.handle(t0, "laya/v1/d/status", Some(&status(true, 1, "ready", "")));
        f.handle(t0, "laya/v1/d/telemetry", Some(&telemetry("ready", 0)));
        assert_eq!(f.rows(t0 + Duration::from_secs(6))[0].health, Health::Ok, "three 2 s intervals: not yet");
        let later = t0 + Duration::from_millis(6_001);
        assert_eq!(f.rows(later)[0].health, Health::Silent);
        f.handle(later, "laya/v1/d/telemetry", Some(&telemetry("ready", 0)));
        assert_eq!(f.rows(later)[0].health, Health::Ok);
    }

    #[test]
    fn a_newer_status_overrides_the_telemetrys_backend_state_and_the_other_way_round() {
        let mut f = fleet();
        let t0 = Instant::now();
        f.handle(t0, "laya/v1/d/status", Some(&status(true, 1, "ready", "")));
        f.handle(t0, "laya/v1/d/telemetry", Some(&telemetry("degraded", 0)));
        assert_eq!(f.rows(t0)[0].health, Health::Degraded);
        f.handle(t0, "laya/v1/d/status", Some(&status(true, 1, "ready", "")));
        assert_eq!(f.rows(t0)[0].health, Health::Ok);
    }

    #[test]
    fn a_backend_state_this_version_does_not_know_is_not_counted_as_trouble() {
        let mut f = fleet();
        let t0 = Instant::now();
        f.handle(t0, "laya/v1/d/status", Some(&status(true, 1, "draining", "")));
        let row = &f.rows(t0)[0];
        assert_eq!((row.health, row.backend_state.as_str()), (Health::Ok, ""));
        f.handle(t0, "laya/v1/d/telemetry", Some(&telemetry("starting", 0)));
        let row = &f.rows(t0)[0];
        assert_eq!((row.health, row.backend_state.as_str()), (Health::Starting, "starting"));
    }

    #[test]
    fn the_fleet_filter_keeps_its_devices_and_foreign_topics_and_garbage_are_ignored() {
        let mut f = Fleet::new(Schema::default(), Some("line-3".into()));
        let t0 = Instant::now();
        f.handle(t0, "laya/v1/in/status", Some(&status(true, 1, "ready", "line-3")));
        f.handle(t0, "laya/v1/out/status", Some(&status(true, 1, "ready", "line-4")));
        f.handle(t0, "laya/v1/nostatus/telemetry", Some(&telemetry("ready", 0)));
        assert!(!f.handle(t0, "other/v1/x/status", Some(&status(true, 1, "ready", "line-3"))));
        assert!(!f.handle(t0, "laya/v1/x/status", None));
        assert!(!f.handle(t0, "laya/v1/x/status", Some(&doc("[1, 2]"))));
        assert!(!f.handle(t0, "laya/v1/x/events", Some(&doc(r#"{"no_event": 1}"#))));
        assert!(!f.handle(t0, "laya/v1/x/ask", Some(&doc("{}"))));
        let devices: Vec<String> = f.rows(t0).into_iter().map(|r| r.device).collect();
        assert_eq!(devices, ["in"]);
        assert_eq!(
            f.subscriptions(),
            ["laya/v1/+/status", "laya/v1/+/telemetry", "laya/v1/+/events"].map(String::from)
        );
    }
}
