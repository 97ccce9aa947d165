//! Supervision of the worker processes, as a state machine without I/O.
//!
//! NPU runtimes hang and crash, and a thread stuck in a vendor call cannot be cancelled, so the
//! backend lives in a worker process the agent can kill. This module decides *what* to do; the
//! driver (`engine::driver`) does it. Every input is an [`Event`] with the current time, every
//! output an [`Action`], so the policy is tested without processes or clocks (`tests.rs`).
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
//! Calls queued together run together, at most `merge_rows` rows, the most one request may hold
//! (`calls.rs`). A failure of a merged batch (crash, deadline, fatal, transient or input error)
//! is nobody's in particular: its calls run again *alone*, their attempts unchanged, so only a
//! failure of a call alone counts against it (a poison call is isolated and quarantined, its
//! neighbours answered), and a row the model refuses fails only its own call. Health and probe
//! calls are never merged with questions. The bundle's probe runs in every health call and,
//! every `probe_every`, as a call of its own on the serving worker ([`Action::Probe`]; one at a
//! time, never on a worker still starting).
//!
//! Deadlines are per row, a row counted by its graph's length (`deadline.rs`). The health call
//! (two different rows, after "loaded" and before any question) gets the load allowance for its
//! first row (every worker's first inference) and a row's deadline for each other row (with
//! nothing known, the allowance is the whole call's). Progress frames from the worker restart
//! the running call's deadline for the work left, at the larger of the estimate and the call's
//! own rate: a slow worker that is getting on is not killed, a hung one sends nothing and is
//! caught as before.
//!
//! Nothing waits unbounded: `max_failed_health` failed health calls in a row degrade the primary
//! whatever the window, and a question that waited `ready_wait` for a worker that is not
//! serving gets the fallback (the primary going on beside it as the candidate) or, without
//! one, a refusal with the cause.

mod calls;
mod deadline;
mod events;
mod lifecycle;
mod policy;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::backend::{BackendError, LoadError};
use crate::engine::EngineError;
use calls::{Call, CallQueue, Gather, Retry};
use deadline::{Estimator, Size};
pub use events::{
    Action, Asker, BackendState, CallId, Event, HEALTH_CALL, Notice, NoticeKind, RestartReason, Role, Timer, TimerKind,
    WorkerId, WorkerState,
};
pub use policy::Policy;

/// A worker the supervisor knows: the serving one, or the candidate primary.
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
    /// The size of the current call (or health call).
    size: Size,
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

#[derive(Debug, Clone)]
struct Degraded {
    /// The failure that degraded the primary, or the last failed try.
    cause: String,
    next_try: Instant,
}

/// Whether an event concerned something live. One that did not (a stale timer, a frame from a
/// worker that was replaced, an answer to a call it does not run) changes nothing, not even the
/// `Wait` timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handled {
    Live,
    Stale,
}

/// The supervisor.
///
/// Design: as rumqttc's `MqttState`, one method per input. [`Supervisor::handle`] dispatches
/// each [`Event`] to its `on_*` method (`on_submit`, `on_ready`, `on_done`, `on_failed`,
/// `on_progress`, `on_exited`, `on_timer`, `on_tick`, ...), which changes the state and pushes
/// the [`Action`]s the driver must perform, in order; the lifecycle steps they share (`dispatch`,
/// `healthy`, `failed`, `degrade`) follow them. Nothing here does I/O or reads a clock: `now`
/// comes with every event, and timers are actions whose firing comes back as an event, told
/// apart from stale ones by their generation.
#[derive(Debug)]
pub struct Supervisor {
    policy: Policy,
    calls: CallQueue,
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
    estimator: Estimator,
    restarts: std::collections::VecDeque<Instant>,
    restart_counts: BTreeMap<&'static str, u64>,
    generation: u64,
    timers: BTreeMap<u8, u64>,
    next_worker: WorkerId,
    started: bool,
    /// The last periodic probe call; it is in progress while the queue holds it.
    probing: Option<CallId>,
}

fn timer_slot(kind: TimerKind) -> u8 {
    kind as u8
}

