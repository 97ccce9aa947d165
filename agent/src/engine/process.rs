//! The engine's driver: runs the [`Supervisor`]'s actions on real worker processes.
//!
//! One task owns the supervisor, the calls and the timers, and does all its I/O without waiting
//! on a worker, in a single `tokio::select!` loop: calls from the agent, frames and exits from
//! the workers, timers. Each worker process has a reader task (frames in), a writer task (frames
//! out, through a channel, so a worker that stops reading never freezes the timers) and a reaper
//! task that owns its `Child` and either reaps it when it exits or SIGKILLs and reaps it on
//! request, so no zombie is ever left behind. Up to two workers run at once: the serving one and,
//! while the primary is degraded, a candidate primary being health-checked beside the fallback.
//! Every answer is checked against the constant-output evidence (`engine::health`) before it is
//! delivered.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use super::health::Evidence;
use super::probe::{Probe, Report};
use super::protocol::{FromWorker, ToWorker, frame_len};
use super::supervisor::{
    Action, BackendState, CallError, CallId, Event, HEALTH_CALL, Notice, Policy, RestartReason, Role, Supervisor,
    Timer, TimerKind, WorkerId, WorkerState,
};
use crate::backend::{BackendError, RowResult};
use crate::prompt::Row;

/// How to start a worker process.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSpec {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
}

/// The engine's configuration.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub policy: Policy,
    pub primary: WorkerSpec,
    /// The CPU worker used while the primary is degraded (`policy.fallback` must be set).
    pub fallback: Option<WorkerSpec>,
    /// The health call every new worker answers before any question: two different valid rows
    /// (`engine::health::rows`); empty for none.
    pub health: Vec<Row>,
    /// Calls queued or running beyond this are refused (`limits.queue`).
    pub queue: usize,
    /// The bundle's probe: run after the health rows in every health call, and every
    /// `probe_every` on the serving worker; a worker that fails it is treated as broken.
    pub probe: Option<Arc<Probe>>,
    /// How often the serving worker runs the probe again (`probe.interval_min`; none: only at start).
    pub probe_every: Option<Duration>,
}

impl EngineConfig {
    /// A primary backend alone: no fallback, no health call, a queue of 1024.
    pub fn new(policy: Policy, primary: WorkerSpec) -> EngineConfig {
        EngineConfig {
            policy,
            primary,
            fallback: None,
            health: Vec::new(),
            queue: 1024,
            probe: None,
            probe_every: None,
        }
    }
}

/// A successful call.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutput {
    pub rows: Vec<RowResult>,
    /// Which worker answered: the configured backend or the fallback.
    pub role: Role,
    /// The backend the answering worker runs (`cpu`, `rknn`, ...).
    pub backend: String,
    /// Time from the call being sent to the worker to its answer.
    pub elapsed: Duration,
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("the model rejected the input: {0}")]
    Input(String),
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    #[error("the engine is overloaded: {0}")]
    Overloaded(String),
    #[error("the deadline passed before the call reached the backend")]
    Expired,
    /// The call failed fatally on two workers: it is not run again.
    #[error("the backend failed on this request: {0}")]
    Quarantined(String),
    #[error("the engine has stopped")]
    Stopped,
}

/// A restart, for telemetry and events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartRecord {
    pub role: Role,
    pub reason: RestartReason,
}

/// How many restart records are kept (the counts are kept for ever).
pub const RESTARTS_KEPT: usize = 64;

#[derive(Debug, Default)]
struct RestartLog {
    total: u64,
    recent: VecDeque<RestartRecord>,
}

