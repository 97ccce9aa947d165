//! Supervision of the worker processes, as a state machine without I/O.
//!
//! NPU runtimes hang and crash, and a thread stuck in a vendor call cannot be cancelled, so the
//! backend lives in a worker process the agent can kill. This module decides *what* to do; the
//! driver (`engine::process`) does it. Every input is an [`Event`] with the current time, every
//! output an [`Action`], so the policy is tested without processes or clocks.
//!
//! ```text
//!             spawn            ready            health ok
//!   (start) --------> Starting -----> Health ------------> Serving (idle <-> busy)
//!                        |               |                     |
//!                        +---------------+---------------------+  crash / deadline / fatal / load failure
//!                                        |
//!                       restarts in window <= max_restarts?
//!                         yes: backoff, spawn again (the call in flight is re-run once;
//!                              a call that fails twice is quarantined: answered with an error)
//!                         no:  Degraded
//!   Degraded: questions go to the CPU fallback if configured, else are refused at once with the
//!   root cause and the time of the next try. Every `primary_retry` a *candidate* primary starts
//!   beside the fallback and gets the health call; success promotes it (Recovered), failure
//!   schedules the next try. Degraded is never forever.
//! ```
//!
//! Calls queued together run together: when the serving primary is idle and several calls wait,
//! they go to the worker as one batch (their rows concatenated in queue order, at most
//! `merge_rows` rows, the most one request may hold), so concurrent one-question requests fill
//! the NPU's contexts or pipeline as a multi-question request does. A failure of a merged batch
//! (crash, deadline, fatal, transient or input error) is nobody's in particular: its calls run
//! again *alone*, their attempts unchanged, so only a failure of a call alone counts against it
//! (a poison call is isolated and quarantined, its neighbours answered), and a row the model
//! refuses fails only its own call. Health and probe calls are never merged with questions.
//!
//! Deadlines are per row (one NPU job per question): `max(min_deadline, 4 x per-row estimate x
//! rows)`, the estimate being the p99 of recent per-row times, seeded by the health call's
//! measured time and `expected_ms` until enough samples exist, kept per role (the CPU fallback
//! is not timed by the NPU). The health call (two different rows, after "loaded" and before
//! any question) gets the load allowance for its first row (every worker's first inference)
//! and a row's deadline for each other row (with nothing known, the allowance is the whole
//! call's). Progress frames from the worker restart the running call's deadline for the work
//! left, at the larger of the estimate and the call's own rate: a slow worker that is getting on
//! is not killed, a hung one sends nothing and is caught as before.
//!
//! Nothing waits unbounded: `max_failed_health` failed health calls in a row degrade the primary
//! whatever the window, and a question that waited `ready_wait` for a worker that is not
//! serving gets the fallback (the primary going on beside it as the candidate) or, without
//! one, a refusal with the cause.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::backend::BackendError;

/// Identifies one call (a batch of rows) for the life of the engine.
pub type CallId = u64;

/// Identifies one worker process for the life of the engine.
pub type WorkerId = u64;

/// The call id of a worker's health call (real calls start at 1).
pub const HEALTH_CALL: CallId = 0;

/// Which backend a worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The configured backend (an NPU on a board).
    Primary,
    /// The CPU reference, while the primary is degraded.
    Fallback,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Fallback => "fallback",
        }
    }
}

/// Why a worker was restarted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestartReason {
    /// A call missed its deadline (the deadline it had).
    Deadline(Duration),
    /// The process exited or crashed (how).
    Crash(String),
    /// The backend reported a fatal error: its code, if any, and its message.
    Fatal { code: Option<i64>, message: String },
    /// The backend could not be loaded, did not become ready in time, or failed its health call.
    LoadFailed(String),
}

impl RestartReason {
    /// A short label for counters.
    pub fn label(&self) -> &'static str {
        match self {
            RestartReason::Deadline(_) => "deadline",
            RestartReason::Crash(_) => "crash",
            RestartReason::Fatal { .. } => "fatal",
            RestartReason::LoadFailed(_) => "load_failed",
        }
    }

    /// The error code, for a fatal error that has one.
    pub fn code(&self) -> Option<i64> {
        match self {
            RestartReason::Fatal { code, .. } => *code,
            _ => None,
        }
    }

    /// The runtime's name for the error (`RKNN_ERR_TIMEOUT`, `QNN_...`), when the message has
    /// the `NAME (code)` form the runtimes' status types print.
    pub fn name(&self) -> Option<String> {
        let RestartReason::Fatal { code: Some(code), message } = self else { return None };
        let at = message.find(&format!(" ({code})"))?;
        let name = message[..at].rsplit([' ', ':']).next()?;
        (!name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .then(|| name.to_owned())
    }

    /// One sentence for logs, events and refusals.
    pub fn describe(&self) -> String {
        match self {
            RestartReason::Deadline(d) => format!("the backend missed its deadline ({} ms)", d.as_millis()),
            RestartReason::Crash(how) => format!("the backend worker died ({how})"),
            RestartReason::Fatal { code: Some(code), message } => {
                format!("the backend failed fatally (code {code}): {message}")
            }
            RestartReason::Fatal { code: None, message } => format!("the backend failed fatally: {message}"),
            RestartReason::LoadFailed(why) => format!("the backend could not be loaded: {why}"),
        }
    }
}

/// Which timer fired; `generation` tells a live timer from a stale one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Timer {
    pub kind: TimerKind,
    pub generation: u64,
}

/// The supervisor's timers. The driver keeps one per kind (arming one replaces the previous).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimerKind {
    /// The serving worker's call (or health call) must be answered by now.
    Deadline,
    /// The serving worker must announce itself by now.
    Startup,
    /// Time to start the serving worker again.
    Backoff,
    /// The candidate primary's startup or health call must be done by now.
    Candidate,
    /// Time to try a degraded primary again.
    Retry,
    /// Time to send what the idle primary gathered, a round of its contexts full or not.
    Gather,
    /// The oldest queued question has waited `ready_wait` for a worker that is not serving.
    Wait,
}

/// What happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Start the first worker.
    Start,
    /// A call was queued: its rows, the caller's deadline, and whether it must run alone (the
    /// periodic probe: never merged with questions).
    Submit { call: CallId, rows: usize, deadline: Option<Instant>, alone: bool },
    /// The caller of a call went away (or the driver found it gone before sending it).
    Cancelled(CallId),
    /// A worker loaded its backend.
    Ready(WorkerId),
    /// A worker could not load its backend.
    LoadFailed(WorkerId, String),
    /// A worker answered a call (or its health call, [`HEALTH_CALL`]).
    Done(WorkerId, CallId),
    /// A worker reported an error for a call.
    Failed(WorkerId, CallId, BackendError),
    /// A worker reported progress on a call (or its health call): `done` of `of` steps.
    Progress(WorkerId, CallId, u32, u32),
    /// A worker process ended (how).
    Exited(WorkerId, String),
    /// A timer fired.
    Timer(Timer),
    /// Periodic housekeeping (expired calls leave the queue).
    Tick,
}

/// Why a call failed without a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The rows were refused by the model: the caller's fault.
    Input(String),
    /// No healthy backend could answer (retryable); the message says why and when the next try is.
    Unavailable(String),
    /// The engine's queue is full.
    Overloaded(String),
    /// The caller's deadline passed before the call reached a worker.
    Expired,
    /// The call failed fatally twice (crash, deadline or fatal error on both attempts): it is
    /// quarantined, answered with this error and not run again.
    Quarantined(String),
}

/// What happened to the backend, for the events topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoticeKind {
    /// A worker was restarted.
    WorkerRestart,
    /// The primary backend is degraded.
    BackendDegraded,
    /// The primary backend serves again.
    BackendRecovered,
}

impl NoticeKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            NoticeKind::WorkerRestart => "worker_restart",
            NoticeKind::BackendDegraded => "backend_degraded",
            NoticeKind::BackendRecovered => "backend_recovered",
        }
    }
}

/// An event for the events topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub kind: NoticeKind,
    pub role: Role,
    /// What failed (restarts and degradation).
    pub reason: Option<RestartReason>,
    pub message: String,
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Start a worker process for this role.
    Spawn(WorkerId, Role),
    /// SIGKILL this worker and reap it.
    Kill(WorkerId),
    /// Send these calls' rows to the worker as one batch, in this order (one call, or several
    /// merged); the frame carries the first call's id.
    Send(WorkerId, Vec<CallId>),
    /// Send the health rows to the worker (as call [`HEALTH_CALL`]).
    Health(WorkerId),
    /// Arm a timer.
    SetTimer(Timer, Duration),
    /// Hand the worker's result for this call to its caller.
    Deliver(CallId),
    /// Answer this call with an error.
    Reject(CallId, CallError),
    /// A restart happened (for counters).
    Restarted(Role, RestartReason),
    /// Publish this on the events topic (and log it).
    Notify(Notice),
}

/// The backend's state as clients see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendState {
    /// No worker has passed its health call yet (or the serving one is being replaced).
    Starting,
    /// A healthy primary serves.
    Ready,
    /// The primary is degraded: the fallback serves, or questions are refused until it recovers.
    Degraded,
}

impl BackendState {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendState::Starting => "starting",
            BackendState::Ready => "ready",
            BackendState::Degraded => "degraded",
        }
    }
}

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
            queue_limit: 64,
            health_rows: 0,
            primary_parallel: 1,
            merge_rows: 1,
            gather: Duration::ZERO,
        }
    }
}

impl Policy {
    /// The policy an `[engine]` section asks for; `fallback` says whether a CPU fallback worker
    /// exists. The queue limit and health rows come from elsewhere (`EngineConfig`).
    pub fn from_config(e: &crate::config::Engine, fallback: bool) -> Policy {
        Policy {
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
            ..Policy::default()
        }
    }
}

/// The serving worker's state as the supervisor sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerState {
    /// No worker and none coming (before `Start`, or degraded without a fallback).
    Down,
    /// Spawned, not yet ready.
    Starting,
    /// Loaded, running its health call.
    Health,
    /// Ready and idle.
    Idle,
    /// Running a call, or a batch of merged calls (the id of its first call).
    Busy(CallId),
    /// Waiting to start again.
    Backoff,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    id: WorkerId,
    role: Role,
    state: WorkerState,
    /// When the current call (or health call) was sent.
    since: Instant,
    /// The deadline the current call has (since its last sign of progress, if any).
    deadline: Duration,
    /// When that deadline passes.
    due: Instant,
    /// The rows of the current call (or health call).
    rows: usize,
    /// The signs of progress of the current call.
    signs: Option<Signs>,
}

/// What the progress frames of the running call said.
#[derive(Debug, Clone, Copy)]
struct Signs {
    /// The first sign: when, and the fraction of the work done then.
    first_at: Instant,
    first: f64,
    /// The fraction done at the last sign.
    last: f64,
}

#[derive(Debug, Clone, Copy)]
struct Call {
    rows: usize,
    /// When it was submitted.
    since: Instant,
    deadline: Option<Instant>,
    /// 0 the first time, 1 on the re-run after a fatal failure of this call alone.
    attempt: u8,
    /// Runs alone, never merged: a probe call, or a call whose merged batch failed (so a failure
    /// is its own, and never a neighbour's).
    alone: bool,
}

/// Whether the idle primary waits for more calls before sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gather {
    /// Not waiting.
    Off,
    /// Waiting, until the round is full or the `Gather` timer fires.
    Waiting,
    /// The timer fired: send what is there.
    Due,
}

#[derive(Debug, Clone)]
struct Degraded {
    /// The failure that degraded the primary, or the last failed try.
    cause: String,
    next_try: Instant,
}

