//! The lifecycle steps the event handlers of [`Supervisor`] share: timers, starting workers,
//! dispatching queued calls, a worker found healthy, a worker failed (restart, quarantine,
//! degrade), and the bound on how long a question waits for a worker that is not serving. Apart
//! from `mod.rs` so the handlers read as one method per event (rumqttc's `state.rs` style).

use std::time::{Duration, Instant};

use super::*;

impl Supervisor {
    pub(super) fn bound(&self, role: Role, rows: f64, units: f64, rate: Option<Duration>) -> Duration {
        self.estimator.bound(&self.policy, role, rows, units, rate)
    }

    #[cfg(test)]
    pub(super) fn health_deadline(&self) -> Duration {
        self.estimator.health_deadline(&self.policy, self.role())
    }

    /// Why questions are refused now, and when the next try is.
    pub(super) fn unavailable(&self, now: Instant) -> String {
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

    pub(super) fn timer(&mut self, kind: TimerKind, after: Duration, actions: &mut Vec<Action>) {
        self.generation += 1;
        self.timers.insert(timer_slot(kind), self.generation);
        actions.push(Action::SetTimer(Timer { kind, generation: self.generation }, after));
    }

    pub(super) fn cancel_timer(&mut self, kind: TimerKind) {
        self.timers.remove(&timer_slot(kind));
    }

    pub(super) fn live(&self, t: Timer) -> bool {
        self.timers.get(&timer_slot(t.kind)) == Some(&t.generation)
    }

    pub(super) fn is_candidate(&self, id: WorkerId) -> bool {
        self.candidate.is_some_and(|c| c.id == id)
    }

    pub(super) fn slot_mut(&mut self, id: WorkerId) -> Option<&mut Slot> {
        if self.serving.is_some_and(|s| s.id == id) {
            self.serving.as_mut()
        } else if self.is_candidate(id) {
            self.candidate.as_mut()
        } else {
            None
        }
    }

    pub(super) fn new_worker(&mut self, now: Instant, role: Role, actions: &mut Vec<Action>) -> Slot {
        let id = self.next_worker;
        self.next_worker += 1;
        actions.push(Action::Spawn(id, role));
        let deadline = self.policy.startup_timeout;
        Slot {
            id,
            role,
            state: WorkerState::Starting,
            since: now,
            deadline,
            due: now + deadline,
            size: Size::default(),
            signs: None,
        }
    }

    pub(super) fn spawn_serving(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let role = if self.degraded.is_some() { Role::Fallback } else { Role::Primary };
        self.in_backoff = false;
        self.cancel_timer(TimerKind::Backoff);
        let slot = self.new_worker(now, role, actions);
        self.serving = Some(slot);
        self.timer(TimerKind::Startup, self.policy.startup_timeout, actions);
    }

    pub(super) fn spawn_candidate(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let slot = self.new_worker(now, Role::Primary, actions);
        self.candidate = Some(slot);
        self.timer(TimerKind::Candidate, self.policy.startup_timeout, actions);
    }

    /// Sends the next live queued call to the idle serving worker, with the calls queued behind
    /// it while they fit in `merge_rows` (on the primary) and none of them must run alone.
    pub(super) fn dispatch(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let Some(slot) = self.serving else { return };
        if slot.state != WorkerState::Idle {
            return;
        }
        if self.wait_for_more(slot, now, actions) {
            return;
        }
        let cap = if slot.role == Role::Primary { self.policy.merge_rows.max(1) } else { 1 };
        let (batch, size, expired) = self.calls.next_batch(now, cap);
        actions.extend(expired.into_iter().map(|call| Action::Reject(call, EngineError::Expired)));
        let Some(&first) = batch.first() else { return };
        if self.gather == Gather::Due && batch.len() == 1 {
            self.contended = false; // nobody else came: stop waiting for company
        }
        self.gather = Gather::Off;
        self.cancel_timer(TimerKind::Gather);
        let deadline = self.bound(slot.role, size.rows as f64, size.units, None);
        let due = now + deadline;
        self.serving =
            Some(Slot { state: WorkerState::Busy(first), since: now, deadline, due, size, signs: None, ..slot });
        actions.push(Action::Send(slot.id, batch.clone()));
        self.calls.start(batch);
        self.timer(TimerKind::Deadline, deadline, actions);
    }

    /// Whether the idle primary waits (up to `gather`) for more calls before sending: only
    /// while callers are concurrent, and only until the queued rows fill a round of its contexts.
    pub(super) fn wait_for_more(&mut self, slot: Slot, now: Instant, actions: &mut Vec<Action>) -> bool {
        let parallel = self.policy.primary_parallel;
        let on = slot.role == Role::Primary && parallel > 1 && self.policy.merge_rows > 1 && self.contended;
        let window = match self.estimator.estimate(&self.policy, Role::Primary) {
            Some(est) => self.policy.gather.min(est / 10),
            None => self.policy.gather,
        };
        if !on || window.is_zero() || self.gather == Gather::Due {
            return false;
        }
        if !self.calls.short_of_a_round(now, parallel) {
            return false;
        }
        if self.gather == Gather::Off {
            self.gather = Gather::Waiting;
            self.timer(TimerKind::Gather, window, actions);
        }
        true
    }

    pub(super) fn reject_queue(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let why = self.unavailable(now);
        for call in self.calls.drain_queue() {
            actions.push(Action::Reject(call, EngineError::Unavailable(why.clone())));
        }
    }

    pub(super) fn schedule_retry(&mut self, now: Instant, cause: String, actions: &mut Vec<Action>) {
        let next_try = now + self.policy.primary_retry;
        self.degraded = Some(Degraded { cause, next_try });
        self.timer(TimerKind::Retry, self.policy.primary_retry, actions);
    }

    /// A worker loaded and passed its health call.
    pub(super) fn healthy(&mut self, now: Instant, slot: Slot, actions: &mut Vec<Action>) {
        let elapsed = now.duration_since(slot.since);
        if self.policy.health_rows > 0 {
            let rounds = deadline::cost(&self.policy, self.policy.health_size(), slot.role);
            // From the first sign of progress on, when there is one: the first inference's
            // own cost (the load allowance's business) does not inflate every later deadline.
            let seed = match slot.signs {
                Some(signs) if signs.first < 1.0 => {
                    now.duration_since(signs.first_at).as_secs_f64() / (rounds * (1.0 - signs.first))
                }
                _ => elapsed.as_secs_f64() / rounds,
            };
            self.estimator.seed(slot.role, Duration::from_secs_f64(seed));
        }
        if slot.role == Role::Primary {
            self.failed_health = 0;
        }
        if self.is_candidate(slot.id) {
            // The degraded primary is back: it takes over from the fallback.
            self.candidate = None;
            self.cancel_timer(TimerKind::Candidate);
            if let Some(old) = self.serving.take() {
                actions.push(Action::Kill(old.id));
                // Not the calls' fault: they run again, same attempt, in their order.
                self.calls.requeue_running(None);
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
    pub(super) fn failed(
        &mut self,
        now: Instant,
        id: WorkerId,
        reason: RestartReason,
        kill: bool,
        actions: &mut Vec<Action>,
    ) {
        let why = reason.describe();
        if self.is_candidate(id) || self.serving.is_some_and(|s| s.id == id) {
            self.last_failure = Some((why.clone(), reason.clone()));
        }
        if self.is_candidate(id) {
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
        if self.calls.running_len() > 1 {
            self.calls.split_running();
        } else if let WorkerState::Busy(_) = slot.state
            && let Some(call) = self.calls.pop_running()
            && self.calls.retry(call) == Retry::Spent
        {
            counts = false;
            actions.push(Action::Reject(
                call,
                EngineError::Quarantined(format!("this request failed twice ({why}); it is not run again")),
            ));
        }
        self.calls.clear_running();
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
    pub(super) fn degrade(
        &mut self,
        now: Instant,
        cause: String,
        reason: Option<RestartReason>,
        actions: &mut Vec<Action>,
    ) {
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
    pub(super) fn not_ready(&self, now: Instant) -> String {
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
    pub(super) fn waited_too_long(&mut self, now: Instant, wait: Duration, actions: &mut Vec<Action>) {
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
        for call in self.calls.waited(now, since, wait) {
            actions.push(Action::Reject(call, EngineError::Unavailable(why.clone())));
        }
    }

    /// Keeps the `Wait` timer on the oldest question waiting for a worker that is not serving
    /// (run after every event).
    pub(super) fn check_wait(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let Some(wait) = self.policy.ready_wait else { return };
        let serving = matches!(self.state(), WorkerState::Idle | WorkerState::Busy(_));
        if serving || !self.started {
            self.not_serving_since = None;
        } else if self.not_serving_since.is_none() {
            self.not_serving_since = Some(now);
        }
        let (Some(since), Some(oldest)) = (self.not_serving_since, self.calls.oldest()) else {
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
            if self.policy.fallback || !self.calls.is_queue_empty() {
                self.check_wait(now, actions);
            }
        } else if self.wait_due != Some(due) {
            self.wait_due = Some(due);
            self.timer(TimerKind::Wait, due - now, actions);
        }
    }
}
