//! Supervision of the worker process that runs a backend, and nothing else.
//!
//! NPU runtimes hang and crash, so the backend runs in a worker process ([`worker`], speaking
//! [`protocol`]'s frames) that the agent can kill. [`Engine`] is the agent's handle: calls in,
//! results out, status readable at any time. Behind it the [`supervisor`] (a pure state machine)
//! decides what to do, `driver.rs` does it in one `select!` loop and `child.rs` owns the
//! processes. [`health`] and [`probe`] judge the answers. The engine sees tokens and tensors
//! only, never JSON.

mod child;
mod driver;
pub mod fidelity;
pub mod health;
pub mod probe;
pub mod probe_file;
pub mod protocol;
pub mod spec;
mod supervisor;
pub mod worker;

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use laya_topics::wire::ErrorCode;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use crate::backend::{BackendError, RowResult, SetupError};
use crate::bundle::HostBundle;
use crate::config::{BackendKind, Config, Fallback};
use crate::prompt::{Row, RowShape};
use driver::{Driver, Request, Shared};
use probe::{Probe, Report};
pub use spec::WorkerSpec;
use supervisor::Supervisor;
pub use supervisor::{Asker, BackendState, Notice, NoticeKind, Policy, RestartReason, Role, WorkerState};

/// The engine's configuration.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The supervision policy ([`Policy::from_config`], the queue limit `limits.queue`'s); the
    /// health call's rows and the probe's cadence in it are this configuration's (`health` and
    /// `probe`, `probe_every`).
    pub policy: Policy,
    pub primary: WorkerSpec,
    /// The CPU worker used while the primary is degraded (`policy.fallback` must be set).
    pub fallback: Option<WorkerSpec>,
    /// The health call every new worker answers before any question: two different valid rows
    /// (`engine::health::rows`); empty for none.
    pub health: Vec<Row>,
    /// The bundle's probe: run after the health rows in every health call, and every
    /// `probe_every` on the serving worker; a worker that fails it is treated as broken.
    pub probe: Option<Arc<Probe>>,
    /// How often the serving worker runs the probe again (`probe.interval_min`; none: only at start).
    pub probe_every: Option<Duration>,
    /// The graphs the probe's rows are judged on, each on its own rows (the bundle's graphs that
    /// run rows, `probe::probed_graphs`); `None`: all rows together (no graphs).
    pub probe_graphs: Option<Vec<RowShape>>,
    /// The graphs the primary runs rows on (an NPU bundle's usable graphs; `None`: a
    /// checkpoint), which say what a row costs in the deadlines ([`EngineConfig::units`]).
    pub graphs: Option<Vec<RowShape>>,
}

impl EngineConfig {
    /// A primary backend alone: no fallback, no health call, the policy's queue limit.
    pub fn new(policy: Policy, primary: WorkerSpec) -> EngineConfig {
        EngineConfig {
            policy,
            primary,
            fallback: None,
            health: Vec::new(),
            probe: None,
            probe_every: None,
            probe_graphs: None,
            graphs: None,
        }
    }

    /// The engine for `config`, its workers started from `program`: its backend in a worker,
    /// and a CPU worker as the fallback when `engine.fallback = "cpu"`, the backend is not the
    /// CPU already, and `bundle` has a checkpoint; the health call's rows and the probe from
    /// `bundle`.
    pub fn from_config(program: &Path, config: &Config, bundle: &HostBundle) -> Result<EngineConfig, SetupError> {
        let kind = config.engine.backend;
        let fallback =
            (config.engine.fallback == Fallback::Cpu && kind != BackendKind::Cpu && bundle.checkpoint.is_some())
                .then(|| spec::worker_spec(program, BackendKind::Cpu, config))
                .transpose()?;
        Ok(EngineConfig {
            policy: Policy::from_config(config, fallback.is_some()),
            primary: spec::worker_spec(program, kind, config)?,
            fallback,
            health: health::rows(&bundle.tokenizer, bundle.config.limits).map_err(SetupError::Health)?,
            probe: probe_file::of_bundle(bundle).map_err(|e| SetupError::Probe(e.to_string()))?.map(Arc::new),
            probe_every: (config.probe.interval_min > 0).then(|| Duration::from_secs(config.probe.interval_min * 60)),
            probe_graphs: probe::probed_graphs(&bundle.capacity),
            graphs: bundle.capacity.shapes.clone(),
        })
    }

