//! What the agent says about itself: the retained status document and the periodic telemetry.
//!
//! The counters are written by the question tasks and the delivery gate and read here; the
//! interval's latencies are recorded as questions are answered and taken at each telemetry
//! tick. [`status`] is the one builder of the `Status` document: the running service, its Last
//! Will and the start-up report (`report.rs`) all call it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rumqttc::v5::mqttbytes::v5::PublishProperties;

use laya_topics::load::Load;
use laya_topics::wire::{self, Encoding, ErrorCode, Status, Telemetry, Timing, TokenMemo};

use super::events::{probe_figures, probe_histories};
use super::flow::Flow;
use super::identity::{Served, epoch_s};
use super::latency::StageLatencies;
use super::reload::Current;
use crate::engine::{Engine, EngineStatus};

/// Counters for telemetry (and the status document's `takeovers`).
#[derive(Debug, Default)]
pub struct Counters {
    answered: AtomicU64,
    /// Error replies by error code. A mutex: refusals are rare next to answers, and the map is
    /// small (one entry per code).
    refused: Mutex<BTreeMap<&'static str, u64>>,
    dropped: AtomicU64,
    resent: AtomicU64,
    /// Sessions another client with our client id took over in this run (`Status::takeovers`).
    takeovers: AtomicU64,
    /// The Prometheus side of the same facts (the HTTP door's `/metrics`), for both doors.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Why the engine last degraded to its CPU fallback (`/health`; how many times is counted
    /// once, in `metrics`).
    last_fallback: Mutex<Option<String>>,
}

impl Counters {
    pub fn answered(&self) {
        self.answered.fetch_add(1, Ordering::Relaxed);
    }

    pub fn refused(&self, code: ErrorCode) {
        if let Ok(mut m) = self.refused.lock() {
            *m.entry(code.as_str()).or_default() += 1;
        }
        self.metrics.rejected(code.as_str());
    }

