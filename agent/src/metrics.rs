//! The agent's counters, and their text for `GET /metrics` (Prometheus' text exposition format).
//!
//! Why its own module, always compiled: the HTTP door (feature `http`) serves these, but the
//! service and the engine update most of them (queue depth, inference time, backend state,
//! worker restarts, probe runs) whichever door a question came through. So this is pure data
//! and rendering, with no I/O and no dependency on the door: one [`Metrics`] shared by
//! `Arc`, updated with atomics (and a short lock for the few counters with open label sets), and
//! [`Metrics::render`] writing the format to its specification
//! (<https://prometheus.io/docs/instrumenting/exposition_formats/>): `# HELP` and `# TYPE` once
//! per family, label values escaped (`\\`, `\"`, `\n`), a histogram as cumulative
//! `_bucket{le=..}` lines ending with `le="+Inf"`, then `_sum` and `_count`. `promtool check
//! metrics` holds the result (agent/tests/it/http_door.rs).
//!
//! Names: `laya_*` where the Laya family has one (`laya_requests_total{model,status}`,
//! `laya_rejections_total{reason}`, `laya_queue_depth`, `laya_inference_seconds`),
//! `laya_edge_*` for the rest.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use laya_topics::wire::BackendState;

/// The upper bounds of `laya_inference_seconds`' buckets (`+Inf` is implied): from a 5 ms NPU
/// call to a 30 s CPU batch.
pub const INFERENCE_BUCKETS_S: [f64; 12] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// The most distinct label sets one labelled family keeps: a label value that comes from
/// outside (a model name, a status) cannot grow the map without bound. Past it, new sets are
/// counted under `other`.
const MAX_LABEL_SETS: usize = 256;

/// A counter family with labels: label values -> count.
#[derive(Debug, Default)]
struct Labelled(Mutex<BTreeMap<Vec<String>, u64>>);

impl Labelled {
    fn add(&self, labels: &[&str]) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let key: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
        let key = if map.contains_key(&key) || map.len() < MAX_LABEL_SETS {
            key
        } else {
            labels.iter().map(|_| "other".to_string()).collect()
        };
        *map.entry(key).or_default() += 1;
    }

    fn snapshot(&self) -> Vec<(Vec<String>, u64)> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    fn get(&self, labels: &[&str]) -> u64 {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let key: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
        map.get(&key).copied().unwrap_or(0)
    }
}

/// A histogram: one counter per bucket (not cumulative; summed when rendered), the count, and
/// the sum as `f64` bits.
#[derive(Debug)]
struct Histogram {
    buckets: [AtomicU64; INFERENCE_BUCKETS_S.len()],
    count: AtomicU64,
    sum_bits: AtomicU64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_bits: AtomicU64::new(0f64.to_bits()),
        }
    }

    fn observe(&self, v: f64) {
        // A negative, NaN or infinite duration is a caller's bug; it must not poison the sum.
        let v = if v.is_finite() && v > 0.0 { v } else { 0.0 };
        if let Some(i) = INFERENCE_BUCKETS_S.iter().position(|b| v <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| Some((f64::from_bits(bits) + v).to_bits()));
    }
}