/// The engine's state, readable at any time without waiting for a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineStatus {
    /// Who serves questions.
    pub role: Role,
    pub degraded: bool,
    pub state: BackendState,
    /// The serving worker's state.
    pub worker: WorkerState,
    /// Calls waiting for a worker.
    pub queued: usize,
    /// Calls queued or running.
    pub in_flight: usize,
    /// Restarts by reason.
    pub restarts: Vec<(String, u64)>,
    /// The backend name the serving worker announced.
    pub backend: Option<String>,
    /// The serving worker's process id.
    pub worker_pid: Option<u32>,
    /// The vendor runtime version the serving worker announced (empty: none).
    pub runtime: String,
    /// The last probe's figures, and which worker ran it.
    pub last_probe: Option<ProbeRun>,
    /// How long the backend has had a call running since the engine started, up to
    /// `busy_since` (see [`Engine::busy_time`]).
    pub busy_total: Duration,
    /// Since when a call has been running, if one is.
    pub busy_since: Option<Instant>,
}

/// One run of the bundle's probe on a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeRun {
    pub role: Role,
    /// The backend the worker runs (`qnn`, `cpu`, ...).
    pub backend: String,
    /// How many rows the probe has.
    pub rows: usize,
    /// The figures, when the worker answered the probe rows.
    pub report: Option<Report>,
    /// Why the worker did not answer them (its own guard, a runtime error), when it did not.
    pub error: Option<String>,
}

impl ProbeRun {
    pub fn passed(&self) -> bool {
        self.report.as_ref().is_some_and(|r| r.passed)
    }

    /// What failed, in a sentence (empty when passed).
    pub fn verdict(&self) -> String {
        match (&self.report, &self.error) {
            (_, Some(e)) => format!("the backend failed on the probe rows: {e}"),
            (Some(r), None) => r.verdict.clone(),
            (None, None) => String::new(),
        }
    }
}

enum Request {
    Run { rows: Vec<Row>, deadline: Option<Instant>, reply: oneshot::Sender<Result<RunOutput, EngineError>> },
}

/// Handle to a running engine.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::Sender<Request>,
    status: Arc<Mutex<EngineStatus>>,
    restarts: Arc<Mutex<RestartLog>>,
    notices: broadcast::Sender<Notice>,
    probes: broadcast::Sender<ProbeRun>,
    /// Receivers made when the engine started, handed to the first caller of [`Engine::notices`]
    /// and [`Engine::probe_runs`]: what happens before the agent listens (the first worker's
    /// health call and probe, its restarts) is not lost.
    first: Arc<Mutex<FirstReceivers>>,
    state: watch::Receiver<BackendState>,
}

#[derive(Default)]
struct FirstReceivers {
    notices: Option<broadcast::Receiver<Notice>>,
    probes: Option<broadcast::Receiver<ProbeRun>>,
}

enum WorkerMsg {
    Frame(FromWorker),
    Exited(String),
}

struct Worker {
    role: Role,
    frames: mpsc::UnboundedSender<Vec<u8>>,
    kill: Option<oneshot::Sender<()>>,
    backend: Option<String>,
    pid: Option<u32>,
    runtime: String,
}

struct Pending {
    rows: Vec<Row>,
    reply: oneshot::Sender<Result<RunOutput, EngineError>>,
    sent_at: Option<Instant>,
    result: Option<(Vec<RowResult>, Role, String)>,
}

impl Engine {
    /// Starts the engine on the current tokio runtime (it spawns the first worker at once).
    pub fn start(config: EngineConfig) -> Engine {
        let (tx, rx) = mpsc::channel(1024);
        let mut policy = config.policy.clone();
        policy.queue_limit = config.queue.max(1);
        let mut health_rows = config.health.clone();
        if let Some(p) = &config.probe {
            health_rows.extend(p.rows.iter().cloned());
        }
        policy.health_rows = health_rows.len();
        let sup = Supervisor::new(policy);
        let status = Arc::new(Mutex::new(EngineStatus {
            role: Role::Primary,
            degraded: false,
            state: BackendState::Starting,
            worker: WorkerState::Down,
            queued: 0,
            in_flight: 0,
            restarts: Vec::new(),
            backend: None,
            worker_pid: None,
            runtime: String::new(),
            last_probe: None,
            busy_total: Duration::ZERO,
            busy_since: None,
        }));
        let restarts = Arc::new(Mutex::new(RestartLog::default()));
        let (notices, first_notices) = broadcast::channel(256);
        let (probes, first_probes) = broadcast::channel(64);
        let first = Arc::new(Mutex::new(FirstReceivers { notices: Some(first_notices), probes: Some(first_probes) }));
        let (state_tx, state) = watch::channel(BackendState::Starting);
        let driver = Driver {
            config,
            sup,
            rx,
            pending: HashMap::new(),
            next_call: HEALTH_CALL + 1,
            timers: HashMap::new(),
            workers: HashMap::new(),
            status: status.clone(),
            restarts: restarts.clone(),
            notices: notices.clone(),
            state: state_tx,
            evidence: Evidence::default(),
            health_rows,
            probe_calls: std::collections::HashSet::new(),
            sent: HashMap::new(),
            probes: probes.clone(),
        };
        tokio::spawn(driver.run());
        Engine { tx, status, restarts, notices, probes, first, state }
    }

