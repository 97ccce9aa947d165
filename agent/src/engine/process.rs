//! The engine's driver: runs the [`Supervisor`]'s actions on real worker processes.
//!
//! One task owns the supervisor, the queue of calls and the timers, and does all the I/O in a
//! single `tokio::select!` loop: calls from the agent, frames and exits from the worker, timers.
//! Each worker process has a small task that owns its `Child` and either reaps it when it exits
//! or SIGKILLs and reaps it on request, so no zombie is ever left behind. Requests keep flowing
//! into the queue while a worker hangs: only the worker is stuck, never the agent.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{ChildStdin, Command};
use tokio::sync::{mpsc, oneshot};

use super::RowResult;
use super::protocol::{FromWorker, ToWorker, frame_len};
use super::supervisor::{
    Action, CallError, CallId, Event, Policy, RestartReason, Role, Supervisor, Timer, WorkerState,
};
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
}

/// A successful call.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutput {
    pub rows: Vec<RowResult>,
    /// Which backend answered.
    pub role: Role,
    /// Time from the call reaching the front of the queue to its answer.
    pub elapsed: Duration,
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("the model rejected the input: {0}")]
    Input(String),
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    #[error("the engine has stopped")]
    Stopped,
}

/// A restart, for telemetry and events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartRecord {
    pub role: Role,
    pub reason: RestartReason,
}

/// The engine's state, readable at any time without waiting for the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineStatus {
    pub role: Role,
    pub degraded: bool,
    pub worker: WorkerState,
    pub queued: usize,
    pub restarts: Vec<(String, u64)>,
    /// The backend name the current worker announced.
    pub backend: Option<String>,
    /// The current worker's process id.
    pub worker_pid: Option<u32>,
}

enum Command_ {
    Run { rows: Vec<Row>, reply: oneshot::Sender<Result<RunOutput, EngineError>> },
}

/// Handle to a running engine.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::Sender<Command_>,
    status: Arc<Mutex<EngineStatus>>,
    restarts: Arc<Mutex<Vec<RestartRecord>>>,
}

enum WorkerMsg {
    Frame(FromWorker),
    Exited(String),
}

struct Worker {
    instance: u64,
    stdin: ChildStdin,
    kill: Option<oneshot::Sender<()>>,
}

struct Pending {
    rows: Vec<Row>,
    reply: oneshot::Sender<Result<RunOutput, EngineError>>,
    sent_at: Option<Instant>,
    result: Option<Vec<RowResult>>,
}

impl Engine {
    /// Starts the engine on the current tokio runtime (it spawns the first worker at once).
    pub fn start(config: EngineConfig) -> Engine {
        let (tx, rx) = mpsc::channel(1024);
        let sup = Supervisor::new(config.policy.clone());
        let status = Arc::new(Mutex::new(EngineStatus {
            role: Role::Primary,
            degraded: false,
            worker: WorkerState::Down,
            queued: 0,
            restarts: Vec::new(),
            backend: None,
            worker_pid: None,
        }));
        let restarts = Arc::new(Mutex::new(Vec::new()));
        let driver = Driver {
            config,
            sup,
            rx,
            pending: HashMap::new(),
            next_call: 1,
            timer: None,
            worker: None,
            next_instance: 1,
            status: status.clone(),
            restarts: restarts.clone(),
        };
        tokio::spawn(driver.run());
        Engine { tx, status, restarts }
    }

    /// Runs a batch of rows; waits for the result however the worker fares.
    pub async fn run(&self, rows: Vec<Row>) -> Result<RunOutput, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Command_::Run { rows, reply }).await.map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)?
    }

    /// The engine's current state.
    pub fn status(&self) -> EngineStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_else(|e| e.into_inner().clone())
    }

    /// Every restart so far.
    pub fn restarts(&self) -> Vec<RestartRecord> {
        self.restarts.lock().map(|r| r.clone()).unwrap_or_else(|e| e.into_inner().clone())
    }
}

