//! The supervision policy: deadlines, restarts, degradation, queueing and merging, as numbers.
//!
//! Pure data with one constructor from the configuration ([`Policy::from_config`]), so every
//! engine the agent starts (serve, reload, predict) is supervised by the same rules.

use std::time::Duration;

use crate::config::{BackendKind, Config};

/// The supervision policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// A fixed deadline per row (`engine.deadline_ms`); `None` derives it from recent calls.
    pub fixed_deadline: Option<Duration>,
    /// The shortest deadline of any call.
    pub min_deadline: Duration,
    /// The longest per-row estimate the derived deadline uses.
    pub max_deadline: Duration,
    /// The expected time of one row (`engine.expected_ms`), seeding the deadline before samples.
    pub expected_per_row: Option<Duration>,
    /// The health call's deadline while nothing is known about the backend's speed (the first
    /// inference of a fresh runtime: lazy graph finalization, first DSP session).
    pub load_allowance: Duration,
    /// How long a worker may take to load its backend.
    pub startup_timeout: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// More restarts than this within `restart_window` degrade the engine.
    pub max_restarts: usize,
    pub restart_window: Duration,
    /// This many failed health calls of the primary in a row degrade it at once, whatever the
    /// window (0: only `max_restarts` does). A primary that hangs in every health call is slow
    /// to fail each time (its first row has the load allowance), so the window alone would
    /// never see enough of them.
    pub max_failed_health: usize,
    /// How long the oldest question may wait for a worker that is not serving (loading, in its
    /// health call, restarting): then the fallback is started to answer it (the primary goes on
    /// beside it as a candidate), or, without one, the questions that waited this long are
    /// refused with the cause. `None`: they wait.
    pub ready_wait: Option<Duration>,
    /// Whether a CPU fallback worker can serve while the primary is degraded.
    pub fallback: bool,
    /// How often a degraded primary is tried again (for ever).
    pub primary_retry: Duration,
    /// Calls queued or running beyond this are refused (`limits.queue`).
    pub queue_limit: usize,
    /// Rows in the health call (0: no health call).
    pub health_rows: usize,
    /// What the health call's rows cost (`deadline::Size::units`); at most `health_rows`
    /// (the default 0 included): one unit a row.
    pub health_units: f64,
    /// How many rows the primary backend runs side by side (`rknn.contexts`; 1: one after
    /// another). Its calls are timed per round of that many rows, so the per-row estimate stays
    /// the time of one NPU job and a one-row call's deadline is not cut by the parallelism.
    pub primary_parallel: usize,
    /// The most rows one batch of merged calls may hold on the primary (`limits.questions_per_request`,
    /// what one call may hold anyway); 1: calls run one at a time. The fallback (the CPU, which
    /// pads a batch to its longest row) always runs one call at a time.
    pub merge_rows: usize,
    /// How long an idle primary that runs rows side by side (`primary_parallel` > 1) may wait
    /// for more calls to fill a round of its contexts, while calls have been queueing (at most a
    /// tenth of the per-row estimate; zero: never waits). Without it, concurrent clients whose
    /// answers come back together send their next questions into an idle worker one by one: the
    /// first runs alone on one context and the others queue behind it.
    pub gather: Duration,
    /// How often the serving worker runs the bundle's probe again, as a call of its own (none:
    /// only in every health call). Not while it is starting (its health call probes it), and
    /// never two at once.
    pub probe_every: Option<Duration>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            fixed_deadline: None,
            min_deadline: Duration::from_secs(1),
            max_deadline: Duration::from_secs(30),
            expected_per_row: None,
            load_allowance: Duration::from_secs(60),
            startup_timeout: Duration::from_secs(120),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(30),
            max_restarts: 5,
            restart_window: Duration::from_secs(300),
            max_failed_health: 3,
            ready_wait: Some(Duration::from_secs(20)),
            fallback: false,
            primary_retry: Duration::from_secs(300),
            // `limits.queue`'s one default.
            queue_limit: crate::config::Limits::default().queue,
            health_rows: 0,
            health_units: 0.0,
            primary_parallel: 1,
            merge_rows: 1,
            gather: Duration::ZERO,
            probe_every: None,
        }
    }
}

impl Policy {
    /// The health call's size: its rows and what they cost.
    pub(super) fn health_size(&self) -> super::deadline::Size {
        // `Size` counts units below the rows (the default 0 included) as one a row.
        super::deadline::Size { rows: self.health_rows, units: self.health_units }
    }

    /// The policy `config` asks for, the only place it is assembled: the `[engine]` section, and
    /// what the backend it names runs side by side and together. `fallback` says whether a CPU
    /// fallback worker exists. The health call's rows and the probe's cadence come with the engine's
    /// configuration (`EngineConfig`), which sets them when it starts.
    pub fn from_config(config: &Config, fallback: bool) -> Policy {
        let e = &config.engine;
        let mut policy = Policy {
            fixed_deadline: (e.deadline_ms > 0).then(|| Duration::from_millis(e.deadline_ms)),
            expected_per_row: (e.expected_ms > 0).then(|| Duration::from_millis(e.expected_ms)),
            load_allowance: Duration::from_millis(e.load_allowance_ms),
            startup_timeout: Duration::from_secs(e.startup_timeout_s.max(1)),
            max_restarts: e.max_restarts,
            restart_window: Duration::from_secs(e.restart_window_s),
            max_failed_health: e.max_failed_health,
            ready_wait: (e.ready_wait_s > 0).then(|| Duration::from_secs(e.ready_wait_s)),
            fallback,
            primary_retry: Duration::from_secs(e.retry_primary_s.max(1)),
            queue_limit: config.limits.queue.max(1),
            ..Policy::default()
        };
        if e.backend == BackendKind::Rknn {
            // Its contexts run a call's rows side by side: time it per round.
            policy.primary_parallel = config.rknn.contexts.max(1);
            // Concurrent callers' next questions fill a round of the contexts.
            policy.gather = Duration::from_millis(50);
        }
        if e.backend != BackendKind::Cpu {
            // Calls queued together run as one batch of at most what one request may hold. Not on
            // the CPU: it pads a batch to its longest row, and one-question rows of mixed lengths
            // merged four at a time ran at 0.48x the rows/s of one per call (1.55x only when all
            // four had the same length; BENCHMARKS.md, "Concurrent requests").
            policy.merge_rows = config.limits.questions_per_request.max(1);
        }
        policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_npu_backend_merges_calls_and_rknn_times_its_contexts_per_round_but_the_cpu_does_neither() {
        let mut config = Config::default();
        config.engine.backend = BackendKind::Cpu;
        let cpu = Policy::from_config(&config, false);
        assert_eq!((cpu.merge_rows, cpu.primary_parallel, cpu.gather), (1, 1, Duration::ZERO));
        config.engine.backend = BackendKind::Qnn;
        config.limits.questions_per_request = 8;
        let qnn = Policy::from_config(&config, true);
        assert_eq!((qnn.merge_rows, qnn.primary_parallel, qnn.fallback), (8, 1, true));
        config.engine.backend = BackendKind::Rknn;
        config.rknn.contexts = 3;
        let rknn = Policy::from_config(&config, false);
        assert_eq!((rknn.merge_rows, rknn.primary_parallel, rknn.gather), (8, 3, Duration::from_millis(50)));
    }
}