    /// Runs a batch of rows; waits for the result however the workers fare. A call whose
    /// `deadline` passes while it is queued, or whose caller stops waiting, never reaches a worker.
    pub async fn run(&self, rows: Vec<Row>, deadline: Option<Instant>) -> Result<RunOutput, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Request::Run { rows, deadline, reply }).await.map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)?
    }

    /// The engine's current state.
    pub fn status(&self) -> EngineStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_else(|e| e.into_inner().clone())
    }

    /// The last [`RESTARTS_KEPT`] restarts, oldest first.
    pub fn restarts(&self) -> Vec<RestartRecord> {
        let log = self.restarts.lock().unwrap_or_else(|e| e.into_inner());
        log.recent.iter().cloned().collect()
    }

    /// How many restarts happened in all.
    pub fn restart_total(&self) -> u64 {
        self.restarts.lock().map(|l| l.total).unwrap_or_else(|e| e.into_inner().total)
    }

    /// Restarts, degradation and recovery as they happen.
    /// The first caller gets every notice since the engine started.
    pub fn notices(&self) -> broadcast::Receiver<Notice> {
        let first = self.first.lock().ok().and_then(|mut f| f.notices.take());
        first.unwrap_or_else(|| self.notices.subscribe())
    }

    /// Every probe run, as it happens.
    /// The first caller gets every run since the engine started.
    pub fn probe_runs(&self) -> broadcast::Receiver<ProbeRun> {
        let first = self.first.lock().ok().and_then(|mut f| f.probes.take());
        first.unwrap_or_else(|| self.probes.subscribe())
    }

    /// How long the backend has had a call running since the engine started (telemetry's busy
    /// fraction is the growth of this over an interval).
    pub fn busy_time(&self) -> Duration {
        let s = self.status();
        s.busy_total + s.busy_since.map(|t| t.elapsed()).unwrap_or_default()
    }

    /// The backend's state (`starting | ready | degraded`), to be told when it changes.
    pub fn backend_state(&self) -> watch::Receiver<BackendState> {
        self.state.clone()
    }
}

struct Driver {
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
    probe_calls: std::collections::HashSet<CallId>,
    /// The calls whose rows each frame on a worker carries, in order, by the frame's call id (its
    /// first call's): one call, or several the supervisor merged.
    sent: HashMap<CallId, Vec<CallId>>,
    probes: broadcast::Sender<ProbeRun>,
}

/// How long an exited worker's stdout may take to drain before its exit is reported.
const LAST_WORDS: Duration = Duration::from_secs(2);

/// Reads one frame from the worker's stdout.
async fn read_frame(out: &mut tokio::process::ChildStdout) -> Option<Result<FromWorker, String>> {
    let mut len = [0u8; 4];
    out.read_exact(&mut len).await.ok()?;
    let n = match frame_len(len) {
        Ok(n) => n,
        Err(e) => return Some(Err(e.to_string())),
    };
    let mut payload = vec![0u8; n];
    out.read_exact(&mut payload).await.ok()?;
    Some(FromWorker::decode(&payload).map_err(|e| e.to_string()))
}