/// Every counter `/metrics` reports. Shared by `Arc` between the door and the service.
#[derive(Debug)]
pub struct Metrics {
    /// `laya_edge_http_requests_total{route,status}`: every HTTP response.
    http: Labelled,
    /// `laya_requests_total{model,status}`: decision requests by outcome.
    requests: Labelled,
    /// `laya_rejections_total{reason}`.
    rejections: Labelled,
    queue_depth: AtomicU64,
    inference: Histogram,
    /// The [`BackendState`] as its index in [`BackendState::ALL`].
    backend_state: AtomicU64,
    worker_restarts: AtomicU64,
    cpu_fallbacks: AtomicU64,
    /// `laya_edge_probe_runs_total{result}`.
    probes: Labelled,
    connections_open: AtomicU64,
    connections_refused: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

/// What a decision request came to, for `laya_requests_total`'s `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered.
    Ok,
    /// Refused for what it asked (laya's rules, the caps): the client's to fix.
    Invalid,
    /// Refused for its size (the agent's own limits).
    TooLarge,
    /// Refused because the agent was busy (retryable).
    Busy,
    /// Its deadline passed before the engine answered.
    Deadline,
    /// The engine failed.
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Invalid => "invalid",
            Outcome::TooLarge => "too_large",
            Outcome::Busy => "busy",
            Outcome::Deadline => "deadline",
            Outcome::Failed => "failed",
        }
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {
            http: Labelled::default(),
            requests: Labelled::default(),
            rejections: Labelled::default(),
            queue_depth: AtomicU64::new(0),
            inference: Histogram::new(),
            backend_state: AtomicU64::new(0),
            worker_restarts: AtomicU64::new(0),
            cpu_fallbacks: AtomicU64::new(0),
            probes: Labelled::default(),
            connections_open: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
        }
    }

    /// An HTTP response was sent on `route` (`/v1/systemone`, ..., `other` for a path the door
    /// does not serve) with `status`.
    pub fn http_response(&self, route: &str, status: u16) {
        self.http.add(&[route, &status.to_string()]);
    }

    /// A decision request (either door) came to `outcome` on `model`.
    pub fn request(&self, model: &str, outcome: Outcome) {
        self.requests.add(&[model, outcome.as_str()]);
    }

    /// A question was refused before the engine (`overloaded`, `too_large`, `busy`, ...).
    pub fn rejected(&self, reason: &str) {
        self.rejections.add(&[reason]);
    }

    /// Questions admitted and not yet answered.
    pub fn set_queue_depth(&self, n: usize) {
        self.queue_depth.store(n as u64, Ordering::Relaxed);
    }

    /// One engine call took `secs` seconds.
    pub fn observe_inference(&self, secs: f64) {
        self.inference.observe(secs);
    }

    pub fn set_backend_state(&self, state: BackendState) {
        let i = BackendState::ALL.iter().position(|s| *s == state).unwrap_or(0);
        self.backend_state.store(i as u64, Ordering::Relaxed);
    }

    pub fn worker_restarted(&self) {
        self.worker_restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// The engine fell back to the CPU.
    pub fn cpu_fallback(&self) {
        self.cpu_fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    /// Times the engine fell back to the CPU.
    pub fn cpu_fallbacks(&self) -> u64 {
        self.cpu_fallbacks.load(Ordering::Relaxed)
    }

    /// A probe run ended, passed or not.
    pub fn probe(&self, passed: bool) {
        self.probes.add(&[if passed { "passed" } else { "failed" }]);
    }

    /// An HTTP connection was accepted (`true`) or closed (`false`).
    pub fn connection(&self, opened: bool) {
        if opened {
            self.connections_open.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = self.connections_open.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// An HTTP connection was refused: `[http] max_connections` were open.
    pub fn connection_refused(&self) {
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// `laya_edge_http_requests_total{route,status}` now (for tests and the demo).
    pub fn http_responses(&self, route: &str, status: u16) -> u64 {
        self.http.get(&[route, &status.to_string()])
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut w = Writer::default();
        w.family(
            "laya_requests_total",
            "counter",
            "Decision requests by model and outcome (ok, invalid, too_large, busy, deadline, failed).",
        );
        w.labelled("laya_requests_total", &["model", "status"], &self.requests.snapshot());
        w.family("laya_rejections_total", "counter", "Questions refused before the engine, by reason.");
        w.labelled("laya_rejections_total", &["reason"], &self.rejections.snapshot());
        w.family("laya_queue_depth", "gauge", "Questions admitted and not yet answered.");
        w.sample("laya_queue_depth", &[], self.queue_depth.load(Ordering::Relaxed) as f64);
        w.family("laya_inference_seconds", "histogram", "Time of one engine call, in seconds.");
        w.histogram("laya_inference_seconds", &self.inference);
        w.family("laya_edge_http_requests_total", "counter", "HTTP responses by route and status.");
        w.labelled("laya_edge_http_requests_total", &["route", "status"], &self.http.snapshot());
        w.family("laya_edge_http_connections", "gauge", "HTTP connections open now.");
        w.sample("laya_edge_http_connections", &[], self.connections_open.load(Ordering::Relaxed) as f64);
        w.family(
            "laya_edge_http_connections_refused_total",
            "counter",
            "HTTP connections closed at once because http.max_connections were open.",
        );
        w.sample(
            "laya_edge_http_connections_refused_total",
            &[],
            self.connections_refused.load(Ordering::Relaxed) as f64,
        );
        w.family("laya_edge_backend_state", "gauge", "1 for the engine's backend state now, 0 for the others.");
        let now = self.backend_state.load(Ordering::Relaxed) as usize;
        for (i, state) in BackendState::ALL.iter().enumerate() {
            w.sample("laya_edge_backend_state", &[("state", state.as_str())], if i == now { 1.0 } else { 0.0 });
        }
        w.family("laya_edge_worker_restarts_total", "counter", "Worker processes restarted.");
        w.sample("laya_edge_worker_restarts_total", &[], self.worker_restarts.load(Ordering::Relaxed) as f64);
        w.family("laya_edge_cpu_fallbacks_total", "counter", "Times the engine fell back to the CPU.");
        w.sample("laya_edge_cpu_fallbacks_total", &[], self.cpu_fallbacks.load(Ordering::Relaxed) as f64);
        w.family("laya_edge_probe_runs_total", "counter", "Probe runs by result (passed, failed).");
        w.labelled("laya_edge_probe_runs_total", &["result"], &self.probes.snapshot());
        w.0
    }
}

/// The text being written.
#[derive(Default)]
struct Writer(String);

impl Writer {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape_label(v));
            }
            self.0.push('}');
        }
        self.0.push(' ');
        self.0.push_str(&number(value));
        self.0.push('\n');
    }

    fn labelled(&mut self, name: &str, keys: &[&str], rows: &[(Vec<String>, u64)]) {
        for (values, count) in rows {
            let labels: Vec<(&str, &str)> = keys.iter().copied().zip(values.iter().map(String::as_str)).collect();
            self.sample(name, &labels, *count as f64);
        }
    }

    fn histogram(&mut self, name: &str, h: &Histogram) {
        // Read the count first: buckets observed after it only make `+Inf` (the count) lag the
        // buckets by the requests in flight, never a bucket exceed a later one.
        let mut cumulative = 0u64;
        let bucket = format!("{name}_bucket");
        for (b, n) in INFERENCE_BUCKETS_S.iter().zip(&h.buckets) {
            cumulative += n.load(Ordering::Relaxed);
            self.sample(&bucket, &[("le", &number(*b))], cumulative as f64);
        }
        let count = h.count.load(Ordering::Relaxed).max(cumulative);
        self.sample(&bucket, &[("le", "+Inf")], count as f64);
        self.sample(&format!("{name}_sum"), &[], f64::from_bits(h.sum_bits.load(Ordering::Relaxed)));
        self.sample(&format!("{name}_count"), &[], count as f64);
    }
}