    /// What `rows` cost the deadlines, in rows on the shortest of [`EngineConfig::graphs`]: a row
    /// counts its graph's length over the shortest's (on the QNN bundles' 128- and 256-token
    /// graphs, 1 and 2: the encoder's work grows with the tokens it runs, and its attention
    /// share at these lengths is small); one without graphs, or that fits none (the worker
    /// refuses it), 1.
    pub fn units(&self, rows: &[Row]) -> f64 {
        let Some(graphs) = self.graphs.as_deref() else { return rows.len() as f64 };
        let Some(shortest) = graphs.iter().map(|g| g.seq_len).min().filter(|&l| l > 0) else {
            return rows.len() as f64;
        };
        rows.iter().map(|r| probe::graph_of(graphs, r).map_or(1.0, |g| g.seq_len as f64 / shortest as f64)).sum()
    }

    /// What the supervisor runs with: [`EngineConfig::policy`] with what this configuration
    /// decides (the health call's rows, the probe's cadence), and the health
    /// call's rows (the health rows, then the probe's).
    fn supervision(&self) -> (Policy, Vec<Row>) {
        let mut policy = self.policy.clone();
        let mut health_rows = self.health.clone();
        if let Some(p) = &self.probe {
            health_rows.extend(p.rows.iter().cloned());
        }
        policy.health_rows = health_rows.len();
        policy.health_units = self.units(&health_rows);
        policy.probe_every = self.probe_every.filter(|_| self.probe.is_some());
        (policy, health_rows)
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

/// Why a call failed: the supervisor's refusals ([`supervisor::Action::Reject`]), and the
/// engine having stopped. One type from the supervisor to the service, with one mapping to what
/// a client sees ([`ErrorCode`]) and one to what a synchronous caller sees ([`BackendError`]),
/// both below.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The rows were refused by the model: the caller's fault.
    #[error("the model rejected the input: {0}")]
    Input(String),
    /// No healthy backend could answer (retryable); the message says why and when the next try is.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// The engine's queue is full.
    #[error("the engine is overloaded: {0}")]
    Overloaded(String),
    /// The caller's deadline passed before the call reached a worker.
    #[error("the deadline passed before the call reached the backend")]
    Expired,
    /// The call failed fatally twice (crash, deadline or fatal error on both attempts, on two
    /// workers): it is quarantined, answered with this error and not run again.
    #[error("the backend failed on this request: {0}")]
    Quarantined(String),
    /// The engine's driver is gone (the engine was dropped, or its runtime shut down).
    #[error("the engine has stopped")]
    Stopped,
}

/// The error code a client is answered with when its call fails so: its own fault
/// (`bad_request`), its deadline, a full queue, a request that killed the backend twice
/// (`internal`), or no backend to answer (`backend_unavailable`, retryable).
impl From<&EngineError> for ErrorCode {
    fn from(e: &EngineError) -> ErrorCode {
        match e {
            EngineError::Input(_) => ErrorCode::BadRequest,
            EngineError::Expired => ErrorCode::DeadlineExceeded,
            EngineError::Overloaded(_) => ErrorCode::Overloaded,
            EngineError::Quarantined(_) => ErrorCode::Internal,
            EngineError::Unavailable(_) | EngineError::Stopped => ErrorCode::BackendUnavailable,
        }
    }
}

/// The backend error a synchronous caller of the engine (`predict`, `probe` through a worker)
/// sees, as `serve` answers: a backend that is restarting, degraded or overloaded is retryable
/// (`Transient`); a request that killed the worker twice, or whose deadline passed in the queue,
/// is `Fatal`.
impl From<EngineError> for BackendError {
    fn from(e: EngineError) -> BackendError {
        match e {
            EngineError::Input(m) => BackendError::Input(m),
            e @ (EngineError::Unavailable(_) | EngineError::Overloaded(_) | EngineError::Stopped) => {
                BackendError::Transient(e.to_string())
            }
            other => BackendError::Fatal { code: None, message: other.to_string() },
        }
    }
}

/// A restart, for telemetry and events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartRecord {
    pub role: Role,
    pub reason: RestartReason,
}

/// How many restart records are kept (the counts are kept for ever).
pub const RESTARTS_KEPT: usize = 64;

