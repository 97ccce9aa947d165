//! The supervisor's vocabulary: what it is told ([`Event`]), what it asks for ([`Action`]), its
//! timers, what it publishes ([`Notice`]), why a worker restarts, and the states it reports.
//!
//! Kept apart from the state machine so the driver, the service and the tests read the protocol
//! between them without the lifecycle logic.

use std::time::{Duration, Instant};

use crate::backend::{BackendError, LoadError};
use crate::engine::EngineError;

/// Identifies one call (a batch of rows) for the life of the engine.
pub type CallId = u64;

/// Identifies one worker process for the life of the engine.
pub type WorkerId = u64;

/// The call id of a worker's health call (real calls start at 1).
pub const HEALTH_CALL: CallId = 0;

/// Who asked for a call, as the engine's caller names it (the service: one per client that asks
/// questions); the call queue takes askers' calls in turn, so one asker's many calls cannot hold
/// back another's (`calls.rs`). An opaque number: the engine only compares them. Calls that name
/// no one (the command line, the probe) share [`Asker::default`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Asker(pub u64);

// Which backend a worker runs, and the backend's state as clients see it: the wire's own types
// (laya-topics), so the engine and its clients share one enum each.
pub use laya_topics::wire::{BackendState, Role};

/// Why a worker was restarted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestartReason {
    /// A call missed its deadline (the deadline it had).
    Deadline(Duration),
    /// The process exited or crashed (how).
    Crash(String),
    /// The backend reported a fatal error: its code, if any, and its message.
    Fatal { code: Option<i64>, message: String },
    /// The backend could not be loaded (its kind says whether the vendor runtime was refused),
    /// did not become ready in time, or failed its health call.
    LoadFailed(LoadError),
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
    /// Time for the serving worker to run the bundle's probe again (`probe_every`).
    Probe,
}

/// What happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Start the first worker.
    Start,
    /// A call was queued: its rows, what they cost (`units`, [`Size`](super::Size): a row on a
    /// graph twice the shortest's counts 2; at most `rows`: one each), the caller's deadline,
    /// whether it is the periodic probe (asked for by [`Action::Probe`]: it runs alone, never
    /// merged with questions, and one at a time), and who asked.
    Submit { call: CallId, rows: usize, units: f64, deadline: Option<Instant>, probe: bool, asker: Asker },
    /// The caller of a call went away (or the driver found it gone before sending it).
    Cancelled(CallId),
    /// A worker loaded its backend.
    Ready(WorkerId),
    /// A worker could not load its backend (or could not be started).
    LoadFailed(WorkerId, LoadError),
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
    /// Answer this call with an error (never [`EngineError::Stopped`]: that is the handle's).
    Reject(CallId, EngineError),
    /// A restart happened (for counters).
    Restarted(Role, RestartReason),
    /// Publish this on the events topic (and log it).
    Notify(Notice),
    /// Queue the bundle's probe on whichever worker serves, as a call of its own
    /// ([`Event::Submit`] with `probe`).
    Probe,
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