/// How many recent per-row times the deadline is derived from, and how many it needs.
const RECENT: usize = 128;
const MIN_SAMPLES: usize = 5;

/// The supervisor.
#[derive(Debug)]
pub struct Supervisor {
    policy: Policy,
    queue: VecDeque<CallId>,
    calls: BTreeMap<CallId, Call>,
    /// The calls the serving worker runs now, in row order (empty unless it is `Busy`).
    running: Vec<CallId>,
    /// Calls have been queueing behind a busy worker (concurrent callers), since the last
    /// gathering window that found no second call.
    contended: bool,
    /// Since when no worker serves (the serving one is loading, health-checked or restarting).
    not_serving_since: Option<Instant>,
    /// When the armed `Wait` timer fires.
    wait_due: Option<Instant>,
    /// Failed health calls of the primary in a row.
    failed_health: usize,
    /// The last failure, for the refusals of questions that waited too long.
    last_failure: Option<(String, RestartReason)>,
    /// When the serving worker's backoff ends.
    backoff_due: Option<Instant>,
    gather: Gather,
    serving: Option<Slot>,
    /// A degraded primary being tried beside the serving fallback.
    candidate: Option<Slot>,
    degraded: Option<Degraded>,
    /// The serving worker is waiting to start again.
    in_backoff: bool,
    backoff: Duration,
    /// Recent per-row (per-round) times, by role (`role_index`): the CPU fallback is not timed
    /// by the NPU's speed, nor the NPU by the CPU's.
    per_row: [VecDeque<Duration>; 2],
    /// The health call's measured per-row time, by role.
    seed: [Option<Duration>; 2],
    restarts: VecDeque<Instant>,
    restart_counts: BTreeMap<&'static str, u64>,
    generation: u64,
    timers: BTreeMap<u8, u64>,
    next_worker: WorkerId,
    started: bool,
}

fn timer_slot(kind: TimerKind) -> u8 {
    kind as u8
}

fn role_index(role: Role) -> usize {
    match role {
        Role::Primary => 0,
        Role::Fallback => 1,
    }
}

impl Supervisor {
    pub fn new(policy: Policy) -> Supervisor {
        Supervisor {
            backoff: policy.backoff_min,
            policy,
            queue: VecDeque::new(),
            calls: BTreeMap::new(),
            running: Vec::new(),
            contended: false,
            not_serving_since: None,
            wait_due: None,
            failed_health: 0,
            last_failure: None,
            backoff_due: None,
            gather: Gather::Off,
            serving: None,
            candidate: None,
            degraded: None,
            in_backoff: false,
            per_row: [VecDeque::new(), VecDeque::new()],
            seed: [None, None],
            restarts: VecDeque::new(),
            restart_counts: BTreeMap::new(),
            generation: 0,
            timers: BTreeMap::new(),
            next_worker: 1,
            started: false,
        }
    }

    /// The serving worker's state.
    pub fn state(&self) -> WorkerState {
        match self.serving {
            Some(s) => s.state,
            None if self.in_backoff => WorkerState::Backoff,
            None => WorkerState::Down,
        }
    }

    /// Which backend serves (or will serve) questions now.
    pub fn role(&self) -> Role {
        match self.serving {
            Some(s) => s.role,
            None if self.degraded.is_some() && self.policy.fallback => Role::Fallback,
            None => Role::Primary,
        }
    }

    /// The serving worker's id, if one is running.
    pub fn serving_worker(&self) -> Option<WorkerId> {
        self.serving.map(|s| s.id)
    }

    /// Whether the primary backend is degraded.
    pub fn degraded(&self) -> bool {
        self.degraded.is_some()
    }

    /// `starting | ready | degraded`.
    pub fn backend_state(&self) -> BackendState {
        if self.degraded.is_some() {
            BackendState::Degraded
        } else if matches!(self.state(), WorkerState::Idle | WorkerState::Busy(_)) {
            BackendState::Ready
        } else {
            BackendState::Starting
        }
    }

