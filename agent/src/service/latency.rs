//! Latency histograms for telemetry: per request stage, a fixed array of log-spaced buckets,
//! so recording an answer's timing costs a few array increments and never allocates, and the
//! percentiles of a telemetry interval are read off the counts.
//!
//! Buckets are a quarter-octave wide (each bound is 2^(1/4), about 19%, above the previous) from
//! 10 µs up, 104 of them (the last ends past 9 minutes); a value below the first bound counts in the
//! first bucket, one above the last in the last. A percentile is the upper bound of the bucket
//! holding that rank, lowered to the interval's largest value if that is smaller, so it is never
//! below the true percentile and at most one bucket above it.

use laya_topics::load::Percentiles;
use laya_topics::wire::Timing;

/// Buckets per histogram.
pub const BUCKETS: usize = 104;
/// The first bucket's upper bound, in milliseconds.
const FIRST_MS: f64 = 0.01;
/// Buckets per doubling.
const PER_OCTAVE: f64 = 4.0;

/// The upper bound of bucket `i`, in milliseconds.
pub fn upper_bound(i: usize) -> f64 {
    FIRST_MS * (i as f64 / PER_OCTAVE).exp2()
}

/// The bucket a value (milliseconds) counts in.
pub fn bucket(ms: f64) -> usize {
    if ms.is_nan() || ms <= FIRST_MS {
        return 0;
    }
    let i = ((ms / FIRST_MS).log2() * PER_OCTAVE).ceil();
    // A value exactly on a bound belongs to the bucket it bounds; float error must not push
    // it one further.
    let mut i = (i as usize).min(BUCKETS - 1);
    if i > 0 && ms <= upper_bound(i - 1) {
        i -= 1;
    }
    i
}

/// One stage's histogram.
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: [u32; BUCKETS],
    n: u64,
    max: f64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: [0; BUCKETS], n: 0, max: 0.0 }
    }
}

impl Histogram {
    pub fn record(&mut self, ms: f64) {
        let ms = if ms.is_finite() { ms.max(0.0) } else { 0.0 };
        let b = &mut self.counts[bucket(ms)];
        *b = b.saturating_add(1);
        self.n += 1;
        self.max = self.max.max(ms);
    }

    pub fn count(&self) -> u64 {
        self.n
    }

    /// The `q` quantile (0 < q <= 1): the upper bound of the bucket holding rank ⌈q·n⌉, at most
    /// the largest value recorded. None without values.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.n == 0 {
            return None;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            seen += u64::from(*c);
            if seen >= rank {
                return Some(upper_bound(i).min(self.max));
            }
        }
        Some(self.max)
    }

    pub fn percentiles(&self) -> Option<Percentiles> {
        Some(Percentiles { p50: self.quantile(0.50)?, p95: self.quantile(0.95)?, p99: self.quantile(0.99)? })
    }
}

/// The five stages of a reply's `timing_ms`, over one telemetry interval.
#[derive(Debug, Clone, Default)]
pub struct StageLatencies {
    stages: [Histogram; 5],
}

impl StageLatencies {
    /// Records one answer's timing (in [`laya_topics::load::STAGES`] order).
    pub fn record(&mut self, t: &Timing) {
        for (h, ms) in self.stages.iter_mut().zip([t.queue, t.tokenize, t.infer, t.decode, t.total]) {
            h.record(ms);
        }
    }

    /// Answers recorded.
    pub fn count(&self) -> u64 {
        self.stages[4].count()
    }

    /// Each stage's percentiles (none where nothing was recorded).
    pub fn percentiles(&self) -> [Option<Percentiles>; 5] {
        [0, 1, 2, 3, 4].map(|i| self.stages[i].percentiles())
    }

    /// The interval's figures, and a fresh start for the next interval.
    pub fn take(&mut self) -> (u64, [Option<Percentiles>; 5]) {
        let out = (self.count(), self.percentiles());
        *self = StageLatencies::default();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_grow_by_a_quarter_octave_and_cover_nine_minutes() {
        assert!((upper_bound(4) / upper_bound(0) - 2.0).abs() < 1e-12);
        assert!(upper_bound(BUCKETS - 1) > 540_000.0, "{}", upper_bound(BUCKETS - 1));
        for i in 0..BUCKETS {
            assert_eq!(bucket(upper_bound(i)), i, "a bound belongs to the bucket it closes");
            if i > 0 {
                assert_eq!(bucket(upper_bound(i - 1) * 1.0001), i);
            }
        }
        assert_eq!(bucket(0.0), 0);
        assert_eq!(bucket(f64::NAN), 0);
        assert_eq!(bucket(1e12), BUCKETS - 1);
    }

    #[test]
    fn a_percentile_is_never_below_the_truth_and_at_most_one_bucket_above() {
        let mut h = Histogram::default();
        // 1..=1000 ms: the true p50 is 500, p95 950, p99 990.
        for ms in 1..=1000 {
            h.record(f64::from(ms));
        }
        let p = h.percentiles().unwrap();
        for (got, truth) in [(p.p50, 500.0), (p.p95, 950.0), (p.p99, 990.0)] {
            assert!(got >= truth && got <= truth * 2f64.powf(0.25), "{got} for {truth}");
        }
    }

    #[test]
    fn a_percentile_never_exceeds_the_largest_value_and_none_without_values() {
        let mut h = Histogram::default();
        assert_eq!(h.percentiles(), None);
        for _ in 0..10 {
            h.record(200.3);
        }
        assert_eq!(h.quantile(0.5), Some(200.3));
        assert_eq!(h.quantile(0.99), Some(200.3));
    }

    #[test]
    fn hostile_timings_count_without_panicking() {
        let mut h = Histogram::default();
        for ms in [f64::NAN, f64::INFINITY, -5.0, 0.0, 1e300] {
            h.record(ms);
        }
        assert_eq!(h.count(), 5);
        assert!(h.quantile(1.0).unwrap().is_finite());
    }

    #[test]
    fn taking_the_interval_reports_each_stage_and_starts_afresh() {
        let mut s = StageLatencies::default();
        s.record(&Timing { queue: 1.0, tokenize: 2.0, infer: 100.0, decode: 0.5, total: 103.5 });
        let (n, p) = s.take();
        assert_eq!(n, 1);
        assert_eq!(p[2].map(|p| p.p50), Some(100.0));
        assert_eq!(p[4].map(|p| p.p99), Some(103.5));
        assert_eq!(s.take(), (0, [None; 5]));
    }
}