/// The longest line of a worker's stderr logged whole; a longer one is logged in pieces of this size.
const STDERR_LINE: usize = 8 * 1024;

/// Logs each line of a worker's stderr in the agent's log, at the line's level, with the
/// worker's pid and role (see `crate::platform::logging::worker_line`), until the worker closes it.
async fn forward_stderr(mut stderr: tokio::process::ChildStderr, pid: u32, role: Role) {
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let emit = |line: &[u8]| {
        let line = String::from_utf8_lossy(line);
        let line = line.trim_end_matches('\r');
        if line.is_empty() {
            return;
        }
        let role = role.as_str();
        let (level, text) = crate::platform::logging::worker_line(line);
        match level {
            tracing::Level::ERROR => tracing::error!(target: "laya_worker", worker_pid = pid, role, "{text}"),
            tracing::Level::WARN => tracing::warn!(target: "laya_worker", worker_pid = pid, role, "{text}"),
            tracing::Level::INFO => tracing::info!(target: "laya_worker", worker_pid = pid, role, "{text}"),
            _ => tracing::debug!(target: "laya_worker", worker_pid = pid, role, "{text}"),
        }
    };
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        while let Some(at) = buf.iter().position(|b| *b == b'\n') {
            emit(&buf[..at.min(STDERR_LINE)]);
            buf.drain(..=at);
        }
        if buf.len() > STDERR_LINE {
            emit(&buf[..STDERR_LINE]);
            buf.clear();
        }
    }
    emit(&buf);
}

impl Driver {
    async fn run(mut self) {
        let (wtx, mut wrx) = mpsc::channel::<(WorkerId, WorkerMsg)>(64);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let probe_every = self.config.probe_every.filter(|_| self.config.probe.is_some());
        let mut probe_tick = tokio::time::interval(probe_every.unwrap_or(Duration::from_secs(3600)));
        probe_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        probe_tick.tick().await; // the first run is the health call's
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
                    Some(Request::Run { rows, deadline, reply }) => {
                        let call = self.next_call;
                        self.next_call += 1;
                        let n = rows.len();
                        self.pending.insert(call, Pending { rows, reply, sent_at: None, result: None });
                        self.apply(Event::Submit { call, rows: n, deadline, alone: false }, &wtx);
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
                _ = probe_tick.tick(), if probe_every.is_some() => self.probe_again(&wtx),
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
            WorkerMsg::Frame(FromWorker::LoadFailed { message }) => Event::LoadFailed(id, message),
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
                    let evidence = self.evidence.check(&sent, &rows);
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
        let report = probe.judge(outputs);
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
        }
        let _ = self.probes.send(run); // no subscriber: nobody to tell
    }

    /// Queues the probe on whichever worker serves, as a call of its own.
    fn probe_again(&mut self, wtx: &mpsc::Sender<(WorkerId, WorkerMsg)>) {
        let Some(probe) = self.config.probe.clone() else { return };
        if self.sup.backend_state() == BackendState::Starting || !self.probe_calls.is_empty() {
            return; // the health call probes a starting worker; one periodic probe at a time
        }
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
        let n = rows.len();
        self.pending.insert(call, Pending { rows, reply, sent_at: None, result: None });
        // Alone: the probe's judgement reads this call's rows only.
        self.apply(Event::Submit { call, rows: n, deadline: None, alone: true }, wtx);
    }