struct Driver {
    config: EngineConfig,
    sup: Supervisor,
    rx: mpsc::Receiver<Command_>,
    pending: HashMap<CallId, Pending>,
    next_call: CallId,
    /// The supervisor's live timer: arming one supersedes the previous (it bumps the generation).
    timer: Option<(Instant, Timer)>,
    worker: Option<Worker>,
    next_instance: u64,
    status: Arc<Mutex<EngineStatus>>,
    restarts: Arc<Mutex<Vec<RestartRecord>>>,
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

impl Driver {
    async fn run(mut self) {
        let (wtx, mut wrx) = mpsc::channel::<(u64, WorkerMsg)>(64);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        self.apply(Event::Start, &wtx).await;
        loop {
            let next_timer = self.timer.map(|(at, _)| at);
            let sleep = async {
                match next_timer {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                cmd = self.rx.recv() => match cmd {
                    Some(Command_::Run { rows, reply }) => {
                        let call = self.next_call;
                        self.next_call += 1;
                        self.pending.insert(call, Pending { rows, reply, sent_at: None, result: None });
                        self.apply(Event::Submit(call), &wtx).await;
                    }
                    None => break,
                },
                Some((instance, msg)) = wrx.recv() => {
                    if self.worker.as_ref().map(|w| w.instance) != Some(instance) {
                        continue; // a killed worker's last words
                    }
                    let event = match msg {
                        WorkerMsg::Frame(FromWorker::Ready { backend, .. }) => {
                            if let Ok(mut s) = self.status.lock() {
                                s.backend = Some(backend);
                            }
                            Event::Ready
                        }
                        WorkerMsg::Frame(FromWorker::LoadFailed { message }) => Event::LoadFailed(message),
                        WorkerMsg::Frame(FromWorker::Done { call, rows, .. }) => {
                            if let Some(p) = self.pending.get_mut(&call) {
                                p.result = Some(rows);
                            }
                            Event::Done(call)
                        }
                        WorkerMsg::Frame(FromWorker::Failed { call, error }) => Event::Failed(call, error),
                        WorkerMsg::Exited(how) => {
                            self.worker = None;
                            Event::Exited(how)
                        }
                    };
                    self.apply(event, &wtx).await;
                }
                _ = sleep => {
                    if let Some((_, t)) = self.timer.take() {
                        self.apply(Event::Timer(t), &wtx).await;
                    }
                }
                _ = tick.tick() => self.apply(Event::Tick, &wtx).await,
            }
        }
        // The agent dropped the engine: stop the worker.
        self.kill();
    }

    fn kill(&mut self) {
        if let Some(mut w) = self.worker.take()
            && let Some(k) = w.kill.take()
        {
            let _ = k.send(());
        }
    }

    async fn apply(&mut self, event: Event, wtx: &mpsc::Sender<(u64, WorkerMsg)>) {
        let mut queue = vec![event];
        while let Some(event) = queue.pop() {
            let actions = self.sup.handle(Instant::now(), event);
            for action in actions {
                if let Some(follow_up) = self.act(action, wtx).await {
                    queue.push(follow_up);
                }
            }
        }
        if let Ok(mut s) = self.status.lock() {
            s.role = self.sup.role();
            s.degraded = self.sup.degraded();
            s.worker = self.sup.state();
            s.queued = self.sup.queued();
        }
    }

    /// Performs one action; a failure to do it comes back as an event.
    async fn act(&mut self, action: Action, wtx: &mpsc::Sender<(u64, WorkerMsg)>) -> Option<Event> {
        match action {
            Action::Spawn(role) => {
                let spec = match role {
                    Role::Primary => &self.config.primary,
                    Role::Fallback => self.config.fallback.as_ref().unwrap_or(&self.config.primary),
                };
                let mut cmd = Command::new(&spec.program);
                cmd.args(&spec.args)
                    .envs(spec.env.iter().cloned())
                    .env_remove("NOTIFY_SOCKET") // only the agent talks to systemd (NotifyAccess=main)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .kill_on_drop(true);
                let mut child = match cmd.spawn() {
                    Ok(c) => c,
                    Err(e) => return Some(Event::LoadFailed(format!("cannot start {}: {e}", spec.program.display()))),
                };
                let instance = self.next_instance;
                self.next_instance += 1;
                let (Some(stdin), Some(mut stdout)) = (child.stdin.take(), child.stdout.take()) else {
                    return Some(Event::LoadFailed("the worker has no pipes".into()));
                };
                if let Ok(mut s) = self.status.lock() {
                    s.worker_pid = child.id();
                    s.backend = None;
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
                        if frames.send((instance, msg)).await.is_err() || garbled {
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
                            // exit: the reader sends them before it sees EOF. Without this wait a
                            // worker that reports a load failure and exits could be taken for a crash.
                            // A grandchild holding the pipe open must not stall us, hence the bound.
                            let _ = tokio::time::timeout(LAST_WORDS, reader).await;
                            let _ = exits.send((instance, WorkerMsg::Exited(how))).await;
                        }
                        _ = kill_rx => {
                            let _ = child.start_kill();
                            let _ = child.wait().await; // reap: no zombie
                        }
                    }
                });
                self.worker = Some(Worker { instance, stdin, kill: Some(kill_tx) });
                None
            }
            Action::Kill => {
                self.kill();
                None
            }
            Action::Send(call) => {
                let frame = match self.pending.get_mut(&call) {
                    Some(p) => {
                        p.sent_at = Some(Instant::now());
                        ToWorker::Run { call, rows: p.rows.clone() }.encode()
                    }
                    None => return None,
                };
                if let Some(w) = self.worker.as_mut() {
                    // A broken pipe means the worker died: its exit event follows.
                    let _ = w.stdin.write_all(&frame).await;
                    let _ = w.stdin.flush().await;
                }
                None
            }
            Action::SetTimer(t, after) => {
                self.timer = Some((Instant::now() + after, t));
                None
            }
            Action::Deliver(call) => {
                if let Some(p) = self.pending.remove(&call) {
                    let elapsed = p.sent_at.map(|t| t.elapsed()).unwrap_or_default();
                    let out = RunOutput { rows: p.result.unwrap_or_default(), role: self.sup.role(), elapsed };
                    let _ = p.reply.send(Ok(out));
                }
                None
            }
            Action::Reject(call, error) => {
                if let Some(p) = self.pending.remove(&call) {
                    let _ = p.reply.send(Err(match error {
                        CallError::Input(m) => EngineError::Input(m),
                        CallError::Unavailable(m) => EngineError::Unavailable(m),
                    }));
                }
                None
            }
            Action::Restarted(role, reason) => {
                if let Ok(mut r) = self.restarts.lock() {
                    r.push(RestartRecord { role, reason });
                }
                if let Ok(mut s) = self.status.lock() {
                    s.restarts = self.sup.restart_counts().iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
                }
                None
            }
            Action::Degraded(_) => None,
        }
    }
}