/// The restarts so far, written by the driver, read through the handle.
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
    /// Each role's probe runs (the primary's first): its last run and its last failed one, so
    /// the fallback's passing run after a degradation does not hide the primary's failure.
    pub probes: Vec<ProbeRuns>,
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

/// One role's probe runs, as telemetry reports them.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeRuns {
    /// The role's last run.
    pub last: ProbeRun,
    /// The role's last failed run, kept however many runs passed since.
    pub last_failure: Option<ProbeRun>,
}

impl ProbeRuns {
    /// `probes` (one entry per role, the primary's first) with `run` recorded.
    pub fn record(probes: &mut Vec<ProbeRuns>, run: &ProbeRun) {
        let failure = (!run.passed()).then(|| run.clone());
        match probes.iter_mut().find(|p| p.last.role == run.role) {
            Some(p) => {
                p.last = run.clone();
                if failure.is_some() {
                    p.last_failure = failure;
                }
            }
            None => {
                probes.push(ProbeRuns { last: run.clone(), last_failure: failure });
                probes.sort_by_key(|p| p.last.role != Role::Primary);
            }
        }
    }
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
    /// Closed once the driver ended and every worker it started was reaped ([`Engine::stopped`]).
    stopped: watch::Receiver<()>,
}

/// See [`Engine::notices`] and [`Engine::probe_runs`].
#[derive(Default)]
struct FirstReceivers {
    notices: Option<broadcast::Receiver<Notice>>,
    probes: Option<broadcast::Receiver<ProbeRun>>,
}