    /// Restarts so far, by reason label.
    pub fn restart_counts(&self) -> &BTreeMap<&'static str, u64> {
        &self.restart_counts
    }

    /// Calls waiting for a worker.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Calls queued or running.
    pub fn in_flight(&self) -> usize {
        self.calls.len()
    }

    /// The per-row estimate the deadline of `role`'s calls is derived from, if anything is known.
    fn per_row_estimate(&self, role: Role) -> Option<Duration> {
        let samples = &self.per_row[role_index(role)];
        if samples.len() >= MIN_SAMPLES {
            let mut sorted: Vec<Duration> = samples.iter().copied().collect();
            sorted.sort();
            let i = ((sorted.len() as f64 * 0.99).ceil() as usize).clamp(1, sorted.len()) - 1;
            return Some(sorted[i]);
        }
        match (self.seed[role_index(role)], self.policy.expected_per_row) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether anything bounds `role`'s rows: a fixed deadline or an estimate.
    fn known(&self, role: Role) -> bool {
        self.policy.fixed_deadline.is_some() || self.per_row_estimate(role).is_some()
    }

    /// How many rounds a call of `rows` rows takes on a worker of `role`: the rows one after
    /// another, or side by side `primary_parallel` at a time on the primary.
    fn rounds(&self, rows: usize, role: Role) -> u32 {
        let parallel = if role == Role::Primary { self.policy.primary_parallel.max(1) } else { 1 };
        u32::try_from(rows.max(1).div_ceil(parallel)).unwrap_or(u32::MAX)
    }

    /// The deadline a call of `rows` rows gets now on the worker that serves.
    pub fn deadline(&self, rows: usize) -> Duration {
        self.bound(self.role(), rows as f64, None)
    }

    /// The time `rows` rows (a fraction of a row counts as such) of `role`'s work may take:
    /// the fixed deadline per row, else `max(min_deadline, 4 x per-row time x rows)`, the
    /// per-row time being the larger of the estimate and `rate` (what the running call itself
    /// has shown); with neither, `max_deadline` a row.
    fn bound(&self, role: Role, rows: f64, rate: Option<Duration>) -> Duration {
        let whole = u32::try_from(rows.max(1.0).ceil() as u64).unwrap_or(u32::MAX);
        if let Some(fixed) = self.policy.fixed_deadline {
            return fixed.saturating_mul(whole);
        }
        let est = match (self.per_row_estimate(role), rate) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        match est {
            Some(est) => {
                let per_row = est.min(self.policy.max_deadline).saturating_mul(4);
                Duration::try_from_secs_f64(per_row.as_secs_f64() * rows.max(1.0))
                    .unwrap_or(Duration::MAX)
                    .max(self.policy.min_deadline)
            }
            None => self.policy.max_deadline.saturating_mul(whole),
        }
    }

    /// A new worker's health call's deadline: its first row is the first inference of a fresh
    /// runtime and gets the load allowance (at least a row's deadline); the other rows get
    /// what is known of `role`'s rows. With nothing known the allowance is the whole call's
    /// until the worker's progress frames measure its rows (`Event::Progress`).
    fn health_deadline_for(&self, role: Role) -> Duration {
        let rows = self.policy.health_rows.max(1);
        let allowance = self.policy.load_allowance.max(self.policy.min_deadline);
        if !self.known(role) {
            return allowance;
        }
        let first = allowance.max(self.bound(role, 1.0, None));
        if rows > 1 { first.saturating_add(self.bound(role, (rows - 1) as f64, None)) } else { first }
    }

    #[cfg(test)]
    fn health_deadline(&self) -> Duration {
        self.health_deadline_for(self.role())
    }

    /// Why questions are refused now, and when the next try is.
    fn unavailable(&self, now: Instant) -> String {
        match &self.degraded {
            Some(d) if self.candidate.is_some() => {
                format!("the backend is degraded ({}); a fresh worker is being health-checked now", d.cause)
            }
            Some(d) => format!(
                "the backend is degraded ({}); next try in {} s",
                d.cause,
                d.next_try.saturating_duration_since(now).as_secs_f64().ceil() as u64
            ),
            None => "the backend is restarting".into(),
        }
    }

    fn timer(&mut self, kind: TimerKind, after: Duration, actions: &mut Vec<Action>) {
        self.generation += 1;
        self.timers.insert(timer_slot(kind), self.generation);
        actions.push(Action::SetTimer(Timer { kind, generation: self.generation }, after));
    }

    fn cancel_timer(&mut self, kind: TimerKind) {
        self.timers.remove(&timer_slot(kind));
    }

    fn live(&self, t: Timer) -> bool {
        self.timers.get(&timer_slot(t.kind)) == Some(&t.generation)
    }

    fn new_worker(&mut self, now: Instant, role: Role, actions: &mut Vec<Action>) -> Slot {
        let id = self.next_worker;
        self.next_worker += 1;
        actions.push(Action::Spawn(id, role));
        let deadline = self.policy.startup_timeout;
        Slot { id, role, state: WorkerState::Starting, since: now, deadline, due: now + deadline, rows: 0, signs: None }
    }

    fn spawn_serving(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let role = if self.degraded.is_some() { Role::Fallback } else { Role::Primary };
        self.in_backoff = false;
        self.cancel_timer(TimerKind::Backoff);
        let slot = self.new_worker(now, role, actions);
        self.serving = Some(slot);
        self.timer(TimerKind::Startup, self.policy.startup_timeout, actions);
    }

    fn spawn_candidate(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let slot = self.new_worker(now, Role::Primary, actions);
        self.candidate = Some(slot);
        self.timer(TimerKind::Candidate, self.policy.startup_timeout, actions);
    }

    /// Sends the next live queued call to the idle serving worker, with the calls queued behind
    /// it while they fit in `merge_rows` (on the primary) and none of them must run alone.
    fn dispatch(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let Some(slot) = self.serving else { return };
        if slot.state != WorkerState::Idle {
            return;
        }
        if self.wait_for_more(slot, now, actions) {
            return;
        }
        let cap = if slot.role == Role::Primary { self.policy.merge_rows.max(1) } else { 1 };
        let mut batch = Vec::new();
        let mut rows = 0;
        while let Some(&call) = self.queue.front() {
            let Some(c) = self.calls.get(&call).copied() else {
                self.queue.pop_front();
                continue;
            };
            if c.deadline.is_some_and(|d| d <= now) {
                self.queue.pop_front();
                self.calls.remove(&call);
                actions.push(Action::Reject(call, CallError::Expired));
                continue;
            }
            if !batch.is_empty() && (c.alone || rows + c.rows > cap) {
                break;
            }
            self.queue.pop_front();
            batch.push(call);
            rows += c.rows;
            if c.alone {
                break;
            }
        }
        let Some(&first) = batch.first() else { return };
        if self.gather == Gather::Due && batch.len() == 1 {
            self.contended = false; // nobody else came: stop waiting for company
        }
        self.gather = Gather::Off;
        self.cancel_timer(TimerKind::Gather);
        let deadline = self.bound(slot.role, rows as f64, None);
        let due = now + deadline;
        self.serving =
            Some(Slot { state: WorkerState::Busy(first), since: now, deadline, due, rows, signs: None, ..slot });
        actions.push(Action::Send(slot.id, batch.clone()));
        self.running = batch;
        self.timer(TimerKind::Deadline, deadline, actions);
    }

    /// Whether the idle primary waits (up to `gather`) for more calls before sending: only
    /// while callers are concurrent, and only until the queued rows fill a round of its contexts.
    fn wait_for_more(&mut self, slot: Slot, now: Instant, actions: &mut Vec<Action>) -> bool {
        let parallel = self.policy.primary_parallel;
        let on = slot.role == Role::Primary && parallel > 1 && self.policy.merge_rows > 1 && self.contended;
        let window = match self.per_row_estimate(Role::Primary) {
            Some(est) => self.policy.gather.min(est / 10),
            None => self.policy.gather,
        };
        if !on || window.is_zero() || self.gather == Gather::Due {
            return false;
        }
        let mut rows = 0;
        for call in &self.queue {
            match self.calls.get(call) {
                Some(c) if c.alone => return false,
                Some(c) if c.deadline.is_none_or(|d| d > now) => rows += c.rows,
                _ => {}
            }
            if rows >= parallel {
                return false;
            }
        }
        if rows == 0 {
            return false;
        }
        if self.gather == Gather::Off {
            self.gather = Gather::Waiting;
            self.timer(TimerKind::Gather, window, actions);
        }
        true
    }

    /// The running batch, which failed as a whole, goes back to the front of the queue in its
    /// order, each call to run alone with its attempts unchanged: the failure is not yet any
    /// one call's.
    fn split_running(&mut self) {
        let batch = std::mem::take(&mut self.running);
        for call in batch.into_iter().rev() {
            if let Some(c) = self.calls.get_mut(&call) {
                c.alone = true;
                self.queue.push_front(call);
            }
        }
    }

    fn reject_queue(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let why = self.unavailable(now);
        for call in self.queue.drain(..) {
            self.calls.remove(&call);
            actions.push(Action::Reject(call, CallError::Unavailable(why.clone())));
        }
    }

    fn schedule_retry(&mut self, now: Instant, cause: String, actions: &mut Vec<Action>) {
        let next_try = now + self.policy.primary_retry;
        self.degraded = Some(Degraded { cause, next_try });
        self.timer(TimerKind::Retry, self.policy.primary_retry, actions);
    }

    /// A worker loaded and passed its health call.
    fn healthy(&mut self, now: Instant, slot: Slot, actions: &mut Vec<Action>) {
        let elapsed = now.duration_since(slot.since);
        if self.policy.health_rows > 0 {
            let rounds = f64::from(self.rounds(self.policy.health_rows, slot.role));
            // From the first sign of progress on, when there is one: the first inference's
            // own cost (the load allowance's business) does not inflate every later deadline.
            let seed = match slot.signs {
                Some(signs) if signs.first < 1.0 => {
                    now.duration_since(signs.first_at).as_secs_f64() / (rounds * (1.0 - signs.first))
                }
                _ => elapsed.as_secs_f64() / rounds,
            };
            self.seed[role_index(slot.role)] = Some(Duration::from_secs_f64(seed));
        }
        if slot.role == Role::Primary {
            self.failed_health = 0;
        }
        if self.candidate.is_some_and(|c| c.id == slot.id) {
            // The degraded primary is back: it takes over from the fallback.
            self.candidate = None;
            self.cancel_timer(TimerKind::Candidate);
            if let Some(old) = self.serving.take() {
                actions.push(Action::Kill(old.id));
                // Not the calls' fault: they run again, same attempt, in their order.
                for call in std::mem::take(&mut self.running).into_iter().rev() {
                    self.queue.push_front(call);
                }
            }
            self.cancel_timer(TimerKind::Deadline);
            self.cancel_timer(TimerKind::Startup);
            self.cancel_timer(TimerKind::Backoff);
            self.cancel_timer(TimerKind::Retry);
            self.cancel_timer(TimerKind::Gather);
            self.gather = Gather::Off;
            self.in_backoff = false;
            self.degraded = None;
            self.restarts.clear();
            self.backoff = self.policy.backoff_min;
            actions.push(Action::Notify(Notice {
                kind: NoticeKind::BackendRecovered,
                role: Role::Primary,
                reason: None,
                message: "the primary backend passed its health call and serves again".into(),
            }));
        } else {
            self.cancel_timer(TimerKind::Deadline);
            self.backoff = self.policy.backoff_min;
        }
        self.serving = Some(Slot { state: WorkerState::Idle, since: now, ..slot });
        self.dispatch(now, actions);
    }

    /// A worker failed: kill (unless it is dead already), count, and decide what comes next.
    fn failed(&mut self, now: Instant, id: WorkerId, reason: RestartReason, kill: bool, actions: &mut Vec<Action>) {
        let why = reason.describe();
        if self.candidate.is_some_and(|c| c.id == id) || self.serving.is_some_and(|s| s.id == id) {
            self.last_failure = Some((why.clone(), reason.clone()));
        }
        if self.candidate.is_some_and(|c| c.id == id) {
            self.candidate = None;
            self.cancel_timer(TimerKind::Candidate);
            if kill {
                actions.push(Action::Kill(id));
            }
            *self.restart_counts.entry(reason.label()).or_default() += 1;
            actions.push(Action::Restarted(Role::Primary, reason.clone()));
            actions.push(Action::Notify(Notice {
                kind: NoticeKind::WorkerRestart,
                role: Role::Primary,
                message: format!("the degraded primary failed its try: {why}"),
                reason: Some(reason),
            }));
            self.schedule_retry(now, why, actions);
            return;
        }
        let Some(slot) = self.serving.filter(|s| s.id == id) else { return };
        self.serving = None;
        self.gather = Gather::Off;
        self.cancel_timer(TimerKind::Gather);
        self.cancel_timer(TimerKind::Deadline);
        self.cancel_timer(TimerKind::Startup);
        if kill {
            actions.push(Action::Kill(id));
        }
        *self.restart_counts.entry(reason.label()).or_default() += 1;
        actions.push(Action::Restarted(slot.role, reason.clone()));
        actions.push(Action::Notify(Notice {
            kind: NoticeKind::WorkerRestart,
            role: slot.role,
            message: why.clone(),
            reason: Some(reason.clone()),
        }));
        // The call in flight runs once more on the next worker; a second failure quarantines it
        // (answered with an error) and that failure is the request's, not the budget's.
        // A merged batch runs again call by call, attempts unchanged (see `split_running`).
        let mut counts = true;
        if self.running.len() > 1 {
            self.split_running();
        } else if let WorkerState::Busy(_) = slot.state
            && let Some(call) = self.running.pop()
            && let Some(c) = self.calls.get_mut(&call)
        {
            if c.attempt == 0 {
                c.attempt = 1;
                c.alone = true;
                self.queue.push_front(call);
            } else {
                self.calls.remove(&call);
                counts = false;
                actions.push(Action::Reject(
                    call,
                    CallError::Quarantined(format!("this request failed twice ({why}); it is not run again")),
                ));
            }
        }
        self.running.clear();
        if counts && slot.role == Role::Primary && self.degraded.is_none() {
            self.restarts.push_back(now);
            while self.restarts.front().is_some_and(|t| now.duration_since(*t) > self.policy.restart_window) {
                self.restarts.pop_front();
            }
            if slot.state == WorkerState::Health {
                self.failed_health += 1;
            }
            let max_failed_health = self.policy.max_failed_health;
            let cause = if max_failed_health > 0 && self.failed_health >= max_failed_health {
                Some(format!("{} failed health calls in a row, the last: {why}", self.failed_health))
            } else if self.restarts.len() > self.policy.max_restarts {
                Some(format!(
                    "{} restarts within {} s, the last: {why}",
                    self.restarts.len(),
                    self.policy.restart_window.as_secs()
                ))
            } else {
                None
            };
            if let Some(cause) = cause {
                self.degrade(now, cause, Some(reason), actions);
                return;
            }
        }
        if self.degraded.is_some() && !self.policy.fallback {
            // A promoted primary failed again: back to degraded; the retry timer is running.
            self.reject_queue(now, actions);
            return;
        }
        self.in_backoff = true;
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(self.policy.backoff_max);
        self.backoff_due = Some(now + wait);
        self.timer(TimerKind::Backoff, wait, actions);
        if self.degraded.is_some() {
            // The fallback itself is failing: refuse rather than queue behind its backoff.
            self.reject_queue(now, actions);
        }
    }

    /// The primary is degraded for `cause`: the fallback serves, or the queue is refused; the
    /// primary is tried again every `primary_retry`.
    fn degrade(&mut self, now: Instant, cause: String, reason: Option<RestartReason>, actions: &mut Vec<Action>) {
        self.restarts.clear();
        self.failed_health = 0;
        self.backoff = self.policy.backoff_min;
        self.schedule_retry(now, cause, actions);
        actions.push(Action::Notify(Notice {
            kind: NoticeKind::BackendDegraded,
            role: Role::Primary,
            message: self.unavailable(now),
            reason,
        }));
        if self.policy.fallback {
            self.spawn_serving(now, actions);
        } else {
            self.reject_queue(now, actions);
        }
    }

    /// What the worker that should serve is doing instead, in a phrase.
    fn not_ready(&self, now: Instant) -> String {
        let role = self.role();
        let who = if role == Role::Fallback { "the CPU fallback" } else { "the backend" };
        let last = match &self.last_failure {
            Some((why, _)) => format!("; the last failure: {why}"),
            None => String::new(),
        };
        match self.serving {
            Some(s) if s.state == WorkerState::Starting => {
                format!("{who} has been loading for {} s{last}", now.duration_since(s.since).as_secs())
            }
            Some(s) if s.state == WorkerState::Health => format!(
                "{who}'s health call has been running for {} s (its first row may take load_allowance_ms, {} ms){last}",
                now.duration_since(s.since).as_secs(),
                self.policy.load_allowance.as_millis()
            ),
            _ => match &self.last_failure {
                Some((why, _)) => format!("{who} is restarting after: {why}"),
                None => format!("{who} is restarting"),
            },
        }
    }

    /// The oldest queued question has waited `ready_wait` for a worker that is not serving:
    /// with a fallback (and the primary not degraded yet), the primary is degraded at once, goes
    /// on as the candidate beside the fallback, and takes over if its health call passes;
    /// otherwise the questions that waited that long are refused with the cause.
    fn waited_too_long(&mut self, now: Instant, wait: Duration, actions: &mut Vec<Action>) {
        let desc = self.not_ready(now);
        if self.policy.fallback && self.degraded.is_none() {
            let cause = format!("not ready after {} s: {desc}", wait.as_secs());
            let reason = self.last_failure.as_ref().map(|(_, r)| r.clone());
            self.gather = Gather::Off;
            self.cancel_timer(TimerKind::Gather);
            self.cancel_timer(TimerKind::Deadline);
            self.cancel_timer(TimerKind::Startup);
            let retry_in = match self.serving.take() {
                Some(slot) => {
                    // Loading or in its health call: it goes on, as the candidate.
                    self.candidate = Some(slot);
                    self.timer(TimerKind::Candidate, slot.due.saturating_duration_since(now), actions);
                    None
                }
                None => {
                    // Between restarts: the candidate starts when the backoff would have ended.
                    self.cancel_timer(TimerKind::Backoff);
                    self.in_backoff = false;
                    Some(self.backoff_due.map_or(Duration::ZERO, |d| d.saturating_duration_since(now)))
                }
            };
            self.restarts.clear();
            self.failed_health = 0;
            self.backoff = self.policy.backoff_min;
            let next_try = now + retry_in.unwrap_or_default();
            self.degraded = Some(Degraded { cause, next_try });
            if let Some(after) = retry_in {
                self.timer(TimerKind::Retry, after, actions);
            }
            actions.push(Action::Notify(Notice {
                kind: NoticeKind::BackendDegraded,
                role: Role::Primary,
                message: self.unavailable(now),
                reason,
            }));
            self.spawn_serving(now, actions);
            // The fallback gets its own `ready_wait`.
            self.not_serving_since = Some(now);
            return;
        }
        let why = format!("not ready after {} s: {desc}", wait.as_secs());
        let since = self.not_serving_since.unwrap_or(now);
        let mut kept = VecDeque::new();
        for call in std::mem::take(&mut self.queue) {
            match self.calls.get(&call) {
                Some(c) if c.since.max(since) + wait <= now => {
                    self.calls.remove(&call);
                    actions.push(Action::Reject(call, CallError::Unavailable(why.clone())));
                }
                Some(_) => kept.push_back(call),
                None => {}
            }
        }
        self.queue = kept;
    }

    /// Keeps the `Wait` timer on the oldest question waiting for a worker that is not serving
    /// (run after every event).
    fn check_wait(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let Some(wait) = self.policy.ready_wait else { return };
        let serving = matches!(self.state(), WorkerState::Idle | WorkerState::Busy(_));
        if serving || !self.started {
            self.not_serving_since = None;
        } else if self.not_serving_since.is_none() {
            self.not_serving_since = Some(now);
        }
        let oldest = self.queue.iter().find_map(|c| self.calls.get(c)).map(|c| c.since);
        let (Some(since), Some(oldest)) = (self.not_serving_since, oldest) else {
            self.wait_due = None;
            self.cancel_timer(TimerKind::Wait);
            return;
        };
        let due = oldest.max(since) + wait;
        if due <= now {
            self.wait_due = None;
            self.cancel_timer(TimerKind::Wait);
            self.waited_too_long(now, wait, actions);
            // Whoever is left (or the fallback's own wait) gets the timer again.
            if self.policy.fallback || !self.queue.is_empty() {
                self.check_wait(now, actions);
            }
        } else if self.wait_due != Some(due) {
            self.wait_due = Some(due);
            self.timer(TimerKind::Wait, due - now, actions);
        }
    }

    /// A sign of progress on the running call (or health call) of worker `id`: its deadline
    /// starts again from now, for the work left, at the larger of the estimate and the rate the
    /// call has shown (from its first sign, so a first inference's cost is not the rate).
    fn progress(&mut self, now: Instant, id: WorkerId, call: CallId, done: u32, of: u32, actions: &mut Vec<Action>) {
        let is_candidate = self.candidate.is_some_and(|c| c.id == id);
        let Some(slot) = self.slot_mut(id).copied() else { return };
        let running = match slot.state {
            WorkerState::Health => call == HEALTH_CALL,
            WorkerState::Busy(c) => c == call,
            _ => false,
        };
        // Frames are from outside: a fraction that does not move forward is no progress.
        if !running || of == 0 || done > of {
            return;
        }
        let frac = f64::from(done) / f64::from(of);
        if slot.signs.is_some_and(|s| frac <= s.last) || frac <= 0.0 {
            return;
        }
        let rounds = f64::from(self.rounds(slot.rows, slot.role));
        let (signs, rate) = match slot.signs {
            None => {
                let rate = now.duration_since(slot.since).as_secs_f64() / (rounds * frac);
                (Signs { first_at: now, first: frac, last: frac }, rate)
            }
            Some(s) => {
                let rate = now.duration_since(s.first_at).as_secs_f64() / (rounds * (frac - s.first));
                (Signs { last: frac, ..s }, rate)
            }
        };
        let left = slot.rows.max(1) as f64 * (1.0 - frac);
        let deadline = self.bound(slot.role, left, Duration::try_from_secs_f64(rate).ok());
        let kind = if is_candidate { TimerKind::Candidate } else { TimerKind::Deadline };
        if let Some(s) = self.slot_mut(id) {
            s.signs = Some(signs);
            s.deadline = deadline;
            s.due = now + deadline;
        }
        self.timer(kind, deadline, actions);
    }

    fn slot_mut(&mut self, id: WorkerId) -> Option<&mut Slot> {
        if self.serving.is_some_and(|s| s.id == id) {
            self.serving.as_mut()
        } else if self.candidate.is_some_and(|c| c.id == id) {
            self.candidate.as_mut()
        } else {
            None
        }
    }

    /// Feeds one event; returns what to do, in order.
    pub fn handle(&mut self, now: Instant, event: Event) -> Vec<Action> {
        let mut actions = Vec::new();
        match event {
            Event::Start => {
                if !self.started {
                    self.started = true;
                    self.spawn_serving(now, &mut actions);
                }
            }
            Event::Submit { call, rows, deadline, alone } => {
                if deadline.is_some_and(|d| d <= now) {
                    actions.push(Action::Reject(call, CallError::Expired));
                } else if self.degraded.is_some() && self.serving.is_none() {
                    actions.push(Action::Reject(call, CallError::Unavailable(self.unavailable(now))));
                } else if self.calls.len() >= self.policy.queue_limit.max(1) {
                    let why = format!("the engine has {} calls queued or running, its limit", self.calls.len());
                    actions.push(Action::Reject(call, CallError::Overloaded(why)));
                } else {
                    self.calls.insert(call, Call { rows, since: now, deadline, attempt: 0, alone });
                    self.queue.push_back(call);
                    if matches!(self.state(), WorkerState::Busy(_)) {
                        self.contended = true;
                    }
                    self.dispatch(now, &mut actions);
                }
            }
            Event::Cancelled(call) => {
                if self.calls.remove(&call).is_some() {
                    self.queue.retain(|c| *c != call);
                    // Sent nowhere yet (the driver cancels before writing): the worker is free,
                    // and the rest of the batch goes back to the front, to be sent without it.
                    if self.running.contains(&call)
                        && let Some(s) = self.serving.filter(|s| matches!(s.state, WorkerState::Busy(_)))
                    {
                        self.cancel_timer(TimerKind::Deadline);
                        self.serving = Some(Slot { state: WorkerState::Idle, ..s });
                        for c in std::mem::take(&mut self.running).into_iter().rev().filter(|c| *c != call) {
                            self.queue.push_front(c);
                        }
                        self.dispatch(now, &mut actions);
                    }
                }
            }
            Event::Ready(id) => {
                let health = self.policy.health_rows > 0;
                let is_candidate = self.candidate.is_some_and(|c| c.id == id);
                let role = self.slot_mut(id).map_or(Role::Primary, |s| s.role);
                let deadline = self.health_deadline_for(role);
                let rows = self.policy.health_rows;
                if let Some(slot) = self.slot_mut(id).filter(|s| s.state == WorkerState::Starting) {
                    slot.state = WorkerState::Health;
                    slot.since = now;
                    slot.deadline = deadline;
                    slot.due = now + deadline;
                    slot.rows = rows;
                    slot.signs = None;
                    let slot = *slot;
                    if health {
                        actions.push(Action::Health(id));
                        let kind = if is_candidate { TimerKind::Candidate } else { TimerKind::Deadline };
                        if !is_candidate {
                            self.cancel_timer(TimerKind::Startup);
                        }
                        self.timer(kind, deadline, &mut actions);
                    } else {
                        if !is_candidate {
                            self.cancel_timer(TimerKind::Startup);
                        }
                        self.healthy(now, slot, &mut actions);
                    }
                }
            }
            Event::LoadFailed(id, why) => self.failed(now, id, RestartReason::LoadFailed(why), true, &mut actions),
            Event::Exited(id, how) => self.failed(now, id, RestartReason::Crash(how), false, &mut actions),
            Event::Done(id, call) => {
                let Some(slot) = self.slot_mut(id).copied() else { return actions };
                match slot.state {
                    WorkerState::Health if call == HEALTH_CALL => self.healthy(now, slot, &mut actions),
                    WorkerState::Busy(c) if c == call => {
                        let elapsed = now.duration_since(slot.since);
                        let batch = std::mem::take(&mut self.running);
                        let rows: usize = batch.iter().filter_map(|c| self.calls.remove(c)).map(|c| c.rows).sum();
                        if rows > 0 {
                            let sample = elapsed / self.rounds(rows, slot.role);
                            let samples = &mut self.per_row[role_index(slot.role)];
                            samples.push_back(sample);
                            if samples.len() > RECENT {
                                samples.pop_front();
                            }
                        }
                        self.cancel_timer(TimerKind::Deadline);
                        self.backoff = self.policy.backoff_min;
                        self.serving = Some(Slot { state: WorkerState::Idle, since: now, ..slot });
                        actions.extend(batch.into_iter().map(Action::Deliver));
                        self.dispatch(now, &mut actions);
                    }
                    _ => {}
                }
            }
            Event::Progress(id, call, done, of) => self.progress(now, id, call, done, of, &mut actions),
            Event::Failed(id, call, error) => {
                let Some(slot) = self.slot_mut(id).copied() else { return actions };
                let running = match slot.state {
                    WorkerState::Health => call == HEALTH_CALL,
                    WorkerState::Busy(c) => c == call,
                    _ => false,
                };
                if !running {
                    return actions;
                }
                match error {
                    BackendError::Input(msg) | BackendError::Transient(msg) if slot.state == WorkerState::Health => {
                        let why = format!("the health call failed: {msg}");
                        self.failed(now, id, RestartReason::LoadFailed(why), true, &mut actions);
                    }
                    // A merged batch failed as a whole: its calls run again alone, each for its
                    // own answer or its own error (the worker reports errors per batch).
                    BackendError::Input(_) | BackendError::Transient(_) if self.running.len() > 1 => {
                        self.cancel_timer(TimerKind::Deadline);
                        self.serving = Some(Slot { state: WorkerState::Idle, ..slot });
                        self.split_running();
                        self.dispatch(now, &mut actions);
                    }
                    BackendError::Input(msg) => {
                        self.cancel_timer(TimerKind::Deadline);
                        self.calls.remove(&call);
                        self.running.clear();
                        self.serving = Some(Slot { state: WorkerState::Idle, ..slot });
                        actions.push(Action::Reject(call, CallError::Input(msg)));
                        self.dispatch(now, &mut actions);
                    }
                    BackendError::Transient(msg) => {
                        self.cancel_timer(TimerKind::Deadline);
                        self.running.clear();
                        self.serving = Some(Slot { state: WorkerState::Idle, ..slot });
                        match self.calls.get_mut(&call) {
                            Some(c) if c.attempt == 0 => {
                                c.attempt = 1;
                                c.alone = true;
                                self.queue.push_front(call);
                            }
                            _ => {
                                self.calls.remove(&call);
                                actions.push(Action::Reject(call, CallError::Unavailable(msg)));
                            }
                        }
                        self.dispatch(now, &mut actions);
                    }
                    BackendError::Fatal { code, message } => {
                        self.failed(now, id, RestartReason::Fatal { code, message }, true, &mut actions);
                    }
                }
            }
            Event::Timer(t) => {
                if !self.live(t) {
                    return actions;
                }
                self.timers.remove(&timer_slot(t.kind));
                match t.kind {
                    TimerKind::Deadline => {
                        if let Some(s) =
                            self.serving.filter(|s| matches!(s.state, WorkerState::Busy(_) | WorkerState::Health))
                        {
                            self.failed(now, s.id, RestartReason::Deadline(s.deadline), true, &mut actions);
                        }
                    }
                    TimerKind::Startup => {
                        if let Some(s) = self.serving.filter(|s| s.state == WorkerState::Starting) {
                            let why = format!("not ready within {} s", self.policy.startup_timeout.as_secs());
                            self.failed(now, s.id, RestartReason::LoadFailed(why), true, &mut actions);
                        }
                    }
                    TimerKind::Candidate => {
                        if let Some(c) = self.candidate {
                            let reason = if c.state == WorkerState::Starting {
                                RestartReason::LoadFailed(format!(
                                    "not ready within {} s",
                                    self.policy.startup_timeout.as_secs()
                                ))
                            } else {
                                RestartReason::Deadline(c.deadline)
                            };
                            self.failed(now, c.id, reason, true, &mut actions);
                        }
                    }
                    TimerKind::Backoff => {
                        if self.serving.is_none() && self.in_backoff {
                            self.spawn_serving(now, &mut actions);
                        }
                    }
                    TimerKind::Wait => self.wait_due = None, // `check_wait` below acts on it
                    TimerKind::Gather => {
                        if self.gather == Gather::Waiting {
                            self.gather = Gather::Due;
                            self.dispatch(now, &mut actions);
                        }
                    }
                    TimerKind::Retry => {
                        if self.degraded.is_some() && self.candidate.is_none() {
                            if let Some(d) = self.degraded.as_mut() {
                                d.next_try = now + self.policy.primary_retry;
                            }
                            self.spawn_candidate(now, &mut actions);
                        }
                    }
                }
            }
            Event::Tick => {
                let expired: Vec<CallId> = self
                    .queue
                    .iter()
                    .copied()
                    .filter(|c| self.calls.get(c).is_some_and(|i| i.deadline.is_some_and(|d| d <= now)))
                    .collect();
                for call in expired {
                    self.queue.retain(|c| *c != call);
                    self.calls.remove(&call);
                    actions.push(Action::Reject(call, CallError::Expired));
                }
            }
        }
        self.check_wait(now, &mut actions);
        actions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Sim {
        sup: Supervisor,
        now: Instant,
        timers: BTreeMap<u8, (Instant, Timer)>,
        log: Vec<Action>,
    }

    impl Sim {
        fn new(policy: Policy) -> Sim {
            let mut s =
                Sim { sup: Supervisor::new(policy), now: Instant::now(), timers: BTreeMap::new(), log: Vec::new() };
            s.feed(Event::Start);
            s
        }

        fn feed(&mut self, e: Event) -> Vec<Action> {
            let actions = self.sup.handle(self.now, e);
            for a in &actions {
                if let Action::SetTimer(t, after) = a {
                    self.timers.insert(timer_slot(t.kind), (self.now + *after, *t));
                }
            }
            self.log.extend(actions.clone());
            actions
        }

        /// Advances the clock, firing due timers in order.
        fn advance(&mut self, by: Duration) -> Vec<Action> {
            let until = self.now + by;
            let mut out = Vec::new();
            loop {
                let next = self.timers.iter().map(|(k, (at, t))| (*at, *k, *t)).min_by_key(|x| x.0);
                match next {
                    Some((at, k, t)) if at <= until => {
                        self.timers.remove(&k);
                        self.now = self.now.max(at);
                        out.extend(self.feed(Event::Timer(t)));
                    }
                    _ => break,
                }
            }
            self.now = until;
            out
        }

        /// The most recently spawned worker.
        fn worker(&self) -> WorkerId {
            self.log.iter().rev().find_map(|a| if let Action::Spawn(w, _) = a { Some(*w) } else { None }).unwrap()
        }

        fn submit(&mut self, call: CallId, rows: usize) -> Vec<Action> {
            self.feed(Event::Submit { call, rows, deadline: None, alone: false })
        }

        /// One-row calls `calls` on worker `w`, each answered `took` after it was submitted.
        fn one_row_calls(&mut self, w: WorkerId, calls: std::ops::RangeInclusive<CallId>, took: Duration) {
            for call in calls {
                self.submit(call, 1);
                self.now += took;
                self.feed(Event::Done(w, call));
            }
        }

        /// The latest worker reports ready and passes its health call `health_ms` later.
        fn ready_and_healthy(&mut self, health_ms: u64) -> Vec<Action> {
            let w = self.worker();
            let a = self.feed(Event::Ready(w));
            assert!(a.contains(&Action::Health(w)), "{a:?}");
            self.now += Duration::from_millis(health_ms);
            self.feed(Event::Done(w, HEALTH_CALL))
        }

        fn spawns(&self) -> usize {
            self.log.iter().filter(|a| matches!(a, Action::Spawn(..))).count()
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn healthy_policy() -> Policy {
        Policy { health_rows: 2, ..Policy::default() }
    }

    #[test]
    fn a_call_waits_for_the_health_call_then_is_sent_and_delivered() {
        let mut s = Sim::new(healthy_policy());
        // Nothing is sent; only the timer of how long it may wait for the worker is armed.
        assert!(only_the_wait_timer(&s.submit(1, 1)));
        let w = s.worker();
        assert_eq!(s.feed(Event::Ready(w))[0], Action::Health(w));
        assert_eq!(s.sup.backend_state(), BackendState::Starting);
        let a = s.feed(Event::Done(w, HEALTH_CALL));
        assert_eq!(a[0], Action::Send(w, vec![1]));
        assert_eq!(s.sup.backend_state(), BackendState::Ready);
        assert_eq!(s.feed(Event::Done(w, 1)), [Action::Deliver(1)]);
        assert_eq!(s.sup.state(), WorkerState::Idle);
    }

    #[test]
    fn a_hung_call_is_killed_at_its_deadline_rerun_once_then_quarantined() {
        let mut s = Sim::new(Policy { fixed_deadline: Some(secs(2)), ..healthy_policy() });
        s.ready_and_healthy(1);
        s.submit(7, 1);
        let w = s.worker();
        let a = s.advance(ms(2001));
        assert_eq!(a[0], Action::Kill(w));
        assert_eq!(a[1], Action::Restarted(Role::Primary, RestartReason::Deadline(secs(2))));
        // Backoff, a new worker, its health call, and the same call again.
        s.advance(ms(100));
        assert_eq!(s.spawns(), 2);
        let a = s.ready_and_healthy(1);
        assert_eq!(a[0], Action::Send(s.worker(), vec![7]));
        let a = s.advance(secs(3));
        let quarantined = a.iter().any(|x| {
            matches!(x, Action::Reject(7, CallError::Quarantined(m)) if m.contains("missed its deadline (2000 ms)"))
        });
        assert!(quarantined, "{a:?}");
        assert_eq!(s.sup.restart_counts()["deadline"], 2);
    }

    #[test]
    fn a_crash_mid_call_restarts_and_the_call_succeeds_on_the_new_worker() {
        let mut s = Sim::new(healthy_policy());
        s.ready_and_healthy(1);
        s.submit(3, 1);
        let w = s.worker();
        let a = s.feed(Event::Exited(w, "signal 6".into()));
        assert!(!a.contains(&Action::Kill(w)), "a dead worker is reaped, not killed: {a:?}");
        assert_eq!(s.sup.state(), WorkerState::Backoff);
        s.advance(ms(100));
        let w2 = s.worker();
        assert_ne!(w, w2);
        // The health call comes first, the re-run right after it passes.
        assert_eq!(s.feed(Event::Ready(w2))[0], Action::Health(w2));
        let a = s.feed(Event::Done(w2, HEALTH_CALL));
        assert!(matches!(a.as_slice(), [Action::Send(x, c), Action::SetTimer(..)] if *x == w2 && *c == [3]), "{a:?}");
        assert_eq!(s.feed(Event::Done(w2, 3)), [Action::Deliver(3)]);
    }

    #[test]
    fn backoff_doubles_up_to_its_ceiling() {
        let mut s = Sim::new(Policy { max_restarts: 100, ..Policy::default() });
        let mut waits = Vec::new();
        for _ in 0..12 {
            let w = s.worker();
            for x in s.feed(Event::Exited(w, "exit 3".into())) {
                if let Action::SetTimer(Timer { kind: TimerKind::Backoff, .. }, d) = x {
                    waits.push(d);
                }
            }
            s.advance(secs(31));
        }
        assert_eq!(waits[0], ms(100));
        assert_eq!(waits[1], ms(200));
        assert_eq!(*waits.last().unwrap(), secs(30));
    }

    #[test]
    fn a_transient_error_is_retried_once_and_an_input_error_is_the_callers() {
        let mut s = Sim::new(healthy_policy());
        s.ready_and_healthy(1);
        let w = s.worker();
        s.submit(1, 1);
        assert_eq!(s.feed(Event::Failed(w, 1, BackendError::Transient("ssr".into())))[0], Action::Send(w, vec![1]));
        assert_eq!(
            s.feed(Event::Failed(w, 1, BackendError::Transient("ssr".into())))[0],
            Action::Reject(1, CallError::Unavailable("ssr".into()))
        );
        s.submit(2, 1);
        assert_eq!(
            s.feed(Event::Failed(w, 2, BackendError::Input("bad".into())))[0],
            Action::Reject(2, CallError::Input("bad".into()))
        );
        assert!(s.sup.restart_counts().is_empty());
    }

    #[test]
    fn without_a_fallback_six_crashes_refuse_with_the_cause_then_the_retry_recovers_with_no_restart() {
        let mut s = Sim::new(Policy { primary_retry: secs(20), ..healthy_policy() });
        s.ready_and_healthy(1);
        for i in 0..6 {
            let w = s.worker();
            let a = s.feed(Event::Exited(w, "signal 9".into()));
            if i < 5 {
                assert!(!s.sup.degraded(), "{a:?}");
                s.advance(secs(1));
                s.ready_and_healthy(1);
            } else {
                let degraded =
                    a.iter().any(|x| matches!(x, Action::Notify(n) if n.kind == NoticeKind::BackendDegraded));
                assert!(degraded, "{a:?}");
            }
        }
        assert_eq!(s.sup.backend_state(), BackendState::Degraded);
        s.advance(secs(5));
        // Refused at once, with the root cause and the time of the next try.
        match s.submit(1, 1).as_slice() {
            [Action::Reject(1, CallError::Unavailable(m))] => {
                assert!(m.contains("signal 9") && m.contains("6 restarts") && m.contains("next try in 15 s"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        // The retry: a fresh worker gets the health call before any question.
        let a = s.advance(secs(15));
        assert!(a.iter().any(|x| matches!(x, Action::Spawn(_, Role::Primary))), "{a:?}");
        match s.submit(2, 1).as_slice() {
            [Action::Reject(2, CallError::Unavailable(m))] => assert!(m.contains("health-checked now"), "{m}"),
            other => panic!("{other:?}"),
        }
        let a = s.ready_and_healthy(1);
        assert!(a.iter().any(|x| matches!(x, Action::Notify(n) if n.kind == NoticeKind::BackendRecovered)), "{a:?}");
        assert_eq!(s.sup.backend_state(), BackendState::Ready);
        s.submit(3, 1);
        assert_eq!(s.feed(Event::Done(s.worker(), 3)), [Action::Deliver(3)]);
    }

    #[test]
    fn a_degraded_primary_is_retried_for_ever_through_every_kind_of_failed_try() {
        let mut s = Sim::new(Policy { max_restarts: 0, primary_retry: secs(10), ..healthy_policy() });
        let w = s.worker();
        s.feed(Event::LoadFailed(w, "no DSP".into()));
        assert!(s.sup.degraded());
        // Tries that fail in each way: load failure, never ready, hung health call, crash, fatal.
        for i in 0..5 {
            let a = s.advance(secs(10));
            let w = s.worker();
            assert!(a.contains(&Action::Spawn(w, Role::Primary)), "try {i}: {a:?}");
            match i {
                0 => drop(s.feed(Event::LoadFailed(w, "no DSP".into()))),
                1 => drop(s.advance(secs(120))),
                2 => {
                    s.feed(Event::Ready(w));
                    s.advance(secs(60));
                }
                3 => drop(s.feed(Event::Exited(w, "signal 11".into()))),
                _ => {
                    s.feed(Event::Ready(w));
                    s.feed(Event::Failed(w, HEALTH_CALL, BackendError::Fatal { code: Some(3), message: "x".into() }));
                }
            }
            assert!(s.sup.degraded(), "try {i}");
        }
        s.advance(secs(10));
        s.ready_and_healthy(1);
        assert!(!s.sup.degraded());
    }

    #[test]
    fn a_candidate_primary_starts_beside_the_serving_fallback_and_takes_over_only_after_its_health_call() {
        let mut s = Sim::new(Policy { fallback: true, max_restarts: 2, primary_retry: secs(60), ..healthy_policy() });
        for _ in 0..3 {
            let w = s.worker();
            s.feed(Event::Exited(w, "signal 11".into()));
            s.advance(secs(1));
        }
        assert!(s.sup.degraded());
        assert_eq!(s.sup.role(), Role::Fallback);
        let fallback = s.worker();
        assert!(s.log.contains(&Action::Spawn(fallback, Role::Fallback)));
        s.ready_and_healthy(1);
        s.submit(5, 1);
        assert_eq!(s.feed(Event::Done(fallback, 5)), [Action::Deliver(5)]);
        // The retry: a candidate primary starts, the fallback is not touched.
        let a = s.advance(secs(60));
        let candidate = s.worker();
        assert_eq!(a.iter().filter(|x| matches!(x, Action::Spawn(..))).count(), 1);
        assert!(a.contains(&Action::Spawn(candidate, Role::Primary)) && !a.contains(&Action::Kill(fallback)));
        // It hangs while loading: the fallback keeps answering meanwhile.
        s.submit(6, 1);
        assert_eq!(s.feed(Event::Done(fallback, 6)), [Action::Deliver(6)]);
        let a = s.advance(secs(120));
        assert!(a.contains(&Action::Kill(candidate)) && !a.contains(&Action::Kill(fallback)), "{a:?}");
        // The next candidate passes its health call while the fallback is busy: it takes over
        // and runs the interrupted call.
        s.advance(secs(60));
        let candidate = s.worker();
        s.submit(7, 1);
        s.feed(Event::Ready(candidate));
        let a = s.feed(Event::Done(candidate, HEALTH_CALL));
        assert!(a.contains(&Action::Kill(fallback)) && a.contains(&Action::Send(candidate, vec![7])), "{a:?}");
        assert_eq!(s.sup.role(), Role::Primary);
        assert!(!s.sup.degraded());
    }

    #[test]
    fn a_crash_looping_fallback_is_restarted_for_ever_and_questions_are_refused_while_it_is_down() {
        let mut s = Sim::new(Policy { fallback: true, max_restarts: 0, primary_retry: secs(3600), ..healthy_policy() });
        let w = s.worker();
        s.feed(Event::Exited(w, "signal 11".into()));
        for _ in 0..20 {
            let f = s.worker();
            s.feed(Event::Exited(f, "signal 6".into()));
            assert!(matches!(s.submit(9, 1)[0], Action::Reject(9, CallError::Unavailable(_))));
            s.advance(secs(31));
        }
        let f = s.worker();
        assert!(s.log.contains(&Action::Spawn(f, Role::Fallback)));
        s.ready_and_healthy(1);
        s.submit(10, 1);
        assert_eq!(s.feed(Event::Done(f, 10)), [Action::Deliver(10)]);
    }

    #[test]
    fn after_the_health_call_a_hang_is_detected_within_max_1s_4x_expected_and_big_calls_scale_by_rows() {
        let mut s = Sim::new(healthy_policy());
        // Nothing known yet: the health call gets the load allowance.
        let w = s.worker();
        s.feed(Event::Ready(w));
        assert_eq!(s.sup.health_deadline(), secs(60));
        s.now += ms(2);
        s.feed(Event::Done(w, HEALTH_CALL));
        assert_eq!(s.sup.deadline(1), secs(1));
        // Six one-question calls at 200 ms, then an 8-question call at 200 ms per row: not killed.
        s.one_row_calls(w, 1..=6, ms(200));
        assert_eq!(s.sup.deadline(1), ms(800).max(secs(1)));
        s.submit(7, 8);
        let a = s.advance(ms(1600));
        assert!(!a.iter().any(|x| matches!(x, Action::Kill(_))), "{a:?}");
        assert_eq!(s.feed(Event::Done(w, 7)), [Action::Deliver(7)]);
        // A hang on a one-question call is detected at max(1 s, 4 x 200 ms).
        s.submit(8, 1);
        let a = s.advance(ms(999));
        assert!(a.is_empty(), "{a:?}");
        assert!(s.advance(ms(2)).contains(&Action::Kill(w)));
        // expected_ms seeds the estimate before samples exist.
        let s = Sim::new(Policy { expected_per_row: Some(ms(500)), ..healthy_policy() });
        assert_eq!(s.sup.deadline(3), secs(6));
        // The health call's first row is the worker's first inference: the load allowance; the
        // second row gets a row's deadline (issue #31: the allowance is a row's, not the call's).
        assert_eq!(s.sup.health_deadline(), secs(60) + secs(2));
    }

    #[test]
    fn an_expired_call_never_reaches_the_worker_and_the_queue_is_bounded() {
        let mut s = Sim::new(Policy { queue_limit: 3, ..healthy_policy() });
        s.ready_and_healthy(1);
        let w = s.worker();
        s.submit(1, 1);
        let soon = Some(s.now + ms(100));
        s.feed(Event::Submit { call: 2, rows: 1, deadline: soon, alone: false });
        s.feed(Event::Submit { call: 3, rows: 1, deadline: soon, alone: false });
        assert_eq!(s.sup.in_flight(), 3);
        assert!(matches!(s.submit(4, 1)[0], Action::Reject(4, CallError::Overloaded(_))));
        s.now += ms(200);
        // The tick drops the expired calls from the queue; the running one is not affected.
        let a = s.feed(Event::Tick);
        assert_eq!(a, [Action::Reject(2, CallError::Expired), Action::Reject(3, CallError::Expired)]);
        assert_eq!(s.sup.in_flight(), 1);
        s.feed(Event::Submit { call: 5, rows: 1, deadline: Some(s.now + ms(10)), alone: false });
        s.submit(6, 1);
        s.now += ms(50);
        // Call 5 expired while call 1 ran: it is refused, call 6 goes to the worker.
        let a = s.feed(Event::Done(w, 1));
        assert_eq!(a[..3], [Action::Deliver(1), Action::Reject(5, CallError::Expired), Action::Send(w, vec![6])]);
        // A caller that went away: its queued call is dropped too.
        s.submit(7, 1);
        s.feed(Event::Cancelled(7));
        assert_eq!(s.sup.in_flight(), 1);
        assert!(matches!(
            s.feed(Event::Submit { call: 8, rows: 1, deadline: Some(s.now), alone: false })[0],
            Action::Reject(8, CallError::Expired)
        ));
    }

    #[test]
    fn requests_that_kill_the_worker_twice_are_quarantined_and_count_once() {
        let mut s = Sim::new(Policy { max_restarts: 5, ..healthy_policy() });
        s.ready_and_healthy(1);
        // Three poisonous requests: each crashes its worker twice.
        for call in 1..=3 {
            s.submit(call, 1);
            for attempt in 0..2 {
                let w = s.worker();
                let a = s.feed(Event::Exited(w, "signal 9".into()));
                if attempt == 1 {
                    assert!(a.iter().any(|x| matches!(x, Action::Reject(c, CallError::Quarantined(_)) if *c == call)));
                }
                // Past the backoff, well inside `ready_wait` (the question waits for the worker).
                s.advance(secs(1));
                s.ready_and_healthy(1);
            }
        }
        assert!(!s.sup.degraded(), "3 quarantined requests count 3 restarts, not 6");
        assert_eq!(s.sup.restart_counts()["crash"], 6);
        s.submit(4, 1);
        assert_eq!(s.feed(Event::Done(s.worker(), 4)), [Action::Deliver(4)]);
    }

    #[test]
    fn a_fatal_errors_code_name_and_message_travel_to_the_restart_and_the_refusal() {
        let mut s = Sim::new(Policy { max_restarts: 0, ..healthy_policy() });
        s.ready_and_healthy(1);
        s.submit(1, 1);
        let message = "rknn_run: RKNN_ERR_TIMEOUT (-7): the NPU timed out".to_owned();
        let a = s.feed(Event::Failed(s.worker(), 1, BackendError::Fatal { code: Some(-7), message: message.clone() }));
        let reason = RestartReason::Fatal { code: Some(-7), message: message.clone() };
        assert!(a.contains(&Action::Restarted(Role::Primary, reason.clone())), "{a:?}");
        assert_eq!(reason.name().as_deref(), Some("RKNN_ERR_TIMEOUT"));
        assert_eq!(RestartReason::Fatal { code: Some(3), message: "x (3)".into() }.name(), None);
        let degraded = a.iter().find_map(|x| match x {
            Action::Notify(n) if n.kind == NoticeKind::BackendDegraded => Some(n.clone()),
            _ => None,
        });
        assert_eq!(degraded.and_then(|n| n.reason), Some(reason));
        match s.submit(2, 1).as_slice() {
            [Action::Reject(2, CallError::Unavailable(m))] => assert!(m.contains("the NPU timed out"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_worker_that_never_becomes_ready_is_restarted() {
        let mut s = Sim::new(Policy { startup_timeout: secs(10), ..Policy::default() });
        let w = s.worker();
        let a = s.advance(secs(11));
        assert!(a.contains(&Action::Kill(w)), "{a:?}");
        assert!(matches!(s.sup.restart_counts().get("load_failed"), Some(1)));
    }

    #[test]
    fn the_deadline_follows_recent_calls_within_its_bounds() {
        let mut s = Sim::new(Policy::default());
        let w = s.worker();
        s.feed(Event::Ready(w));
        assert_eq!(s.sup.deadline(1), secs(30));
        s.one_row_calls(w, 1..=20, ms(500));
        assert_eq!(s.sup.deadline(1), secs(2));
        s.one_row_calls(w, 21..=30, ms(10));
        // 4 x p99 is still the 500 ms rows' 2 s; fast calls alone would clamp at 1 s.
        assert_eq!(s.sup.deadline(1), secs(2));
        assert_eq!(s.sup.deadline(4), secs(8));
    }

    #[test]
    fn a_primary_running_three_rows_side_by_side_is_timed_per_round_so_a_one_row_call_keeps_a_jobs_deadline() {
        // An NPU job takes 600 ms; three contexts run three rows in one job's time.
        let mut s = Sim::new(Policy { primary_parallel: 3, ..healthy_policy() });
        let w = s.worker();
        s.ready_and_healthy(600); // the two health rows ran side by side: one job
        for call in 1..=10 {
            s.submit(call, 3);
            s.now += ms(600);
            s.feed(Event::Done(w, call));
        }
        // Per-row times of 200 ms would give a one-row call 800 ms, less than two jobs'
        // margin; per round, it gets 4 x 600 ms.
        assert_eq!(s.sup.deadline(1), ms(2400));
        assert!(s.sup.deadline(3) >= ms(2400));
    }

    fn policy_of(s: &Sim) -> Policy {
        s.sup.policy.clone()
    }

    fn merging_policy() -> Policy {
        Policy { merge_rows: 4, fixed_deadline: Some(secs(2)), ..healthy_policy() }
    }

    /// The calls of the batches sent, in order.
    fn sends(actions: &[Action]) -> Vec<Vec<CallId>> {
        actions.iter().filter_map(|a| if let Action::Send(_, c) = a { Some(c.clone()) } else { None }).collect()
    }

    /// Answers every batch the worker `w` gets until none is left; returns the batches.
    fn answer_all(s: &mut Sim, w: WorkerId, first: Vec<Action>) -> Vec<Vec<CallId>> {
        let mut batches = sends(&first);
        let mut i = 0;
        while i < batches.len() {
            let a = s.feed(Event::Done(w, batches[i][0]));
            batches.extend(sends(&a));
            i += 1;
        }
        batches
    }

    #[test]
    fn calls_queued_behind_a_busy_worker_go_together_in_queue_order_up_to_the_row_cap() {
        let mut s = Sim::new(merging_policy());
        s.ready_and_healthy(1);
        let w = s.worker();
        assert_eq!(sends(&s.submit(1, 1)), [vec![1]]);
        for (call, rows) in [(2, 1), (3, 2), (4, 1), (5, 1)] {
            assert_eq!(sends(&s.submit(call, rows)), Vec::<Vec<CallId>>::new());
        }
        assert_eq!((s.sup.in_flight(), s.sup.queued()), (5, 4));
        // Call 1 answered: calls 2, 3 and 4 (four rows, the cap) go as one batch, under the
        // deadline of four rows; call 5 waits.
        let a = s.feed(Event::Done(w, 1));
        assert_eq!(a[..2], [Action::Deliver(1), Action::Send(w, vec![2, 3, 4])]);
        assert!(
            a.iter().any(|x| matches!(x, Action::SetTimer(t, d) if t.kind == TimerKind::Deadline && *d == secs(8)))
        );
        assert_eq!((s.sup.in_flight(), s.sup.queued(), s.sup.state()), (4, 1, WorkerState::Busy(2)));
        // The batch's answer is each call's, in order; then call 5.
        s.now += ms(300);
        let a = s.feed(Event::Done(w, 2));
        assert_eq!(a[..4], [Action::Deliver(2), Action::Deliver(3), Action::Deliver(4), Action::Send(w, vec![5])]);
        assert_eq!(s.sup.in_flight(), 1);
        // One call's answer for another call's id is not the batch's.
        assert_eq!(s.feed(Event::Done(w, 3)), []);
        assert_eq!(s.feed(Event::Done(w, 5)), [Action::Deliver(5)]);
        // A call larger than the cap still runs (alone, as any call may).
        s.submit(6, 1);
        s.submit(7, 9);
        s.submit(8, 1);
        assert_eq!(answer_all(&mut s, w, Vec::new()), Vec::<Vec<CallId>>::new());
        let a = s.feed(Event::Done(w, 6));
        assert_eq!(sends(&a), [vec![7]]);
        assert_eq!(answer_all(&mut s, w, a), [vec![7], vec![8]]);
    }

    #[test]
    fn the_fallback_and_a_policy_without_merging_run_one_call_at_a_time() {
        for policy in [Policy { merge_rows: 1, ..merging_policy() }, Policy { fallback: true, ..merging_policy() }] {
            let fallback = policy.fallback;
            let mut s = Sim::new(policy);
            if fallback {
                s.sup.degraded = Some(Degraded { cause: "test".into(), next_try: s.now + secs(300) });
                let w = s.worker();
                s.feed(Event::Exited(w, "signal 9".into()));
                s.advance(secs(1));
                assert_eq!(s.sup.role(), Role::Fallback);
            }
            s.ready_and_healthy(1);
            let w = s.worker();
            let first = s.submit(1, 1);
            s.submit(2, 1);
            s.submit(3, 1);
            assert_eq!(answer_all(&mut s, w, first), [vec![1], vec![2], vec![3]], "fallback {fallback}");
        }
    }

    #[test]
    fn a_poison_call_merged_with_two_good_ones_is_isolated_through_a_hang_and_a_crash_during_recovery() {
        let mut s = Sim::new(Policy { max_restarts: 4, ..merging_policy() });
        s.ready_and_healthy(1);
        let w = s.worker();
        s.submit(1, 1);
        // Poison 2 queued with the good calls 3 and 4: they go as one batch, which hangs.
        for call in 2..=4 {
            s.submit(call, 1);
        }
        assert_eq!(sends(&s.feed(Event::Done(w, 1))), [vec![2, 3, 4]]);
        let a = s.advance(secs(6) + ms(1));
        assert!(a.contains(&Action::Kill(w)), "{a:?}");
        assert!(!a.iter().any(|x| matches!(x, Action::Reject(..))), "nobody is refused for a merged failure: {a:?}");
        assert_eq!((s.sup.in_flight(), s.sup.queued()), (3, 3));
        // A crash during recovery: the new worker dies before it is ready. Nobody is blamed.
        s.advance(ms(100));
        let a = s.feed(Event::Exited(s.worker(), "signal 11".into()));
        assert!(!a.iter().any(|x| matches!(x, Action::Reject(..) | Action::Send(..))), "{a:?}");
        s.advance(ms(200));
        // The next worker runs the calls alone, in their order: the poison hangs again, alone.
        let a = s.ready_and_healthy(1);
        assert_eq!(sends(&a), [vec![2]]);
        let a = s.advance(secs(2) + ms(1));
        assert!(a.iter().any(|x| matches!(x, Action::Kill(_))), "{a:?}");
        s.advance(secs(1));
        // Its second failure alone quarantines it (a crash this time); the others are answered.
        assert_eq!(sends(&s.ready_and_healthy(1)), [vec![2]]);
        let a = s.feed(Event::Exited(s.worker(), "signal 9".into()));
        assert!(a.iter().any(|x| matches!(x, Action::Reject(2, CallError::Quarantined(_)))), "{a:?}");
        // A crash of call 3 alone (the runtime's, say) is its first failure, not its second: the
        // merged hang was not counted against it.
        s.advance(secs(2));
        assert_eq!(sends(&s.ready_and_healthy(1)), [vec![3]]);
        let a = s.feed(Event::Exited(s.worker(), "signal 11".into()));
        assert!(!a.iter().any(|x| matches!(x, Action::Reject(..))), "{a:?}");
        s.advance(secs(2));
        let w = s.worker();
        let first = s.ready_and_healthy(1);
        assert_eq!(answer_all(&mut s, w, first), [vec![3], vec![4]]);
        assert!(s.log.contains(&Action::Deliver(3)) && s.log.contains(&Action::Deliver(4)));
        // Four restarts counted (the merged hang, the crash while starting, the poison's first
        // hang alone, call 3's crash); the poison's second failure is its own. Not degraded.
        assert!(!s.sup.degraded());
        assert_eq!(s.sup.in_flight(), 0);
        assert!(!s.log.iter().any(|x| matches!(x, Action::Reject(3 | 4, _))), "{:?}", s.log);
    }

    #[test]
    fn a_row_the_model_refuses_fails_only_its_own_call_of_a_merged_batch() {
        let mut s = Sim::new(merging_policy());
        s.ready_and_healthy(1);
        let w = s.worker();
        s.submit(1, 1);
        for call in 2..=4 {
            s.submit(call, 1);
        }
        assert_eq!(sends(&s.feed(Event::Done(w, 1))), [vec![2, 3, 4]]);
        // The worker reports one error for the whole batch: each call runs again alone.
        let a = s.feed(Event::Failed(w, 2, BackendError::Input("token 99999 out of range".into())));
        assert_eq!(sends(&a), [vec![2]]);
        assert!(!a.iter().any(|x| matches!(x, Action::Reject(..))), "{a:?}");
        assert_eq!(s.feed(Event::Done(w, 2))[..2], [Action::Deliver(2), Action::Send(w, vec![3])]);
        let a = s.feed(Event::Failed(w, 3, BackendError::Input("token 99999 out of range".into())));
        assert_eq!(
            a[..2],
            [Action::Reject(3, CallError::Input("token 99999 out of range".into())), Action::Send(w, vec![4])]
        );
        assert_eq!(s.feed(Event::Done(w, 4)), [Action::Deliver(4)]);
        // A transient error of a merged batch: the same, and no call loses its retry to it.
        for call in 5..=7 {
            s.submit(call, 1);
        }
        s.submit(8, 1);
        assert_eq!(sends(&s.feed(Event::Done(w, 5))), [vec![6, 7, 8]]);
        assert_eq!(sends(&s.feed(Event::Failed(w, 6, BackendError::Transient("ssr".into())))), [vec![6]]);
        assert_eq!(sends(&s.feed(Event::Failed(w, 6, BackendError::Transient("ssr".into())))), [vec![6]]);
        assert_eq!(sends(&s.feed(Event::Done(w, 6))), [vec![7]]);
        assert!(s.sup.restart_counts().is_empty());
        assert_eq!(s.sup.state(), WorkerState::Busy(7));
    }

    #[test]
    fn cancelled_expired_and_probe_calls_are_never_merged() {
        let mut s = Sim::new(merging_policy());
        s.ready_and_healthy(1);
        let w = s.worker();
        s.submit(1, 1);
        s.submit(2, 1);
        s.submit(3, 1);
        s.feed(Event::Submit { call: 4, rows: 1, deadline: Some(s.now + ms(50)), alone: false });
        s.submit(5, 1);
        s.feed(Event::Submit { call: 6, rows: 1, deadline: None, alone: true }); // the probe
        s.submit(7, 1);
        // The caller of call 3 went away; call 4's deadline passes while call 1 runs.
        s.feed(Event::Cancelled(3));
        s.now += ms(100);
        let a = s.feed(Event::Done(w, 1));
        assert_eq!(a[..3], [Action::Deliver(1), Action::Reject(4, CallError::Expired), Action::Send(w, vec![2, 5])]);
        // The probe runs alone, and what follows it after it.
        let a = s.feed(Event::Done(w, 2));
        assert_eq!(answer_all(&mut s, w, a), [vec![6], vec![7]]);
        // The driver finds a caller gone as it is about to send a batch: the batch is sent
        // again without it, and the worker is not left waiting for a frame never sent.
        s.submit(8, 1);
        s.submit(9, 1);
        s.submit(10, 1);
        s.submit(11, 1);
        assert_eq!(sends(&s.feed(Event::Done(w, 8))), [vec![9, 10, 11]]);
        let a = s.feed(Event::Cancelled(10));
        assert_eq!(sends(&a), [vec![9, 11]]);
        assert_eq!(s.sup.in_flight(), 2);
        assert_eq!(s.feed(Event::Done(w, 9)), [Action::Deliver(9), Action::Deliver(11)]);
    }

    #[test]
    fn a_merged_batch_on_three_contexts_is_timed_per_round() {
        let mut s = Sim::new(Policy { primary_parallel: 3, merge_rows: 64, ..healthy_policy() });
        let w = s.worker();
        s.ready_and_healthy(600);
        // Six one-row calls at a time, answered together in two rounds of 600 ms.
        let mut call = 0;
        for _ in 0..5 {
            let first = call + 1;
            for _ in 0..7 {
                call += 1;
                s.submit(call, 1);
            }
            s.now += ms(600);
            s.feed(Event::Done(w, first));
            s.now += ms(1200);
            let a = s.feed(Event::Done(w, first + 1));
            assert!(a.starts_with(&[Action::Deliver(first + 1)]) && a.len() == 6, "{a:?}");
        }
        assert_eq!(s.sup.deadline(1), ms(2400));
    }

    #[test]
    fn with_concurrent_callers_an_idle_primary_waits_briefly_to_fill_a_round_of_its_contexts() {
        let policy = Policy { primary_parallel: 3, merge_rows: 64, gather: ms(50), ..healthy_policy() };
        let mut s = Sim::new(policy);
        let w = s.worker();
        s.ready_and_healthy(600);
        // One caller at a time: sent at once, never held back.
        assert_eq!(sends(&s.submit(1, 1)), [vec![1]]);
        s.feed(Event::Done(w, 1));
        assert_eq!(sends(&s.submit(2, 1)), [vec![2]]);
        // Calls queue behind a busy worker: callers are concurrent. When it is free with two
        // rows queued (a round is three), it waits for a third...
        s.submit(3, 1);
        s.submit(4, 1);
        let a = s.feed(Event::Done(w, 2));
        assert!(
            sends(&a).is_empty()
                && a.iter().any(|x| matches!(x, Action::SetTimer(t, _) if t.kind == TimerKind::Gather))
        );
        assert_eq!(s.sup.state(), WorkerState::Idle);
        // ... which comes: the round is full and goes at once.
        assert_eq!(sends(&s.submit(5, 1)), [vec![3, 4, 5]]);
        s.now += ms(600);
        s.feed(Event::Done(w, 3));
        // Next time nobody comes within the window: what is there goes, and a lone caller is
        // not held back again.
        assert!(sends(&s.submit(6, 1)).is_empty());
        assert_eq!(sends(&s.advance(ms(49))), Vec::<Vec<CallId>>::new());
        assert_eq!(sends(&s.advance(ms(1))), [vec![6]]);
        s.feed(Event::Done(w, 6));
        assert_eq!(sends(&s.submit(7, 1)), [vec![7]]);
        // A probe (alone) waiting ends the wait: nothing is held back behind it.
        s.submit(8, 1);
        assert!(sends(&s.feed(Event::Done(w, 7))).is_empty());
        let a = s.feed(Event::Submit { call: 9, rows: 1, deadline: None, alone: true });
        assert_eq!(sends(&a), [vec![8]]);
        assert_eq!(sends(&s.feed(Event::Done(w, 8))), [vec![9]]);
        // The window is at most a tenth of the per-row estimate.
        let mut s = Sim::new(Policy { gather: ms(50), expected_per_row: Some(ms(100)), ..policy_of(&s) });
        let w = s.worker();
        s.ready_and_healthy(100);
        s.submit(1, 1);
        s.submit(2, 1);
        s.feed(Event::Done(w, 1));
        assert_eq!(sends(&s.advance(ms(10))), [vec![2]]);
    }

    fn only_the_wait_timer(actions: &[Action]) -> bool {
        matches!(actions, [Action::SetTimer(t, _)] if t.kind == TimerKind::Wait)
    }

    fn notices(actions: &[Action], kind: NoticeKind) -> Vec<Notice> {
        actions
            .iter()
            .filter_map(|a| if let Action::Notify(n) = a { Some(n.clone()) } else { None })
            .filter(|n| n.kind == kind)
            .collect()
    }

    /// The latest worker reports ready and gets its health call, which then hangs.
    fn ready_and_hanging(s: &mut Sim) -> WorkerId {
        let w = s.worker();
        let a = s.feed(Event::Ready(w));
        assert!(a.contains(&Action::Health(w)), "{a:?}");
        w
    }

    #[test]
    fn a_primary_hanging_in_every_health_call_without_a_fallback_refuses_within_ready_wait_and_degrades_after_three() {
        // The agent's defaults: a 60 s load allowance, 5 restarts in 300 s, 3 failed health
        // calls in a row, questions wait 20 s for a backend that is not serving.
        let mut s = Sim::new(healthy_policy());
        ready_and_hanging(&mut s);
        assert!(only_the_wait_timer(&s.submit(1, 1)));
        // The question is not left in silence: refused after 20 s, with what is going on.
        let a = s.advance(secs(20));
        match a.as_slice() {
            [Action::Reject(1, CallError::Unavailable(m))] => {
                assert!(
                    m.contains("not ready after 20 s") && m.contains("health call has been running for 20 s"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
        let mut kills = 0;
        let mut degraded = Vec::new();
        // Each worker's first row has the 60 s allowance; the third failure in a row degrades,
        // far inside a window where five restarts would never fit.
        for i in 0..3 {
            let a = s.advance(secs(40 + u64::from(i > 0) * 20));
            kills += a.iter().filter(|x| matches!(x, Action::Kill(_))).count();
            degraded.extend(notices(&a, NoticeKind::BackendDegraded));
            if i < 2 {
                s.advance(secs(1));
                ready_and_hanging(&mut s);
            }
        }
        assert_eq!(kills, 3);
        assert_eq!(degraded.len(), 1, "{:?}", s.log);
        assert!(s.sup.degraded());
        match s.submit(2, 1).as_slice() {
            [Action::Reject(2, CallError::Unavailable(m))] => assert!(
                m.contains("3 failed health calls in a row") && m.contains("missed its deadline (60000 ms)"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
        // The retry's candidate passes: recovered, and its health call reset the count.
        s.advance(secs(300));
        s.ready_and_healthy(5);
        assert!(!s.sup.degraded());
        assert_eq!(s.sup.failed_health, 0);
    }

    #[test]
    fn a_primary_hanging_in_its_health_calls_hands_questions_to_the_fallback_and_recovers_once_a_candidate_passes() {
        let mut s = Sim::new(Policy { fallback: true, primary_retry: secs(60), ..healthy_policy() });
        let first = ready_and_hanging(&mut s);
        s.submit(1, 1);
        // After 20 s of waiting the fallback is started; the primary goes on as the candidate.
        let a = s.advance(secs(20));
        let fallback = s.worker();
        assert!(a.contains(&Action::Spawn(fallback, Role::Fallback)) && !a.contains(&Action::Kill(first)), "{a:?}");
        assert_eq!(notices(&a, NoticeKind::BackendDegraded).len(), 1);
        assert_eq!(s.sup.backend_state(), BackendState::Degraded);
        let a = s.ready_and_healthy(5);
        assert_eq!(sends(&a), [vec![1]]);
        assert_eq!(s.feed(Event::Done(fallback, 1)), [Action::Deliver(1)]);
        // The candidate's allowance runs out 60 s after its health call started: it alone is
        // killed, the fallback serves on.
        let a = s.advance(secs(40));
        assert!(a.contains(&Action::Kill(first)) && !a.contains(&Action::Kill(fallback)), "{a:?}");
        s.submit(2, 1);
        assert_eq!(s.feed(Event::Done(fallback, 2)), [Action::Deliver(2)]);
        // The retry's candidate hangs too: still degraded, the fallback still serves.
        let a = s.advance(secs(60));
        let candidate = s.worker();
        assert!(a.contains(&Action::Spawn(candidate, Role::Primary)), "{a:?}");
        ready_and_hanging(&mut s);
        let a = s.advance(secs(60));
        assert!(a.contains(&Action::Kill(candidate)) && !a.contains(&Action::Kill(fallback)), "{a:?}");
        assert!(s.sup.degraded());
        s.submit(3, 1);
        assert_eq!(s.feed(Event::Done(fallback, 3)), [Action::Deliver(3)]);
        // The next one passes: it takes over.
        s.advance(secs(60));
        let a = s.ready_and_healthy(5);
        assert_eq!(notices(&a, NoticeKind::BackendRecovered).len(), 1, "{a:?}");
        assert!(a.contains(&Action::Kill(fallback)));
        assert_eq!((s.sup.role(), s.sup.backend_state()), (Role::Primary, BackendState::Ready));
    }

    #[test]
    fn a_health_call_that_makes_progress_outlasts_its_load_allowance_and_a_hang_after_progress_is_still_caught() {
        // A CPU fallback's health call with a bundle's probe: 36 rows of 1 s, a 3 s allowance.
        let policy = Policy { health_rows: 36, load_allowance: secs(3), ..Policy::default() };
        let mut s = Sim::new(policy.clone());
        let w = ready_and_hanging(&mut s);
        for done in 1..36 {
            let a = s.advance(secs(1));
            assert!(!a.iter().any(|x| matches!(x, Action::Kill(_))), "row {done}: {a:?}");
            s.feed(Event::Progress(w, HEALTH_CALL, done, 36));
        }
        s.now += secs(1);
        s.feed(Event::Done(w, HEALTH_CALL));
        assert_eq!(s.sup.backend_state(), BackendState::Ready);
        assert!(s.sup.restart_counts().is_empty());
        // Its rows seeded the estimate: 1 s a row, a one-row call gets 4 s.
        assert_eq!(s.sup.deadline(1), secs(4));
        // A worker that stops after ten rows is killed at 4 x its rate x the rows left (26 x
        // 4 s), not left to run; without progress at all, at the allowance.
        let mut s = Sim::new(policy);
        let w = ready_and_hanging(&mut s);
        for done in 1..=10 {
            s.advance(secs(1));
            s.feed(Event::Progress(w, HEALTH_CALL, done, 36));
        }
        assert!(s.advance(secs(26 * 4) - ms(1)).is_empty());
        let a = s.advance(ms(2));
        assert!(a.contains(&Action::Kill(w)), "{a:?}");
        // Frames that do not move forward are no progress.
        let before = s.sup.restart_counts()["deadline"];
        s.advance(secs(1));
        let w = ready_and_hanging(&mut s);
        s.advance(secs(2));
        s.feed(Event::Progress(w, HEALTH_CALL, 0, 36));
        s.feed(Event::Progress(w, HEALTH_CALL, 40, 36));
        s.feed(Event::Progress(w, 99, 5, 36));
        assert!(s.advance(ms(1001)).contains(&Action::Kill(w)));
        assert_eq!(s.sup.restart_counts()["deadline"], before + 1);
    }

    #[test]
    fn a_worker_slowed_by_contention_that_shows_progress_is_not_killed_and_a_real_hang_is_caught_within_a_second() {
        let mut s = Sim::new(healthy_policy());
        let w = s.worker();
        s.ready_and_healthy(20);
        s.one_row_calls(w, 1..=10, ms(100));
        assert_eq!(s.sup.deadline(1), secs(1));
        // Contention: one-row calls take 2.2 s (22 layers of 100 ms), twice their deadline,
        // with a sign after each layer.
        for call in 11..=16 {
            s.submit(call, 1);
            for layer in 1..22 {
                assert!(s.advance(ms(100)).is_empty(), "call {call}, layer {layer}");
                s.feed(Event::Progress(w, call, layer, 22));
            }
            s.now += ms(100);
            assert_eq!(s.feed(Event::Done(w, call)), [Action::Deliver(call)]);
        }
        assert!(s.sup.restart_counts().is_empty() && !s.sup.degraded());
        // A real hang (no sign at all) of a fresh worker is still caught at 1 s.
        let mut s = Sim::new(healthy_policy());
        let w = s.worker();
        s.ready_and_healthy(20);
        s.one_row_calls(w, 1..=10, ms(100));
        s.submit(11, 1);
        assert!(s.advance(ms(999)).is_empty());
        assert!(s.advance(ms(2)).contains(&Action::Kill(w)));
    }

    #[test]
    fn the_fallback_is_timed_by_its_own_rows_not_by_the_primarys() {
        let mut s = Sim::new(Policy { fallback: true, max_restarts: 0, ..healthy_policy() });
        let w = s.worker();
        s.ready_and_healthy(20);
        s.one_row_calls(w, 1..=10, ms(10));
        assert_eq!(s.sup.deadline(1), secs(1));
        s.feed(Event::Exited(w, "signal 11".into()));
        assert_eq!(s.sup.role(), Role::Fallback);
        // The CPU's health call: two rows of 2 s each; its calls get 4 x 2 s, not the NPU's 1 s.
        s.ready_and_healthy(4000);
        assert_eq!(s.sup.deadline(1), secs(8));
    }

    #[test]
    fn stale_timers_are_ignored() {
        let mut s = Sim::new(Policy { fixed_deadline: Some(secs(1)), ..healthy_policy() });
        s.ready_and_healthy(1);
        let w = s.worker();
        s.submit(1, 1);
        s.feed(Event::Done(w, 1));
        s.submit(2, 1);
        // An old deadline timer fires while call 2 runs fine: nothing happens.
        let old = Timer { kind: TimerKind::Deadline, generation: 1 };
        assert_eq!(s.feed(Event::Timer(old)), []);
    }
}