impl Supervisor {
    pub fn new(policy: Policy) -> Supervisor {
        Supervisor {
            backoff: policy.backoff_min,
            policy,
            calls: CallQueue::default(),
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
            estimator: Estimator::default(),
            restarts: std::collections::VecDeque::new(),
            restart_counts: BTreeMap::new(),
            generation: 0,
            timers: BTreeMap::new(),
            next_worker: 1,
            started: false,
            probing: None,
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
        self.calls.queued()
    }

    /// Calls queued or running.
    pub fn in_flight(&self) -> usize {
        self.calls.held()
    }

    /// The deadline a call of `rows` one-unit rows gets now on the worker that serves.
    #[cfg(test)]
    pub fn deadline(&self, rows: usize) -> Duration {
        self.deadline_of(Size::rows(rows))
    }

    /// The deadline a call of `size` gets now on the worker that serves.
    #[cfg(test)]
    pub fn deadline_of(&self, size: Size) -> Duration {
        self.bound(self.role(), size.rows as f64, size.units, None)
    }

    /// Feeds one event; returns what to do, in order.
    pub fn handle(&mut self, now: Instant, event: Event) -> Vec<Action> {
        let mut actions = Vec::new();
        let handled = match event {
            Event::Start => self.on_start(now, &mut actions),
            Event::Submit { call, rows, units, deadline, probe, asker } => {
                let submitted = Call { rows, units, since: now, deadline, attempt: 0, alone: probe, asker, turn: 0 };
                self.on_submit(now, call, submitted, probe, &mut actions)
            }
            Event::Cancelled(call) => self.on_cancelled(now, call, &mut actions),
            Event::Ready(id) => self.on_ready(now, id, &mut actions),
            Event::LoadFailed(id, why) => self.on_load_failed(now, id, why, &mut actions),
            Event::Exited(id, how) => self.on_exited(now, id, how, &mut actions),
            Event::Done(id, call) => self.on_done(now, id, call, &mut actions),
            Event::Progress(id, call, done, of) => self.on_progress(now, id, call, done, of, &mut actions),
            Event::Failed(id, call, error) => self.on_failed(now, id, call, error, &mut actions),
            Event::Timer(t) => self.on_timer(now, t, &mut actions),
            Event::Tick => self.on_tick(now, &mut actions),
        };
        if handled == Handled::Live {
            self.check_wait(now, &mut actions);
        }
        actions
    }

    fn on_start(&mut self, now: Instant, actions: &mut Vec<Action>) -> Handled {
        if !self.started {
            self.started = true;
            self.spawn_serving(now, actions);
            if let Some(every) = self.policy.probe_every {
                self.timer(TimerKind::Probe, every, actions);
            }
        }
        Handled::Live
    }

    fn on_submit(&mut self, now: Instant, id: CallId, call: Call, probe: bool, actions: &mut Vec<Action>) -> Handled {
        if probe {
            self.probing = Some(id);
        }
        if call.deadline.is_some_and(|d| d <= now) {
            actions.push(Action::Reject(id, EngineError::Expired));
        } else if self.degraded.is_some() && self.serving.is_none() {
            actions.push(Action::Reject(id, EngineError::Unavailable(self.unavailable(now))));
        } else if self.calls.held() >= self.policy.queue_limit.max(1) {
            let why = format!("the engine has {} calls queued or running, its limit", self.calls.held());
            actions.push(Action::Reject(id, EngineError::Overloaded(why)));
        } else {
            self.calls.submit(id, call);
            if matches!(self.state(), WorkerState::Busy(_)) {
                self.contended = true;
            }
            self.dispatch(now, actions);
        }
        Handled::Live
    }

    fn on_cancelled(&mut self, now: Instant, call: CallId, actions: &mut Vec<Action>) -> Handled {
        let running = self.calls.is_running(call);
        // Sent nowhere yet (the driver cancels before writing): the worker is free, and the rest
        // of the batch goes back to the front, to be sent without it.
        if self.calls.remove(call)
            && running
            && let Some(s) = self.serving.filter(|s| matches!(s.state, WorkerState::Busy(_)))
        {
            self.cancel_timer(TimerKind::Deadline);
            self.serving = Some(Slot { state: WorkerState::Idle, ..s });
            self.calls.requeue_running(Some(call));
            self.dispatch(now, actions);
        }
        Handled::Live
    }

    /// A worker loaded its backend: the health call, or (without one) healthy at once.
    fn on_ready(&mut self, now: Instant, id: WorkerId, actions: &mut Vec<Action>) -> Handled {
        let health = self.policy.health_rows > 0;
        let is_candidate = self.is_candidate(id);
        let role = self.slot_mut(id).map_or(Role::Primary, |s| s.role);
        let deadline = self.estimator.health_deadline(&self.policy, role);
        let size = self.policy.health_size();
        let Some(slot) = self.slot_mut(id).filter(|s| s.state == WorkerState::Starting) else { return Handled::Live };
        slot.state = WorkerState::Health;
        slot.since = now;
        slot.deadline = deadline;
        slot.due = now + deadline;
        slot.size = size;
        slot.signs = None;
        let slot = *slot;
        if !is_candidate {
            self.cancel_timer(TimerKind::Startup);
        }
        if health {
            actions.push(Action::Health(id));
            let kind = if is_candidate { TimerKind::Candidate } else { TimerKind::Deadline };
            self.timer(kind, deadline, actions);
        } else {
            self.healthy(now, slot, actions);
        }
        Handled::Live
    }

    fn on_load_failed(&mut self, now: Instant, id: WorkerId, why: LoadError, actions: &mut Vec<Action>) -> Handled {
        self.failed(now, id, RestartReason::LoadFailed(why), true, actions);
        Handled::Live
    }

    /// A worker process ended: it is reaped already, not killed.
    fn on_exited(&mut self, now: Instant, id: WorkerId, how: String, actions: &mut Vec<Action>) -> Handled {
        self.failed(now, id, RestartReason::Crash(how), false, actions);
        Handled::Live
    }

    /// A worker answered its health call, or the batch it runs.
    fn on_done(&mut self, now: Instant, id: WorkerId, call: CallId, actions: &mut Vec<Action>) -> Handled {
        let Some(slot) = self.slot_mut(id).copied() else { return Handled::Stale };
        match slot.state {
            WorkerState::Health if call == HEALTH_CALL => self.healthy(now, slot, actions),
            WorkerState::Busy(c) if c == call => {
                let elapsed = now.duration_since(slot.since);
                let (batch, size) = self.calls.finish_running();
                if size.rows > 0 {
                    let sample = elapsed.div_f64(deadline::cost(&self.policy, size, slot.role));
                    self.estimator.record(slot.role, sample);
                }
                self.cancel_timer(TimerKind::Deadline);
                self.backoff = self.policy.backoff_min;
                self.serving = Some(Slot { state: WorkerState::Idle, since: now, ..slot });
                actions.extend(batch.into_iter().map(Action::Deliver));
                self.dispatch(now, actions);
            }
            _ => {}
        }
        Handled::Live
    }

    /// A sign of progress on the running call (or health call) of worker `id`: its deadline
    /// starts again from now, for the work left, at the larger of the estimate and the rate the
    /// call has shown (from its first sign, so a first inference's cost is not the rate).
    fn on_progress(
        &mut self,
        now: Instant,
        id: WorkerId,
        call: CallId,
        done: u32,
        of: u32,
        actions: &mut Vec<Action>,
    ) -> Handled {
        let is_candidate = self.is_candidate(id);
        let Some(slot) = self.slot_mut(id).copied() else { return Handled::Live };
        // Frames are from outside: a fraction that does not move forward is no progress.
        if !runs(slot, call) || of == 0 || done > of {
            return Handled::Live;
        }
        let frac = f64::from(done) / f64::from(of);
        if slot.signs.is_some_and(|s| frac <= s.last) || frac <= 0.0 {
            return Handled::Live;
        }
        let rounds = deadline::cost(&self.policy, slot.size, slot.role);
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
        let (rows, units) = slot.size.left(frac);
        let deadline = self.bound(slot.role, rows, units, Duration::try_from_secs_f64(rate).ok());
        let kind = if is_candidate { TimerKind::Candidate } else { TimerKind::Deadline };
        if let Some(s) = self.slot_mut(id) {
            s.signs = Some(signs);
            s.deadline = deadline;
            s.due = now + deadline;
        }
        self.timer(kind, deadline, actions);
        Handled::Live
    }

    /// A worker reported an error for the call it runs (or its health call).
    fn on_failed(
        &mut self,
        now: Instant,
        id: WorkerId,
        call: CallId,
        error: BackendError,
        actions: &mut Vec<Action>,
    ) -> Handled {
        let Some(slot) = self.slot_mut(id).copied() else { return Handled::Stale };
        if !runs(slot, call) {
            return Handled::Stale;
        }
        match error {
            BackendError::Input(msg) | BackendError::Transient(msg) if slot.state == WorkerState::Health => {
                let why = format!("the health call failed: {msg}");
                self.failed(now, id, RestartReason::LoadFailed(LoadError::other(why)), true, actions);
            }
            // A merged batch failed as a whole: its calls run again alone, each for its own
            // answer or its own error (the worker reports errors per batch).
            BackendError::Input(_) | BackendError::Transient(_) if self.calls.running_len() > 1 => {
                self.cancel_timer(TimerKind::Deadline);
                self.serving = Some(Slot { state: WorkerState::Idle, ..slot });
                self.calls.split_running();
                self.dispatch(now, actions);
            }
            BackendError::Input(msg) => {
                self.cancel_timer(TimerKind::Deadline);
                self.calls.remove(call);
                self.calls.clear_running();
                self.serving = Some(Slot { state: WorkerState::Idle, ..slot });
                actions.push(Action::Reject(call, EngineError::Input(msg)));
                self.dispatch(now, actions);
            }
            BackendError::Transient(msg) => {
                self.cancel_timer(TimerKind::Deadline);
                self.calls.clear_running();
                self.serving = Some(Slot { state: WorkerState::Idle, ..slot });
                match self.calls.retry(call) {
                    Retry::Again => {}
                    Retry::Spent | Retry::Gone => actions.push(Action::Reject(call, EngineError::Unavailable(msg))),
                }
                self.dispatch(now, actions);
            }
            BackendError::Fatal { code, message } => {
                self.failed(now, id, RestartReason::Fatal { code, message }, true, actions);
            }
        }
        Handled::Live
    }

    /// A live timer fired (a stale one, superseded or cancelled, is ignored).
    fn on_timer(&mut self, now: Instant, t: Timer, actions: &mut Vec<Action>) -> Handled {
        if !self.live(t) {
            return Handled::Stale;
        }
        self.timers.remove(&timer_slot(t.kind));
        match t.kind {
            TimerKind::Deadline => self.on_deadline(now, actions),
            TimerKind::Startup => self.on_startup_timeout(now, actions),
            TimerKind::Candidate => self.on_candidate_timeout(now, actions),
            TimerKind::Backoff => {
                if self.serving.is_none() && self.in_backoff {
                    self.spawn_serving(now, actions);
                }
            }
            TimerKind::Wait => self.wait_due = None, // `check_wait` (after every event) acts on it
            TimerKind::Gather => {
                if self.gather == Gather::Waiting {
                    self.gather = Gather::Due;
                    self.dispatch(now, actions);
                }
            }
            TimerKind::Retry => self.on_retry(now, actions),
            TimerKind::Probe => self.on_probe_due(actions),
        }
        Handled::Live
    }

    /// The serving worker's call (or health call) missed its deadline.
    fn on_deadline(&mut self, now: Instant, actions: &mut Vec<Action>) {
        if let Some(s) = self.serving.filter(|s| matches!(s.state, WorkerState::Busy(_) | WorkerState::Health)) {
            self.failed(now, s.id, RestartReason::Deadline(s.deadline), true, actions);
        }
    }

    /// The serving worker did not announce itself in time.
    fn on_startup_timeout(&mut self, now: Instant, actions: &mut Vec<Action>) {
        if let Some(s) = self.serving.filter(|s| s.state == WorkerState::Starting) {
            let why = format!("not ready within {} s", self.policy.startup_timeout.as_secs());
            self.failed(now, s.id, RestartReason::LoadFailed(LoadError::other(why)), true, actions);
        }
    }

    /// The candidate primary did not load, or did not pass its health call, in time.
    fn on_candidate_timeout(&mut self, now: Instant, actions: &mut Vec<Action>) {
        if let Some(c) = self.candidate {
            let reason = if c.state == WorkerState::Starting {
                let why = format!("not ready within {} s", self.policy.startup_timeout.as_secs());
                RestartReason::LoadFailed(LoadError::other(why))
            } else {
                RestartReason::Deadline(c.deadline)
            };
            self.failed(now, c.id, reason, true, actions);
        }
    }

    /// Time to try the degraded primary again: a candidate starts.
    fn on_retry(&mut self, now: Instant, actions: &mut Vec<Action>) {
        if self.degraded.is_some() && self.candidate.is_none() {
            if let Some(d) = self.degraded.as_mut() {
                d.next_try = now + self.policy.primary_retry;
            }
            self.spawn_candidate(now, actions);
        }
    }

    /// Time for the periodic probe: asked for unless the serving worker is starting (its health
    /// call probes it) or the last probe is still held; the next one is due `probe_every` on.
    fn on_probe_due(&mut self, actions: &mut Vec<Action>) {
        if let Some(every) = self.policy.probe_every {
            self.timer(TimerKind::Probe, every, actions);
        }
        let probing = self.probing.is_some_and(|c| self.calls.holds(c));
        if self.backend_state() != BackendState::Starting && !probing {
            actions.push(Action::Probe);
        }
    }

    /// Periodic housekeeping: expired calls leave the queue.
    fn on_tick(&mut self, now: Instant, actions: &mut Vec<Action>) -> Handled {
        for call in self.calls.expire(now) {
            actions.push(Action::Reject(call, EngineError::Expired));
        }
        Handled::Live
    }
}

/// Whether `slot` runs `call`: its health call, or the batch it is busy with.
fn runs(slot: Slot, call: CallId) -> bool {
    match slot.state {
        WorkerState::Health => call == HEALTH_CALL,
        WorkerState::Busy(c) => c == call,
        _ => false,
    }
}