    fn kill(&mut self, id: WorkerId) {
        if let Some(mut w) = self.workers.remove(&id)
            && let Some(k) = w.kill.take()
        {
            let _ = k.send(());
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
    }

    fn send(&mut self, id: WorkerId, frame: Vec<u8>) {
        if let Some(w) = self.workers.get(&id) {
            // A closed channel means the worker is gone: its exit event follows.
            let _ = w.frames.send(frame);
        }
    }

    fn spawn(&mut self, id: WorkerId, role: Role, wtx: &mpsc::Sender<(WorkerId, WorkerMsg)>) -> Option<Event> {
        let spec = match role {
            Role::Primary => &self.config.primary,
            Role::Fallback => self.config.fallback.as_ref().unwrap_or(&self.config.primary),
        };
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .envs(spec.env.iter().cloned())
            .env_remove("NOTIFY_SOCKET") // only the agent talks to systemd (NotifyAccess=main)
            .env(crate::platform::logging::PRIORITY_VAR, "1") // its stderr comes back through forward_stderr
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return Some(Event::LoadFailed(id, format!("cannot start {}: {e}", spec.program.display()))),
        };
        let (Some(mut stdin), Some(mut stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Some(Event::LoadFailed(id, "the worker has no pipes".into()));
        };
        let pid = child.id();
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(forward_stderr(stderr, pid.unwrap_or(0), role));
        }
        let frames = wtx.clone();
        let reader = tokio::spawn(async move {
            while let Some(frame) = read_frame(&mut stdout).await {
                let (msg, garbled) = match frame {
                    Ok(f) => (WorkerMsg::Frame(f), false),
                    Err(e) => {
                        let message = format!("garbled frame: {e}");
                        (WorkerMsg::Frame(FromWorker::LoadFailed { message }), true)
                    }
                };
                // After a garbled frame the stream is out of step: nothing more can be read.
                if frames.send((id, msg)).await.is_err() || garbled {
                    break;
                }
            }
        });
        // The writer: the driver never waits on a worker's stdin.
        let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            while let Some(frame) = out_rx.recv().await {
                if stdin.write_all(&frame).await.is_err() || stdin.flush().await.is_err() {
                    break;
                }
            }
        });
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let exits = wtx.clone();
        tokio::spawn(async move {
            tokio::select! {
                status = child.wait() => {
                    let how = match status {
                        Ok(s) => s.to_string(),
                        Err(e) => e.to_string(),
                    };
                    // The worker's last frames (a LoadFailed, a Failed) are queued before its
                    // exit: the reader sends them before it sees EOF. Without this wait a worker
                    // that reports a load failure and exits could be taken for a crash. A
                    // grandchild holding the pipe open must not stall us, hence the bound.
                    let _ = tokio::time::timeout(LAST_WORDS, reader).await;
                    let _ = exits.send((id, WorkerMsg::Exited(how))).await;
                }
                _ = kill_rx => {
                    let _ = child.start_kill();
                    let _ = child.wait().await; // reap: no zombie
                }
            }
        });
        self.workers.insert(
            id,
            Worker { role, frames: out_tx, kill: Some(kill_tx), backend: None, pid, runtime: String::new() },
        );
        None
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
                    let _ = p.reply.send(Ok(RunOutput { rows, role, backend, elapsed }));
                }
            }
            Action::Reject(call, error) => {
                self.probe_calls.remove(&call);
                self.sent.remove(&call);
                if let Some(p) = self.pending.remove(&call) {
                    let _ = p.reply.send(Err(match error {
                        CallError::Input(m) => EngineError::Input(m),
                        CallError::Unavailable(m) => EngineError::Unavailable(m),
                        CallError::Overloaded(m) => EngineError::Overloaded(m),
                        CallError::Expired => EngineError::Expired,
                        CallError::Quarantined(m) => EngineError::Quarantined(m),
                    }));
                }
            }
            Action::Restarted(role, reason) => {
                // Logged once, with its notice (Action::Notify), which always follows.
                if let Ok(mut log) = self.restarts.lock() {
                    log.total += 1;
                    log.recent.push_back(RestartRecord { role, reason });
                    if log.recent.len() > RESTARTS_KEPT {
                        log.recent.pop_front();
                    }
                }
                if let Ok(mut s) = self.status.lock() {
                    s.restarts = self.sup.restart_counts().iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
                }
            }
            Action::Notify(notice) => {
                match notice.kind {
                    super::supervisor::NoticeKind::BackendRecovered => {
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
                let _ = self.notices.send(notice); // no subscriber: nobody to tell
            }
        }
        None
    }
}
