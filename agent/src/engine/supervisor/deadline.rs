//! How long a call may take: the per-row estimator and the deadlines derived from it.
//!
//! Deadlines are per row (one NPU job per question): `max(min_deadline, 4 x per-row estimate x
//! rows)`, the estimate being the p99 of recent per-row times, seeded by the health call's
//! measured time and `expected_ms` until enough samples exist, kept per role (the CPU fallback
//! is not timed by the NPU, nor the NPU by the CPU). A row is counted by what it costs
//! ([`Size::units`]): a row on a bundle's 256-token graph as two rows on its 128-token one, so
//! the health call's short rows (the seed) do not time a call of long rows at half their cost
//! (a probe of both graphs missed its deadline on the QNN simulator in CI). Apart from the
//! lifecycle so the arithmetic can be read (and changed) on its own.

use std::collections::VecDeque;
use std::time::Duration;

use super::events::Role;
use super::policy::Policy;

/// How many recent per-row times the deadline is derived from, and how many it needs.
const RECENT: usize = 128;
const MIN_SAMPLES: usize = 5;

/// What a call (or the health call) holds: its rows, and what they cost in units of a row on
/// the backend's shortest graph (a row on a graph twice as long: 2; every row 1 on a backend
/// without graphs, or with one). A fixed deadline (`deadline_ms`) is per row, as documented; a
/// derived one is per unit.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Size {
    pub rows: usize,
    pub units: f64,
}

impl Size {
    /// `rows` rows of one unit each.
    #[cfg(test)]
    pub fn rows(rows: usize) -> Size {
        Size { rows, units: rows as f64 }
    }

    /// Both together (a merged batch).
    pub(super) fn add(self, other: Size) -> Size {
        Size { rows: self.rows + other.rows, units: self.units + other.units }
    }

    /// What is left of it after `frac` of the work.
    pub(super) fn left(self, frac: f64) -> (f64, f64) {
        let left = (1.0 - frac).clamp(0.0, 1.0);
        (self.rows.max(1) as f64 * left, self.units() * left)
    }

    /// The units, at least one row's worth of the mean row (a frame from outside may say any
    /// count; units below the rows' are not a cost).
    fn units(self) -> f64 {
        if self.units.is_finite() && self.units >= self.rows as f64 { self.units } else { self.rows as f64 }.max(1.0)
    }
}

/// Recent per-row (per-round) times and the health call's measurement, by role.
#[derive(Debug, Default)]
pub(super) struct Estimator {
    /// Recent per-row (per-round) times, by role (`role_index`): the CPU fallback is not timed
    /// by the NPU's speed, nor the NPU by the CPU's.
    per_row: [VecDeque<Duration>; 2],
    /// The same samples in order, kept as they come and go: the estimate (their 99th
    /// percentile) is read for every call the engine sends, and sorting them each time cost
    /// more of the service thread than the rest of the engine's bookkeeping together (perf,
    /// beside a flood).
    sorted: [Vec<Duration>; 2],
    /// The health call's measured per-row time, by role.
    seed: [Option<Duration>; 2],
}

fn role_index(role: Role) -> usize {
    match role {
        Role::Primary => 0,
        Role::Fallback => 1,
    }
}

impl Estimator {
    /// Records the per-row (per-round) time of a call `role` answered.
    pub(super) fn record(&mut self, role: Role, sample: Duration) {
        let (samples, sorted) = (&mut self.per_row[role_index(role)], &mut self.sorted[role_index(role)]);
        samples.push_back(sample);
        let at = sorted.partition_point(|s| *s < sample);
        sorted.insert(at, sample);
        if samples.len() > RECENT
            && let Some(old) = samples.pop_front()
            && let Ok(at) = sorted.binary_search(&old)
        {
            sorted.remove(at);
        }
    }

    /// Sets the per-row time `role`'s health call measured.
    pub(super) fn seed(&mut self, role: Role, per_row: Duration) {
        self.seed[role_index(role)] = Some(per_row);
    }

