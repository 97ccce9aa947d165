//! The engine's driver: executes the [`Supervisor`]'s actions on real worker processes.
//!
//! One task owns the supervisor, the calls and the timers, and does all its I/O without waiting
//! on a worker, in a single `tokio::select!` loop: calls from the agent, frames and exits from
//! the workers (`child.rs`), timers. Up to two workers run at once: the serving one and, while
//! the primary is degraded, a candidate primary being health-checked beside the fallback. It
//! decides nothing itself: every input becomes an [`Event`], every [`Action`] is carried out.
//! What it adds is answer verification: every answer is checked against the constant-output
//! evidence (`engine::health`) and, on probe calls, judged by the bundle's probe before it is
//! delivered.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, mpsc, oneshot, watch};

use super::child::{self, Worker, WorkerMsg};
use super::health::Evidence;
use super::probe::Report;
use super::protocol::{FromWorker, ToWorker};
use super::supervisor::{
    Action, Asker, BackendState, CallId, Event, HEALTH_CALL, Notice, NoticeKind, RestartReason, Role, Supervisor,
    Timer, TimerKind, WorkerId,
};
use super::{
    EngineConfig, EngineError, EngineStatus, ProbeRun, ProbeRuns, RESTARTS_KEPT, RestartLog, RestartRecord, RunOutput,
};
use crate::backend::{BackendError, LoadError, RowResult};
use crate::prompt::Row;

/// What the [`Engine`](super::Engine) handle asks of the driver.
pub(super) enum Request {
    Run {
        rows: Vec<Row>,
        deadline: Option<Instant>,
        asker: Asker,
        reply: oneshot::Sender<Result<RunOutput, EngineError>>,
    },
}

/// A call the driver holds for its caller, from submission to answer.
struct Pending {
    rows: Vec<Row>,
    reply: oneshot::Sender<Result<RunOutput, EngineError>>,
    sent_at: Option<Instant>,
    result: Option<(Vec<RowResult>, Role, String)>,
}

/// Where the driver reports to the [`Engine`](super::Engine) handle.
pub(super) struct Shared {
    pub(super) status: Arc<Mutex<EngineStatus>>,
    pub(super) restarts: Arc<Mutex<RestartLog>>,
    pub(super) notices: broadcast::Sender<Notice>,
    pub(super) probes: broadcast::Sender<ProbeRun>,
    pub(super) state: watch::Sender<BackendState>,
    /// Held until the driver ends; each worker's reaper holds a clone until it reaped its worker.
    pub(super) lifetime: child::Lifetime,
}

pub(super) struct Driver {
    config: EngineConfig,
    sup: Supervisor,
    rx: mpsc::Receiver<Request>,
    pending: HashMap<CallId, Pending>,
    next_call: CallId,
    /// The supervisor's timers, one per kind: arming one supersedes the previous.
    timers: HashMap<TimerKind, (Instant, Timer)>,
    workers: HashMap<WorkerId, Worker>,
    status: Arc<Mutex<EngineStatus>>,
    restarts: Arc<Mutex<RestartLog>>,
    notices: broadcast::Sender<Notice>,
    state: watch::Sender<BackendState>,
    evidence: Evidence,
    /// The health call's rows: the health rows, then the probe's.
    health_rows: Vec<Row>,
    /// The periodic probe calls in progress.
    probe_calls: HashSet<CallId>,
    /// The calls whose rows each frame on a worker carries, in order, by the frame's call id (its
    /// first call's): one call, or several the supervisor merged.
    sent: HashMap<CallId, Vec<CallId>>,
    probes: broadcast::Sender<ProbeRun>,
    /// What an event's actions tell the outside (answers, restarts, notices), held until the
    /// status shows the state they lead to: whoever hears of a restart or gets an answer and
    /// then reads the status never sees the state before it (a dead worker's pid as serving).
    outbox: Vec<Outgoing>,
    /// Dropped with the driver; see [`Shared::lifetime`].
    lifetime: child::Lifetime,
}