    /// The engine degraded to its CPU fallback, for `why`.
    pub fn fell_back(&self, why: &str) {
        *self.last_fallback.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.to_owned());
        self.metrics.cpu_fallback();
    }

    /// Times the engine degraded to its CPU fallback, and the last reason.
    pub fn fallbacks(&self) -> (u64, Option<String>) {
        let why = self.last_fallback.lock().unwrap_or_else(|e| e.into_inner()).clone();
        (self.metrics.cpu_fallbacks(), why)
    }

    pub fn dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    pub fn resent(&self) {
        self.resent.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a takeover; how many there were in this run, this one included.
    pub fn taken_over(&self) -> u64 {
        self.takeovers.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn answered_total(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    fn takeovers(&self) -> u64 {
        self.takeovers.load(Ordering::Relaxed)
    }

    fn refused_by_code(&self) -> Vec<(String, u64)> {
        self.refused.lock().map(|r| r.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()).unwrap_or_default()
    }
}

/// What the status document says about this run, fixed at its start.
#[derive(Debug, Clone)]
pub struct Birth {
    /// Seconds since the epoch (`Status::started_at`).
    pub started_at: u64,
    /// Milliseconds since the epoch (`Status::birth`): larger for a later run.
    pub birth: u64,
    /// `mqtt.fleet`.
    pub fleet: String,
}

impl Birth {
    /// Now, for the fleet `fleet`.
    pub fn now(fleet: &str) -> Birth {
        let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        Birth { started_at: since.as_secs(), birth: since.as_millis() as u64, fleet: fleet.to_owned() }
    }
}

/// The status document. `engine` is the serving engine's state; none before it has any (the
/// Last Will, the start-up report): then `starting`, not degraded, no runtime.
pub fn status(
    online: bool,
    served: &Served<'_>,
    birth: &Birth,
    engine: Option<&EngineStatus>,
    takeovers: u64,
) -> Status {
    Status {
        online,
        version: env!("CARGO_PKG_VERSION").into(),
        backend: served.backend.to_owned(),
        model: served.model.clone(),
        started_at: birth.started_at,
        degraded: engine.is_some_and(|e| e.degraded),
        backend_state: Some(engine.map_or(wire::BackendState::Starting, |e| e.state)),
        birth: birth.birth,
        runtime: engine.map(|e| e.runtime.clone()).unwrap_or_default(),
        model_name: served.identity.model_name.clone(),
        bundle_sha256: served.identity.bundle_sha256.clone(),
        fleet: birth.fleet.clone(),
        takeovers,
        laya: Some(served.identity.laya),
        model_version: served.identity.model_version.clone(),
        serving_since: served.since,
        last_reload: served.last_reload.clone(),
    }
}

/// One telemetry interval in the making.
#[derive(Debug)]
pub struct Interval {
    latencies: StageLatencies,
    started: Instant,
    /// The engine's busy time when it started.
    busy_at_start: Duration,
}

impl Interval {
    pub fn new(started: Instant, busy_at_start: Duration) -> Interval {
        Interval { latencies: StageLatencies::default(), started, busy_at_start }
    }

    /// Records an answered question's timing.
    pub fn record(&mut self, timing: &Timing) {
        self.latencies.record(timing);
    }

    /// A new engine serves: its busy time counts from `busy` on.
    pub fn engine_changed(&mut self, busy: Duration) {
        self.busy_at_start = busy;
    }
}

/// The telemetry side of the service: everything the status and telemetry documents are made
/// of, and nothing a question needs.
pub struct Reporter {
    pub current: Arc<Current>,
    pub counters: Arc<Counters>,
    pub interval: Arc<Mutex<Interval>>,
    /// For `queue_depth` (the questions in the waiting room).
    pub flow: Arc<Flow>,
    pub birth: Birth,
    pub device: String,
    /// When this run started (`uptime_s`).
    pub started: Instant,
    /// How telemetry documents are encoded (`mqtt.telemetry_encoding`).
    pub encoding: Encoding,
    /// The last reload request's outcome, for the status document.
    pub last_reload: Mutex<Option<wire::LastReload>>,
}

impl Reporter {
    /// The status document, encoded.
    pub fn status(&self, online: bool) -> Vec<u8> {
        let serving = self.current.get();
        let es = serving.engine.status();
        let mut served = serving.served();
        served.since = self.current.since();
        served.last_reload = self.last_reload.lock().map(|l| l.clone()).unwrap_or_else(|e| e.into_inner().clone());
        Encoding::Json.encode(&status(online, &served, &self.birth, Some(&es), self.counters.takeovers()).to_value())
    }

    /// A reload request was settled: the status names it from now on.
    pub fn reload_settled(&self, event: &wire::EngineEvent) {
        let Some(request) = event.reload.clone() else { return };
        let last = wire::LastReload { event: event.event, request, at: epoch_s() };
        *self.last_reload.lock().unwrap_or_else(|e| e.into_inner()) = Some(last);
    }

    /// The load figures of the interval that ends now, and the start of the next.
    fn load(&self, engine: &Engine, es: &EngineStatus) -> Load {
        let now = Instant::now();
        let busy = engine.busy_time();
        let (questions, latency_ms, span, busy_in) = match self.interval.lock() {
            Ok(mut i) => {
                let (n, p) = i.latencies.take();
                let span = now - i.started;
                let busy_in = busy.saturating_sub(i.busy_at_start);
                i.started = now;
                i.busy_at_start = busy;
                (n, p, span, busy_in)
            }
            Err(_) => (0, [None; 5], Duration::ZERO, Duration::ZERO),
        };
        let secs = span.as_secs_f64();
        let per = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
        Load {
            interval_s: secs,
            questions,
            questions_per_s: per(questions as f64),
            latency_ms,
            busy: per(busy_in.as_secs_f64()).clamp(0.0, 1.0),
            queue_depth: (es.queued + self.flow.waiting_questions()) as u64,
            rss_kb_agent: crate::platform::vitals::own_rss_kb(),
            rss_kb_worker: es.worker_pid.and_then(crate::platform::vitals::rss_kb),
            temperature_c: crate::platform::vitals::max_temperature_c(),
        }
    }

    /// The telemetry document of the interval that ends now, encoded.
    pub fn telemetry(&self) -> Vec<u8> {
        let serving = self.current.get();
        let es = serving.engine.status();
        let load = self.load(&serving.engine, &es);
        let memo = serving.bundle.tokenizer.memo_stats();
        let t = Telemetry {
            device: self.device.clone(),
            uptime_s: self.started.elapsed().as_secs(),
            answered: self.counters.answered.load(Ordering::Relaxed),
            resent: self.counters.resent.load(Ordering::Relaxed),
            dropped: self.counters.dropped.load(Ordering::Relaxed),
            refused: self.counters.refused_by_code(),
            in_flight: es.in_flight as u64,
            backend: serving.backend.clone(),
            backend_state: es.state,
            serving: es.role,
            degraded: es.degraded,
            restarts: es.restarts,
            token_memo: TokenMemo { hits: memo.hits, misses: memo.misses, entries: memo.entries as u64 },
            // The configured backend's last run, else the fallback's: after a degradation the
            // fallback's passing runs must not stand for the primary (issue #28).
            probe: es.probes.first().map(|p| probe_figures(&p.last)),
            probes: probe_histories(&es.probes),
            load,
            model: Some(self.served_model()),
        };
        self.encoding.encode(&t.to_value())
    }

    /// The model that serves now, and since when.
    pub fn served_model(&self) -> wire::ServedModel {
        let serving = self.current.get();
        let served = serving.served();
        let id = served.identity;
        wire::ServedModel {
            name: id.model_name.clone(),
            version: id.model_version.clone(),
            bundle_sha256: id.bundle_sha256.clone(),
            since: self.current.since(),
        }
    }

    /// What the HTTP door's `/health` reports now: laya.serve's facts as the serving engine
    /// knows them, what is served and since when, the last reload.
    pub fn health(&self) -> laya_topics::jev::Health {
        let serving = self.current.get();
        let es = serving.engine.status();
        let (cpu_fallbacks, last_fallback_reason) = self.counters.fallbacks();
        let device = match es.role {
            wire::Role::Fallback => "cpu".to_owned(),
            wire::Role::Primary => es.backend.clone().unwrap_or_else(|| serving.backend.clone()),
        };
        laya_topics::jev::Health {
            loaded: matches!(es.state, wire::BackendState::Ready | wire::BackendState::Degraded),
            device,
            revision: serving.served().identity.bundle_sha256.clone(),
            cpu_fallbacks,
            last_fallback_reason,
            backend_state: es.state,
            served: Some(self.served_model()),
            last_reload: self.last_reload.lock().map(|l| l.clone()).unwrap_or_else(|e| e.into_inner().clone()),
            source: serving.bundle.dir.display().to_string(),
        }
    }

    /// The Prometheus gauges, as the loop's heartbeat sees the engine.
    pub fn refresh_metrics(&self) {
        let es = self.current.get().engine.status();
        let m = &self.counters.metrics;
        m.set_queue_depth(es.queued + self.flow.waiting_questions());
        m.set_backend_state(es.state);
    }

    /// The properties a telemetry publish carries.
    pub fn telemetry_properties(&self) -> PublishProperties {
        PublishProperties {
            content_type: Some(self.encoding.content_type().to_owned()),
            payload_format_indicator: Some(u8::from(self.encoding == Encoding::Json)),
            ..PublishProperties::default()
        }
    }

    /// The one line systemd shows for the service (`systemctl status`).
    pub fn systemd_status(&self) -> String {
        let serving = self.current.get();
        let degraded = if serving.engine.status().degraded { " (degraded)" } else { "" };
        format!("{} answered, backend {}{degraded}", self.counters.answered_total(), serving.backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_fall_back_to_the_cpu_is_counted_once_for_health_and_metrics_with_the_last_reason() {
        let c = Counters::default();
        assert_eq!(c.fallbacks(), (0, None));
        c.fell_back("worker crashed 3 times");
        c.fell_back("probe failed on graph 256");
        assert_eq!(c.fallbacks(), (2, Some("probe failed on graph 256".to_owned())));
        assert!(c.metrics.render().contains("\nlaya_edge_cpu_fallbacks_total 2\n"), "{}", c.metrics.render());
    }
    use crate::service::identity::Identity;

    fn identity() -> Identity {
        Identity {
            model_name: "tickets".into(),
            bundle_sha256: Some("ab".repeat(32)),
            laya: Default::default(),
            model_version: "v3".into(),
        }
    }

    #[test]
    fn a_status_before_the_engine_has_a_state_says_starting_and_not_degraded() {
        let birth = Birth { started_at: 1_700_000_000, birth: 1_700_000_000_123, fleet: "line-3".into() };
        let id = identity();
        let served =
            Served { backend: "rknn", model: "/opt/laya/bundle".into(), identity: &id, since: 0, last_reload: None };
        let s = status(false, &served, &birth, None, 0);
        assert_eq!(s.backend_state, Some(wire::BackendState::Starting));
        assert!(!s.online && !s.degraded && s.runtime.is_empty());
        assert_eq!((s.started_at, s.birth, s.fleet.as_str()), (1_700_000_000, 1_700_000_000_123, "line-3"));
        assert_eq!((s.model_name.as_str(), s.backend.as_str()), ("tickets", "rknn"));
    }

    #[test]
    fn refusals_are_counted_by_code_and_takeovers_count_up_from_one() {
        let c = Counters::default();
        c.refused(ErrorCode::Overloaded);
        c.refused(ErrorCode::Overloaded);
        c.refused(ErrorCode::BadRequest);
        assert_eq!(c.refused_by_code(), [("bad_request".to_owned(), 1), ("overloaded".to_owned(), 2)]);
        assert_eq!((c.taken_over(), c.taken_over(), c.takeovers()), (1, 2, 2));
    }

    #[test]
    fn a_birth_is_in_milliseconds_of_the_same_second_as_the_start() {
        let b = Birth::now("");
        assert_eq!(b.birth / 1000, b.started_at);
    }
}