    /// The per-row estimate the deadline of `role`'s calls is derived from, if anything is known.
    pub(super) fn estimate(&self, policy: &Policy, role: Role) -> Option<Duration> {
        let sorted = &self.sorted[role_index(role)];
        if sorted.len() >= MIN_SAMPLES {
            let i = ((sorted.len() as f64 * 0.99).ceil() as usize).clamp(1, sorted.len()) - 1;
            return Some(sorted[i]);
        }
        match (self.seed[role_index(role)], policy.expected_per_row) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether anything bounds `role`'s rows: a fixed deadline or an estimate.
    pub(super) fn known(&self, policy: &Policy, role: Role) -> bool {
        policy.fixed_deadline.is_some() || self.estimate(policy, role).is_some()
    }

    /// The time `rows` rows costing `units` (a fraction of a row counts as such) of `role`'s
    /// work may take: the fixed deadline per row, else `max(min_deadline, 4 x per-unit time x
    /// units)`, the per-unit time being the larger of the estimate and `rate` (what the running
    /// call itself has shown); with neither, `max_deadline` a unit.
    pub(super) fn bound(&self, policy: &Policy, role: Role, rows: f64, units: f64, rate: Option<Duration>) -> Duration {
        let whole = u32::try_from(rows.max(1.0).ceil() as u64).unwrap_or(u32::MAX);
        if let Some(fixed) = policy.fixed_deadline {
            return fixed.saturating_mul(whole);
        }
        let units = units.max(rows).max(1.0);
        let est = match (self.estimate(policy, role), rate) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        match est {
            Some(est) => {
                let per_row = est.min(policy.max_deadline).saturating_mul(4);
                Duration::try_from_secs_f64(per_row.as_secs_f64() * units)
                    .unwrap_or(Duration::MAX)
                    .max(policy.min_deadline)
            }
            None => policy.max_deadline.saturating_mul(u32::try_from(units.ceil() as u64).unwrap_or(u32::MAX)),
        }
    }

    /// A new worker's health call's deadline: its first row is the first inference of a fresh
    /// runtime and gets the load allowance (at least a row's deadline); the other rows get
    /// what is known of `role`'s rows. With nothing known the allowance is the whole call's
    /// until the worker's progress frames measure its rows (`Event::Progress`).
    pub(super) fn health_deadline(&self, policy: &Policy, role: Role) -> Duration {
        let health = policy.health_size();
        let allowance = policy.load_allowance.max(policy.min_deadline);
        if !self.known(policy, role) {
            return allowance;
        }
        let first = allowance.max(self.bound(policy, role, 1.0, 1.0, None));
        if health.rows > 1 {
            let rest = self.bound(policy, role, (health.rows - 1) as f64, health.units() - 1.0, None);
            first.saturating_add(rest)
        } else {
            first
        }
    }
}

/// How many rounds a call of `rows` rows takes on a worker of `role`: the rows one after
/// another, or side by side `primary_parallel` at a time on the primary.
pub(super) fn rounds(policy: &Policy, rows: usize, role: Role) -> u32 {
    let parallel = if role == Role::Primary { policy.primary_parallel.max(1) } else { 1 };
    u32::try_from(rows.max(1).div_ceil(parallel)).unwrap_or(u32::MAX)
}

/// What a call of `size` costs on a worker of `role`, in rounds of one-unit rows: its
/// [`rounds`], each weighted by the mean cost of its rows. What one sample of the estimate is
/// measured against.
pub(super) fn cost(policy: &Policy, size: Size, role: Role) -> f64 {
    f64::from(rounds(policy, size.rows, role)) * size.units() / size.rows.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_is_the_99th_percentile_of_the_recent_samples_as_they_come_and_go() {
        let policy = Policy::default();
        let mut e = Estimator::default();
        let mut recent: [VecDeque<Duration>; 2] = Default::default();
        // A repeatable sequence with repeats (equal samples) and both roles, well past the window.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for n in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let role = if x.is_multiple_of(5) { Role::Fallback } else { Role::Primary };
            let sample = Duration::from_micros(x % 97 + if n > 1000 { 500 } else { 0 });
            e.record(role, sample);
            let window = &mut recent[role_index(role)];
            window.push_back(sample);
            if window.len() > RECENT {
                window.pop_front();
            }
            for role in [Role::Primary, Role::Fallback] {
                let window = &recent[role_index(role)];
                let want = (window.len() >= MIN_SAMPLES).then(|| {
                    let mut sorted: Vec<Duration> = window.iter().copied().collect();
                    sorted.sort();
                    sorted[((sorted.len() as f64 * 0.99).ceil() as usize).clamp(1, sorted.len()) - 1]
                });
                if want.is_some() {
                    assert_eq!(e.estimate(&policy, role), want, "after {n} samples, {role:?}");
                }
            }
        }
    }
}