impl Engine {
    /// Starts the engine on the current tokio runtime (it spawns the first worker at once).
    pub fn start(config: EngineConfig) -> Engine {
        let (tx, rx) = mpsc::channel(1024);
        let (policy, health_rows) = config.supervision();
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
            probes: Vec::new(),
            busy_total: Duration::ZERO,
            busy_since: None,
        }));
        let restarts = Arc::new(Mutex::new(RestartLog::default()));
        let (notices, first_notices) = broadcast::channel(256);
        let (probes, first_probes) = broadcast::channel(64);
        let first = Arc::new(Mutex::new(FirstReceivers { notices: Some(first_notices), probes: Some(first_probes) }));
        let (state_tx, state) = watch::channel(BackendState::Starting);
        let (lifetime, stopped) = watch::channel(());
        let shared = Shared {
            status: status.clone(),
            restarts: restarts.clone(),
            notices: notices.clone(),
            probes: probes.clone(),
            state: state_tx,
            lifetime: Arc::new(lifetime),
        };
        let driver = Driver::new(config, sup, health_rows, rx, shared);
        tokio::spawn(driver.run());
        Engine { tx, status, restarts, notices, probes, first, state, stopped }
    }

    /// Runs a batch of rows; waits for the result however the workers fare. A call whose
    /// `deadline` passes while it is queued, or whose caller stops waiting, never reaches a worker.
    pub async fn run(&self, rows: Vec<Row>, deadline: Option<Instant>) -> Result<RunOutput, EngineError> {
        self.run_as(Asker::default(), rows, deadline).await
    }

    /// [`Engine::run`] for `asker`: its calls take their turns with other askers' in the queue.
    pub async fn run_as(
        &self,
        asker: Asker,
        rows: Vec<Row>,
        deadline: Option<Instant>,
    ) -> Result<RunOutput, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Request::Run { rows, deadline, asker, reply }).await.map_err(|_| EngineError::Stopped)?;
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

    /// Resolves once this engine has stopped: its last handle dropped, its driver ended and every
    /// worker process it started killed and reaped. The future holds no handle, so it can be
    /// awaited after the engine is dropped (a reload waits on it before it starts another
    /// candidate: never two candidate models loaded at once).
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut lifetime = self.stopped.clone();
        async move { while lifetime.changed().await.is_ok() {} }
    }

    /// The backend's state (`starting | ready | degraded`), to be told when it changes.
    pub fn backend_state(&self) -> watch::Receiver<BackendState> {
        self.state.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_error() -> [EngineError; 6] {
        [
            EngineError::Input("bad row".into()),
            EngineError::Unavailable("restarting".into()),
            EngineError::Overloaded("full".into()),
            EngineError::Expired,
            EngineError::Quarantined("twice".into()),
            EngineError::Stopped,
        ]
    }

    #[test]
    fn a_row_costs_its_graphs_length_over_the_shortest_and_one_without_graphs() {
        let row = |tokens: usize| Row {
            input_ids: vec![7; tokens],
            marker_pos: vec![1, 2],
            qtype: crate::prompt::QType::Choice,
            layout: None,
        };
        let rows = [row(40), row(128), row(129), row(256), row(300)];
        let spec = WorkerSpec { program: "laya-edge".into(), args: Vec::new(), env: Vec::new() };
        let mut config = EngineConfig::new(Policy::default(), spec);
        assert_eq!(config.units(&rows), 5.0, "a checkpoint: one a row");
        let graph = |seq_len| RowShape { seq_len, marker_slots: None };
        config.graphs = Some(vec![graph(256), graph(128)]);
        // 128, 128, 256, 256, and none for the 300-token row (refused by the worker): 1 + 1 + 2 + 2 + 1.
        assert_eq!(config.units(&rows), 7.0);
        config.graphs = Some(vec![graph(512)]);
        assert_eq!(config.units(&rows), 5.0, "one graph: one a row");
    }

    #[test]
    fn each_engine_error_has_the_wire_code_clients_have_always_seen() {
        let codes: Vec<&str> = every_error().iter().map(|e| ErrorCode::from(e).as_str()).collect();
        assert_eq!(
            codes,
            [
                "bad_request",
                "backend_unavailable",
                "overloaded",
                "deadline_exceeded",
                "internal",
                "backend_unavailable"
            ]
        );
    }

    #[test]
    fn a_synchronous_caller_may_retry_what_serve_calls_retryable_and_no_more() {
        let kinds: Vec<&str> = every_error()
            .into_iter()
            .map(|e| match BackendError::from(e) {
                BackendError::Input(_) => "input",
                BackendError::Transient(_) => "transient",
                BackendError::Fatal { .. } => "fatal",
            })
            .collect();
        assert_eq!(kinds, ["input", "transient", "transient", "fatal", "fatal", "transient"]);
        assert_eq!(BackendError::from(EngineError::Input("bad row".into())), BackendError::Input("bad row".into()));
    }

    fn run(role: Role, backend: &str, error: Option<&str>) -> ProbeRun {
        ProbeRun { role, backend: backend.into(), rows: 4, report: None, error: error.map(str::to_owned) }
    }

    #[test]
    fn each_roles_last_probe_run_is_kept_with_its_last_failure_after_the_fallback_passes() {
        let mut probes = Vec::new();
        // The primary fails (no report: "failed" either way), degrades; the fallback passes.
        ProbeRuns::record(&mut probes, &run(Role::Primary, "qnn", Some("graph 256 collapsed")));
        let mut passing = run(Role::Fallback, "cpu", None);
        passing.report =
            Some(Probe { rows: vec![], expected: vec![], thresholds: Default::default() }.judge(&[], None));
        assert!(passing.passed(), "{:?}", passing.report);
        ProbeRuns::record(&mut probes, &passing);
        ProbeRuns::record(&mut probes, &passing);
        let roles: Vec<Role> = probes.iter().map(|p| p.last.role).collect();
        assert_eq!(roles, [Role::Primary, Role::Fallback], "the primary's first");
        assert_eq!(probes[0].last.error.as_deref(), Some("graph 256 collapsed"));
        assert_eq!(probes[0].last_failure, Some(probes[0].last.clone()));
        assert_eq!(probes[1].last_failure, None);
        // A candidate primary that passes: its last run passes, its last failure is kept.
        let mut recovered = passing.clone();
        recovered.role = Role::Primary;
        recovered.backend = "qnn".into();
        ProbeRuns::record(&mut probes, &recovered);
        assert!(probes[0].last.passed());
        assert_eq!(probes[0].last_failure.as_ref().and_then(|f| f.error.as_deref()), Some("graph 256 collapsed"));
        // The fallback first, then the primary: still the primary's first.
        let mut other = Vec::new();
        ProbeRuns::record(&mut other, &passing);
        ProbeRuns::record(&mut other, &recovered);
        assert_eq!(other.iter().map(|p| p.last.role).collect::<Vec<_>>(), [Role::Primary, Role::Fallback]);
    }
}