/// One thing the driver tells the outside, once the status is published.
enum Outgoing {
    Reply(oneshot::Sender<Result<RunOutput, EngineError>>, Result<RunOutput, EngineError>),
    Restart(RestartRecord),
    Notice(Notice),
}

impl Driver {
    /// A driver for `config`, supervised by `sup`, taking requests from `rx`.
    pub(super) fn new(
        config: EngineConfig,
        sup: Supervisor,
        health_rows: Vec<Row>,
        rx: mpsc::Receiver<Request>,
        shared: Shared,
    ) -> Driver {
        let Shared { status, restarts, notices, probes, state, lifetime } = shared;
        Driver {
            config,
            sup,
            rx,
            pending: HashMap::new(),
            next_call: HEALTH_CALL + 1,
            timers: HashMap::new(),
            workers: HashMap::new(),
            status,
            restarts,
            notices,
            state,
            evidence: Evidence::default(),
            health_rows,
            probe_calls: HashSet::new(),
            sent: HashMap::new(),
            probes,
            outbox: Vec::new(),
            lifetime,
        }
    }

    /// Runs until the last [`Engine`](super::Engine) handle is dropped, then stops the workers.
    pub(super) async fn run(mut self) {
        let (wtx, mut wrx) = mpsc::channel::<(WorkerId, WorkerMsg)>(64);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        self.apply(Event::Start, &wtx);
        loop {
            let next_timer = self.timers.values().map(|(at, _)| *at).min();
            let sleep = async {
                match next_timer {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                cmd = self.rx.recv() => match cmd {
                    Some(Request::Run { rows, deadline, asker, reply }) => {
                        // Testing only (LAYA_TEST_PANIC): a task that panics ends the process.
                        crate::platform::panic::injected("engine-call");
                        let call = self.next_call;
                        self.next_call += 1;
                        let (n, units) = (rows.len(), self.config.units(&rows));
                        self.pending.insert(call, Pending { rows, reply, sent_at: None, result: None });
                        self.apply(Event::Submit { call, rows: n, units, deadline, probe: false, asker }, &wtx);
                    }
                    None => break,
                },
                Some((id, msg)) = wrx.recv() => {
                    if !self.workers.contains_key(&id) {
                        continue; // a killed worker's last words
                    }
                    let event = self.on_worker(id, msg);
                    self.apply(event, &wtx);
                }
                _ = sleep => {
                    let now = Instant::now();
                    let due: Vec<TimerKind> =
                        self.timers.iter().filter(|(_, (at, _))| *at <= now).map(|(k, _)| *k).collect();
                    for kind in due {
                        if let Some((_, t)) = self.timers.remove(&kind) {
                            self.apply(Event::Timer(t), &wtx);
                        }
                    }
                }
                _ = tick.tick() => {
                    // Callers that stopped waiting: their calls leave the queue.
                    let gone: Vec<CallId> = self
                        .pending
                        .iter()
                        .filter(|(_, p)| p.sent_at.is_none() && p.reply.is_closed())
                        .map(|(c, _)| *c)
                        .collect();
                    for call in gone {
                        self.pending.remove(&call);
                        self.apply(Event::Cancelled(call), &wtx);
                    }
                    self.apply(Event::Tick, &wtx);
                }
            }
        }
        // The agent dropped the engine: stop the workers.
        let ids: Vec<WorkerId> = self.workers.keys().copied().collect();
        for id in ids {
            self.kill(id);
        }
    }

    /// The supervisor's event for a worker's message; answers are checked for constant output.
    fn on_worker(&mut self, id: WorkerId, msg: WorkerMsg) -> Event {
        let role = self.workers.get(&id).map_or(Role::Primary, |w| w.role);
        match msg {
            WorkerMsg::Frame(FromWorker::Ready { backend, runtime, .. }) => {
                if let Some(w) = self.workers.get_mut(&id) {
                    w.backend = Some(backend);
                    w.runtime = runtime;
                }
                Event::Ready(id)
            }
            WorkerMsg::Frame(FromWorker::LoadFailed { kind, message }) => {
                Event::LoadFailed(id, LoadError { kind, message })
            }
            WorkerMsg::Frame(FromWorker::Progress { call, done, of }) => Event::Progress(id, call, done, of),
            WorkerMsg::Frame(FromWorker::Done { call, rows, .. }) => {
                let batch = if call == HEALTH_CALL { Vec::new() } else { self.sent.remove(&call).unwrap_or_default() };
                let sent: Vec<Row> = if call == HEALTH_CALL {
                    self.health_rows.clone()
                } else {
                    let calls: Option<Vec<&Pending>> = batch.iter().map(|c| self.pending.get(c)).collect();
                    match calls {
                        Some(calls) if !calls.is_empty() => calls.iter().flat_map(|p| p.rows.iter().cloned()).collect(),
                        _ => return Event::Done(id, call),
                    }
                };
                let check = if rows.len() != sent.len() {
                    Err(format!("the worker answered {} rows for {}", rows.len(), sent.len()))
                } else {
                    // The probe first: its report (a collapse included) is published either way.
                    let probe = self.probe_check(id, call, &rows);
                    let backend = self.workers.get(&id).and_then(|w| w.backend.as_deref()).unwrap_or_default();
                    let evidence = self.evidence.check(&sent, &rows).map_err(|c| c.message(backend));
                    match (probe, evidence) {
                        (Err(p), Err(e)) => Err(format!("{e}; {p}")),
                        (Err(m), Ok(())) | (Ok(()), Err(m)) => Err(m),
                        (Ok(()), Ok(())) => Ok(()),
                    }
                };
                match check {
                    Ok(()) => {
                        let backend = self.workers.get(&id).and_then(|w| w.backend.clone()).unwrap_or_default();
                        // Each call of the batch gets its own rows, in the order they were sent.
                        let mut rows = rows.into_iter();
                        for c in &batch {
                            if let Some(p) = self.pending.get_mut(c) {
                                let mine: Vec<RowResult> = rows.by_ref().take(p.rows.len()).collect();
                                p.result = Some((mine, role, backend.clone()));
                            }
                        }
                        Event::Done(id, call)
                    }
                    Err(message) => Event::Failed(id, call, BackendError::Fatal { code: None, message }),
                }
            }
            WorkerMsg::Frame(FromWorker::Failed { call, error }) => {
                self.probe_not_answered(id, call, &error);
                Event::Failed(id, call, error)
            }
            WorkerMsg::Exited(how) => {
                self.workers.remove(&id);
                Event::Exited(id, how)
            }
        }
    }

    /// Judges the probe rows of a health call or a periodic probe call; a failed probe is the
    /// worker's fatal error (it answers, but not like the float model).
    fn probe_check(&mut self, id: WorkerId, call: CallId, rows: &[RowResult]) -> Result<(), String> {
        let Some(probe) = self.config.probe.clone() else { return Ok(()) };
        let outputs = if call == HEALTH_CALL {
            rows.get(self.config.health.len()..).unwrap_or_default()
        } else if self.probe_calls.contains(&call) {
            rows
        } else {
            return Ok(());
        };
        let report = probe.judge(outputs, self.config.probe_graphs.as_deref());
        let result = if report.passed { Ok(()) } else { Err(format!("probe failed: {} ({report})", report.verdict)) };
        self.record_probe(id, probe.rows.len(), Some(report), None);
        result
    }

    /// A health call that carried the probe failed in the worker (its own guard, a runtime
    /// error): the probe failed too, without figures.
    fn probe_not_answered(&mut self, id: WorkerId, call: CallId, error: &BackendError) {
        let Some(probe) = self.config.probe.clone() else { return };
        if call == HEALTH_CALL || self.probe_calls.contains(&call) {
            let message = match error {
                BackendError::Fatal { message, .. }
                | BackendError::Input(message)
                | BackendError::Transient(message) => message.clone(),
            };
            self.record_probe(id, probe.rows.len(), None, Some(message));
        }
    }

    fn record_probe(&mut self, id: WorkerId, rows: usize, report: Option<Report>, error: Option<String>) {
        let worker = self.workers.get(&id);
        let run = ProbeRun {
            role: worker.map_or(Role::Primary, |w| w.role),
            backend: worker.and_then(|w| w.backend.clone()).unwrap_or_default(),
            rows,
            report,
            error,
        };
        match &run.report {
            Some(r) if run.passed() => {
                tracing::info!(role = run.role.as_str(), backend = %run.backend, "probe passed: {r}")
            }
            Some(r) => {
                tracing::warn!(role = run.role.as_str(), backend = %run.backend, "probe failed: {}: {r}", run.verdict())
            }
            None => tracing::warn!(role = run.role.as_str(), backend = %run.backend, "probe failed: {}", run.verdict()),
        }
        if let Ok(mut s) = self.status.lock() {
            s.last_probe = Some(run.clone());
            ProbeRuns::record(&mut s.probes, &run);
        }
        let _ = self.probes.send(run); // no subscriber: nobody to tell
    }

    /// The periodic probe's call, as the supervisor asked ([`Action::Probe`]): its rows, held
    /// for nobody, submitted as a call of its own.
    fn probe(&mut self) -> Option<Event> {
        let probe = self.config.probe.clone()?;
        let (reply, rx) = oneshot::channel();
        // Nobody waits for the answer (the judgement happens on arrival), but the call must not
        // look abandoned.
        tokio::spawn(async move {
            let _ = rx.await;
        });
        let call = self.next_call;
        self.next_call += 1;
        self.probe_calls.insert(call);
        let rows = probe.rows.clone();
        let (n, units) = (rows.len(), self.config.units(&rows));
        self.pending.insert(call, Pending { rows, reply, sent_at: None, result: None });
        // Alone (the supervisor never merges a probe): its judgement reads this call's rows only.
        Some(Event::Submit { call, rows: n, units, deadline: None, probe: true, asker: Asker::default() })
    }

    fn kill(&mut self, id: WorkerId) {
        if let Some(mut w) = self.workers.remove(&id) {
            w.kill();
        }
    }

    fn apply(&mut self, event: Event, wtx: &mpsc::Sender<(WorkerId, WorkerMsg)>) {
        let mut queue = vec![event];
        while let Some(event) = queue.pop() {
            let actions = self.sup.handle(Instant::now(), event);
            for action in actions {
                if let Some(follow_up) = self.act(action, wtx) {
                    queue.push(follow_up);
                }
            }
        }
        let serving = self.sup.serving_worker().and_then(|id| self.workers.get(&id));
        if let Ok(mut s) = self.status.lock() {
            s.role = self.sup.role();
            s.degraded = self.sup.degraded();
            s.state = self.sup.backend_state();
            s.worker = self.sup.state();
            s.queued = self.sup.queued();
            s.in_flight = self.sup.in_flight();
            s.backend = serving.and_then(|w| w.backend.clone());
            s.worker_pid = serving.and_then(|w| w.pid);
            s.runtime = serving.map(|w| w.runtime.clone()).unwrap_or_default();
            // Busy while a call is on a worker (in flight, not waiting in the queue).
            let running = s.in_flight > s.queued;
            match (running, s.busy_since) {
                (true, None) => s.busy_since = Some(Instant::now()),
                (false, Some(t)) => {
                    s.busy_total += t.elapsed();
                    s.busy_since = None;
                }
                _ => {}
            }
        }
        let state = self.sup.backend_state();
        self.state.send_if_modified(|s| std::mem::replace(s, state) != state);
        self.flush();
    }

    /// Tells the outside what the last event's actions decided, in their order, now that the
    /// status shows where they led.
    fn flush(&mut self) {
        for out in std::mem::take(&mut self.outbox) {
            match out {
                Outgoing::Reply(reply, result) => {
                    let _ = reply.send(result); // a caller that stopped waiting: nobody to tell
                }
                Outgoing::Restart(record) => {
                    if let Ok(mut log) = self.restarts.lock() {
                        log.total += 1;
                        log.recent.push_back(record);
                        if log.recent.len() > RESTARTS_KEPT {
                            log.recent.pop_front();
                        }
                    }
                }
                Outgoing::Notice(notice) => {
                    let _ = self.notices.send(notice); // no subscriber: nobody to tell
                }
            }
        }
    }

    fn send(&mut self, id: WorkerId, frame: Vec<u8>) {
        if let Some(w) = self.workers.get(&id) {
            w.send(frame);
        }
    }

    fn spawn(&mut self, id: WorkerId, role: Role, wtx: &mpsc::Sender<(WorkerId, WorkerMsg)>) -> Option<Event> {
        let spec = match role {
            Role::Primary => &self.config.primary,
            Role::Fallback => self.config.fallback.as_ref().unwrap_or(&self.config.primary),
        };
        match child::spawn(id, role, spec, wtx, self.lifetime.clone()) {
            Ok(worker) => {
                self.workers.insert(id, worker);
                None
            }
            Err(why) => Some(Event::LoadFailed(id, LoadError::other(why))),
        }
    }

    /// Performs one action; a failure to do it, or a call found abandoned, comes back as an event.
    fn act(&mut self, action: Action, wtx: &mpsc::Sender<(WorkerId, WorkerMsg)>) -> Option<Event> {
        match action {
            Action::Spawn(id, role) => return self.spawn(id, role, wtx),
            Action::Kill(id) => self.kill(id),
            Action::Send(id, calls) => {
                // A caller that stopped waiting: nothing is sent; the supervisor sends the rest of
                // the batch again without its call.
                let gone = calls.iter().find(|c| self.pending.get(c).is_none_or(|p| p.reply.is_closed()));
                if let Some(&call) = gone {
                    self.pending.remove(&call);
                    return Some(Event::Cancelled(call));
                }
                let &first = calls.first()?;
                let now = Instant::now();
                let mut rows = Vec::new();
                for c in &calls {
                    if let Some(p) = self.pending.get_mut(c) {
                        p.sent_at = Some(now);
                        rows.extend(p.rows.iter().cloned());
                    }
                }
                let frame = ToWorker::Run { call: first, rows }.encode();
                self.sent.insert(first, calls);
                self.send(id, frame);
            }
            Action::Health(id) => {
                let frame = ToWorker::Run { call: HEALTH_CALL, rows: self.health_rows.clone() }.encode();
                self.send(id, frame);
            }
            Action::SetTimer(t, after) => {
                self.timers.insert(t.kind, (Instant::now() + after, t));
            }
            Action::Deliver(call) => {
                self.probe_calls.remove(&call);
                self.sent.remove(&call);
                if let Some(p) = self.pending.remove(&call) {
                    let elapsed = p.sent_at.map(|t| t.elapsed()).unwrap_or_default();
                    let (rows, role, backend) = p.result.unwrap_or((Vec::new(), Role::Primary, String::new()));
                    self.outbox.push(Outgoing::Reply(p.reply, Ok(RunOutput { rows, role, backend, elapsed })));
                }
            }
            Action::Reject(call, error) => {
                self.probe_calls.remove(&call);
                self.sent.remove(&call);
                if let Some(p) = self.pending.remove(&call) {
                    self.outbox.push(Outgoing::Reply(p.reply, Err(error)));
                }
            }
            Action::Restarted(role, reason) => {
                // Logged once, with its notice (Action::Notify), which always follows.
                self.outbox.push(Outgoing::Restart(RestartRecord { role, reason }));
                if let Ok(mut s) = self.status.lock() {
                    s.restarts = self.sup.restart_counts().iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
                }
            }
            Action::Notify(notice) => {
                match notice.kind {
                    NoticeKind::BackendRecovered => {
                        tracing::info!(role = notice.role.as_str(), "{}", notice.message)
                    }
                    _ => {
                        let reason = notice.reason.as_ref().map(RestartReason::label);
                        tracing::warn!(
                            event = notice.kind.as_str(),
                            reason,
                            role = notice.role.as_str(),
                            "{}",
                            notice.message
                        )
                    }
                }
                self.outbox.push(Outgoing::Notice(notice));
            }
            Action::Probe => return self.probe(),
        }
        None
    }
}
