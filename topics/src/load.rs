//! The load part of the telemetry document: how fast and how busy a device was over the last
//! telemetry interval, and what the host says about its memory and temperature.
//!
//! Kept apart from the counters in `wire::Telemetry` because it is a different kind of figure:
//! counters grow for ever, these describe one interval (percentiles, rates, a busy fraction) or
//! the moment of publishing (RSS, temperature, queue depth).

use crate::value::{Map, Value};

/// The request stages timed in every reply's `timing_ms`, in that order.
pub const STAGES: [&str; 5] = ["queue", "tokenize", "infer", "decode", "total"];

/// Latency percentiles of one stage over an interval, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

impl Percentiles {
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("p50".into(), ms(self.p50));
        m.insert("p95".into(), ms(self.p95));
        m.insert("p99".into(), ms(self.p99));
        Value::Object(m)
    }

    /// Reads `{"p50", "p95", "p99"}` back (a consumer's side).
    pub fn from_value(v: &Value) -> Option<Percentiles> {
        Some(Percentiles { p50: v.get("p50")?.as_f64()?, p95: v.get("p95")?.as_f64()?, p99: v.get("p99")?.as_f64()? })
    }
}

fn ms(x: f64) -> Value {
    Value::Float((x * 1000.0).round() / 1000.0)
}

/// How the device fared over one telemetry interval.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Load {
    /// The interval these figures cover, in seconds.
    pub interval_s: f64,
    /// Questions answered in the interval (error replies not included).
    pub questions: u64,
    /// `questions / interval_s`.
    pub questions_per_s: f64,
    /// Per stage of [`STAGES`], the percentiles over the interval's answers (none: no answer).
    pub latency_ms: [Option<Percentiles>; 5],
    /// The fraction of the interval the backend had a call running, 0 to 1.
    pub busy: f64,
    /// Questions waiting: calls queued for the backend plus questions waiting for a place.
    pub queue_depth: u64,
    /// Resident memory of the agent, in KiB (none: not readable).
    pub rss_kb_agent: Option<u64>,
    /// Resident memory of the serving worker, in KiB (none: no worker, or not readable).
    pub rss_kb_worker: Option<u64>,
    /// The highest temperature among `/sys/class/thermal/*/temp` in °C (none: none readable).
    pub temperature_c: Option<f64>,
}

impl Load {
    /// Adds the load's keys to a telemetry document's map.
    pub fn extend(&self, m: &mut Map) {
        let opt_int = |v: Option<u64>| v.map_or(Value::Null, |x| Value::Int(x.into()));
        m.insert("interval_s".into(), Value::Float((self.interval_s * 1000.0).round() / 1000.0));
        m.insert("questions".into(), Value::Int(self.questions.into()));
        m.insert("questions_per_s".into(), Value::Float((self.questions_per_s * 1000.0).round() / 1000.0));
        let mut lat = Map::new();
        for (stage, p) in STAGES.iter().zip(&self.latency_ms) {
            lat.insert((*stage).into(), p.as_ref().map_or(Value::Null, Percentiles::to_value));
        }
        m.insert("latency_ms".into(), Value::Object(lat));
        m.insert("busy".into(), Value::Float((self.busy * 1000.0).round() / 1000.0));
        m.insert("queue_depth".into(), Value::Int(self.queue_depth.into()));
        let mut rss = Map::new();
        rss.insert("agent".into(), opt_int(self.rss_kb_agent));
        rss.insert("worker".into(), opt_int(self.rss_kb_worker));
        m.insert("rss_kb".into(), Value::Object(rss));
        m.insert(
            "temperature_c".into(),
            self.temperature_c.map_or(Value::Null, |t| Value::Float((t * 10.0).round() / 10.0)),
        );
    }

    /// Reads the load's keys back from a telemetry document (a consumer's side); missing or
    /// mistyped keys read as none or zero, so an older agent's telemetry still reads.
    pub fn from_value(v: &Value) -> Load {
        let f = |k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        let u = |v: Option<&Value>| v.and_then(Value::as_i64).and_then(|x| u64::try_from(x).ok());
        let lat = v.get("latency_ms");
        let mut latency_ms = [None; 5];
        for (slot, stage) in latency_ms.iter_mut().zip(STAGES) {
            *slot = lat.and_then(|l| l.get(stage)).and_then(Percentiles::from_value);
        }
        Load {
            interval_s: f("interval_s"),
            questions: u(v.get("questions")).unwrap_or(0),
            questions_per_s: f("questions_per_s"),
            latency_ms,
            busy: f("busy"),
            queue_depth: u(v.get("queue_depth")).unwrap_or(0),
            rss_kb_agent: u(v.get("rss_kb").and_then(|r| r.get("agent"))),
            rss_kb_worker: u(v.get("rss_kb").and_then(|r| r.get("worker"))),
            temperature_c: v.get("temperature_c").and_then(Value::as_f64),
        }
    }

    /// The percentiles of a stage by name.
    pub fn stage(&self, stage: &str) -> Option<Percentiles> {
        STAGES.iter().position(|s| *s == stage).and_then(|i| self.latency_ms[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json;

    #[test]
    fn the_load_reads_back_what_it_wrote() {
        let p = Percentiles { p50: 1.5, p95: 20.25, p99: 31.0 };
        let load = Load {
            interval_s: 5.0,
            questions: 10,
            questions_per_s: 2.0,
            latency_ms: [None, Some(p), Some(p), None, Some(p)],
            busy: 0.5,
            queue_depth: 3,
            rss_kb_agent: Some(1024),
            rss_kb_worker: None,
            temperature_c: Some(48.5),
        };
        let mut m = Map::new();
        load.extend(&mut m);
        let v = Value::Object(m);
        let text = json::to_string(&v, json::Style::COMPACT);
        assert!(text.contains(r#""latency_ms":{"queue":null,"tokenize":{"p50":1.5,"p95":20.25,"p99":31.0}"#), "{text}");
        assert!(text.contains(r#""rss_kb":{"agent":1024,"worker":null},"temperature_c":48.5"#), "{text}");
        assert_eq!(Load::from_value(&v), load);
        assert_eq!(load.stage("total"), Some(p));
        assert_eq!(load.stage("queue"), None);
    }

    #[test]
    fn telemetry_without_load_keys_reads_as_an_empty_load() {
        assert_eq!(Load::from_value(&Value::Object(Map::new())), Load::default());
    }
}