/// A sample value as the format writes it: Go's float syntax (`+Inf`, `-Inf`, `NaN`).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_string()
    } else if v == f64::INFINITY {
        "+Inf".to_string()
    } else if v == f64::NEG_INFINITY {
        "-Inf".to_string()
    } else {
        // Rust's shortest round-trip decimal, never an exponent: Go's ParseFloat reads it.
        format!("{v}")
    }
}

/// A label value: `\` as `\\`, `"` as `\"`, a line feed as `\n`.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A `# HELP` text: `\` as `\\`, a line feed as `\n`.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_is_cumulative_and_ends_with_inf_sum_and_count() {
        let m = Metrics::new();
        for s in [0.003, 0.2, 0.2, 100.0] {
            m.observe_inference(s);
        }
        let text = m.render();
        assert!(text.contains("laya_inference_seconds_bucket{le=\"0.005\"} 1\n"), "{text}");
        assert!(text.contains("laya_inference_seconds_bucket{le=\"0.25\"} 3\n"), "{text}");
        assert!(text.contains("laya_inference_seconds_bucket{le=\"30\"} 3\n"), "{text}");
        assert!(text.contains("laya_inference_seconds_bucket{le=\"+Inf\"} 4\n"), "{text}");
        assert!(text.contains("laya_inference_seconds_sum 100.403\n"), "{text}");
        assert!(text.contains("laya_inference_seconds_count 4\n"), "{text}");
    }

    #[test]
    fn label_values_from_outside_are_escaped_and_bounded() {
        let m = Metrics::new();
        m.request("a\"b\\c\nd", Outcome::Ok);
        let text = m.render();
        assert!(text.contains(r#"laya_requests_total{model="a\"b\\c\nd",status="ok"} 1"#), "{text}");
        for i in 0..(MAX_LABEL_SETS + 10) {
            m.rejected(&format!("r{i}"));
        }
        let text = m.render();
        assert!(text.contains("laya_rejections_total{reason=\"other\"} 10\n"), "{text}");
    }

    #[test]
    fn every_family_has_help_and_type_once_and_the_backend_state_is_one_hot() {
        let m = Metrics::new();
        m.set_backend_state(BackendState::Degraded);
        let text = m.render();
        assert!(text.contains("laya_edge_backend_state{state=\"degraded\"} 1\n"), "{text}");
        assert!(text.contains("laya_edge_backend_state{state=\"ready\"} 0\n"), "{text}");
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        let mut names: Vec<&str> = types.iter().map(|l| l.split(' ').nth(2).unwrap_or("")).collect();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "{text}");
        assert_eq!(text.lines().filter(|l| l.starts_with("# HELP ")).count(), n);
    }
}
