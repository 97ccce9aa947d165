//! What answers questions, and replacing it while serving (SIGHUP) as a transaction.
//!
//! [`Serving`] is a bundle with the engine running it; [`Current`] holds the one in use. A
//! [`Reload`] request's candidate is started beside it and takes over only once its engine passed
//! its health call and probe ([`until_ready`]); a question keeps the `Serving` it started with, so
//! the old engine lives until its last question is answered. A reload applies only what can
//! change without a restart ([`reload_refusal`]).
//!
//! Reloads are transactions (systemd's job queue, Kubernetes' rollouts): [`Transaction`], without
//! I/O, keeps at most one request pending; a newer request supersedes it (its candidate is
//! stopped, a `reload_superseded` event names it), and a verdict that comes for a superseded
//! request is stale and ignored, so a slow older candidate can never overtake a newer one. Each
//! request is settled exactly once: `reloaded`, `reload_rejected` or `reload_superseded`.
//! [`Reloads`] does the I/O: a candidate's task starts only once the candidate before it has
//! stopped (its workers reaped), so at most one candidate model is ever loaded beside the
//! serving one, however fast SIGHUPs come.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use laya_topics::wire::{EngineEvent, EventKind, ReloadRef};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::events::reload_event;
use super::identity::{self, Identity, Served};
use crate::bundle::HostBundle;
use crate::config::Config;
use crate::engine::{Engine, EngineConfig};

/// What answers questions: a model bundle and the engine running it. A reload (SIGHUP) replaces
/// it whole once the new engine passed its health call; a question keeps the one it started
/// with, so the old engine lives until its last question is answered.
pub struct Serving {
    pub bundle: Arc<HostBundle>,
    pub engine: Engine,
    /// The configured backend's name (`engine.backend`).
    pub backend: String,
    /// This model's part of the status document (`model_name`, `bundle_sha256`).
    identity: Identity,
}

impl Serving {
    pub fn new(bundle: Arc<HostBundle>, engine: Engine, backend: &str) -> Serving {
        let identity = Identity::new(&bundle);
        Serving { bundle, engine, backend: backend.to_owned(), identity }
    }

    /// What the status document says is served (since when and the last reload are the
    /// service's to add).
    pub fn served(&self) -> Served<'_> {
        Served {
            backend: &self.backend,
            model: self.bundle.dir.display().to_string(),
            identity: &self.identity,
            since: 0,
            last_reload: None,
        }
    }
}

/// The [`Serving`] in use, and since when (seconds since the epoch). A std lock, held only to
/// clone or swap the `Arc` (never across an await).
pub struct Current(RwLock<(Arc<Serving>, u64)>);

impl Current {
    pub fn new(serving: Serving) -> Current {
        Current(RwLock::new((Arc::new(serving), identity::epoch_s())))
    }

    /// What answers questions now.
    pub fn get(&self) -> Arc<Serving> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).0.clone()
    }

    /// Since when it answers them.
    pub fn since(&self) -> u64 {
        self.0.read().unwrap_or_else(|e| e.into_inner()).1
    }

    /// Serves `next` from now on; the one it replaces stops once its last question is answered
    /// (its last handle is dropped then).
    pub fn replace(&self, next: Arc<Serving>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = (next, identity::epoch_s());
    }
}

/// A reload request, made by the command line from the re-read configuration (one per SIGHUP it
/// acts on, numbered from 1 in `request`): the new configuration, its bundle and the engine to
/// start for it; or why none could be made.
pub enum Reload {
    Candidate { request: ReloadRef, config: Box<Config>, bundle: Arc<HostBundle>, engine: Box<EngineConfig> },
    Failed { request: ReloadRef, why: String },
}

/// The reload transaction's state, without I/O: the one pending request, if any, and the newest
/// request seen.
#[derive(Debug, Default)]
pub struct Transaction {
    pending: Option<ReloadRef>,
    newest: u64,
}

/// What a new request does to the transaction.
#[derive(Debug, PartialEq, Eq)]
pub enum Begun {
    /// It is the newest: it goes on, superseding the pending one if any.
    Newest { superseded: Option<ReloadRef> },
    /// A request older than one already seen (never from one command line): ignored.
    Stale,
}

impl Transaction {
    /// A request arrived. It becomes the pending one only if it starts a candidate
    /// (`starts`); a request that fails or is refused at once supersedes the pending one all the
    /// same (the configuration it read is the newest) and is settled by its caller.
    pub fn begin(&mut self, request: &ReloadRef, starts: bool) -> Begun {
        if request.request <= self.newest {
            return Begun::Stale;
        }
        self.newest = request.request;
        let superseded = self.pending.take();
        if starts {
            self.pending = Some(request.clone());
        }
        Begun::Newest { superseded }
    }

    /// A candidate's verdict for `request`: `true` if it settles the pending request, `false`
    /// for a verdict of a superseded request (already settled as superseded).
    pub fn settle(&mut self, request: u64) -> bool {
        match &self.pending {
            Some(p) if p.request == request => {
                self.pending = None;
                true
            }
            _ => false,
        }
    }

    /// The request whose candidate is being started or health-checked.
    pub fn pending(&self) -> Option<&ReloadRef> {
        self.pending.as_ref()
    }
}

/// A candidate's verdict, from its task to the service loop.
pub struct Verdict {
    pub request: ReloadRef,
    pub outcome: Result<Taken, String>,
}

/// A candidate that passed, for the service to take over: the new configuration and what serves
/// it. Answer `taken` when it is taken; dropping it unanswered (a stale verdict) lets the
/// candidate's task wait for the engine to stop.
pub struct Taken {
    pub config: Box<Config>,
    pub serving: Arc<Serving>,
    pub taken: oneshot::Sender<()>,
}

/// The takeover: `taken` serves from now on (questions already on the old engine finish
/// there), the telemetry interval counts the new engine's busy time from here, and the candidate's
/// task is told. Returns the `reloaded` event and the configuration that now serves.
pub fn take_over(
    current: &Current,
    request: ReloadRef,
    taken: Taken,
    interval: &std::sync::Mutex<super::telemetry::Interval>,
) -> (EngineEvent, Config) {
    let candidate = taken.serving;
    let message = format!(
        "now serving {} on the {} backend (the new engine passed its health call)",
        candidate.bundle.dir.display(),
        candidate.backend
    );
    tracing::info!(%message, "reload: taking over");
    if let Ok(mut i) = interval.lock() {
        i.engine_changed(candidate.engine.busy_time());
    }
    current.replace(candidate);
    let _ = taken.taken.send(());
    (reload_event(EventKind::Reloaded, request, message), *taken.config)
}

/// What the service loop does with a verdict.
pub enum Settled {
    /// Serve this candidate from now on, then publish `reloaded`.
    TakeOver(ReloadRef, Taken),
    /// Publish this `reload_rejected`.
    Rejected(Box<EngineEvent>),
    /// A superseded request's verdict: nothing (it was settled when it was superseded).
    Stale,
}

/// The bound on waiting for a stopped candidate's workers to be reaped (a SIGKILL and a wait).
const STOP_BOUND: Duration = Duration::from_secs(10);

/// The reload transactions of one service: the pure [`Transaction`] and the candidates' tasks.
pub struct Reloads {
    tx: Transaction,
    /// Cancels the pending candidate's task (sent or dropped).
    cancel: Option<oneshot::Sender<()>>,
    /// The newest candidate's task: the next candidate starts only once it has ended, and it ends
    /// only once its engine stopped or was taken over.
    last_task: Option<JoinHandle<()>>,
    verdicts: mpsc::UnboundedSender<Verdict>,
}

impl Reloads {
    /// Verdicts go to `verdicts`, for the service loop's [`Reloads::settle`].
    pub fn new(verdicts: mpsc::UnboundedSender<Verdict>) -> Reloads {
        Reloads { tx: Transaction::default(), cancel: None, last_task: None, verdicts }
    }

    /// A new request: the events to publish now (what it supersedes, and its own refusal if it
    /// cannot be applied); its candidate, if it has one, is started once the one before it has
    /// stopped.
    pub fn request(&mut self, reload: Reload, serving: &Config) -> Vec<EngineEvent> {
        let (request, refused) = match &reload {
            Reload::Failed { request, why } => (request.clone(), Some(why.clone())),
            Reload::Candidate { request, config, .. } => (request.clone(), reload_refusal(serving, config)),
        };
        let superseded = match self.tx.begin(&request, refused.is_none()) {
            Begun::Stale => {
                tracing::warn!(request = request.request, "an older reload request came after a newer one: ignored");
                return Vec::new();
            }
            Begun::Newest { superseded } => superseded,
        };
        let mut events = Vec::new();
        if let Some(old) = superseded {
            // Its task stops its engine; the next candidate waits for that.
            self.cancel = None;
            let message = format!(
                "reload {} ({}) was superseded by reload {} before its engine passed its health call; its worker was stopped",
                old.request,
                old.model.as_deref().unwrap_or("?"),
                request.request
            );
            events.push(reload_event(EventKind::ReloadSuperseded, old, message));
        }
        match (reload, refused) {
            (_, Some(why)) => events.push(reload_event(EventKind::ReloadRejected, request, why)),
            (Reload::Candidate { request, config, bundle, engine }, None) => {
                tracing::info!(request = request.request, model = %bundle.dir.display(), "reload: starting the new engine beside the serving one");
                let (cancel, cancelled) = oneshot::channel();
                self.cancel = Some(cancel);
                let before = self.last_task.take();
                let verdicts = self.verdicts.clone();
                self.last_task =
                    Some(tokio::spawn(candidate(before, cancelled, request, config, bundle, engine, verdicts)));
            }
            (Reload::Failed { .. }, None) => {}
        }
        events
    }

    /// A candidate's verdict, settled: a stale one is dropped (its task then waits for its
    /// engine to stop).
    pub fn settle(&mut self, verdict: Verdict) -> Settled {
        if !self.tx.settle(verdict.request.request) {
            tracing::debug!(request = verdict.request.request, "a superseded reload's verdict: ignored");
            return Settled::Stale;
        }
        self.cancel = None;
        match verdict.outcome {
            Ok(taken) => Settled::TakeOver(verdict.request, taken),
            Err(why) => Settled::Rejected(Box::new(reload_event(
                EventKind::ReloadRejected,
                verdict.request,
                format!("the new engine failed its health call: {why}"),
            ))),
        }
    }
}

/// A candidate's task: waits for the candidate before it to stop, starts the engine, waits for
/// its verdict (or its cancellation) and sends it; it ends once its engine has stopped, or was
/// taken over.
async fn candidate(
    before: Option<JoinHandle<()>>,
    mut cancelled: oneshot::Receiver<()>,
    request: ReloadRef,
    config: Box<Config>,
    bundle: Arc<HostBundle>,
    engine: Box<EngineConfig>,
    verdicts: mpsc::UnboundedSender<Verdict>,
) {
    // Never two candidates loaded at once: the one before has stopped (bounded: its task ends
    // within STOP_BOUND of being cancelled).
    if let Some(before) = before {
        let _ = before.await;
    }
    if !matches!(cancelled.try_recv(), Err(oneshot::error::TryRecvError::Empty)) {
        return; // superseded while it waited: never started
    }
    let serving = Arc::new(Serving::new(bundle, Engine::start(*engine), config.engine.backend.name()));
    let stopped = serving.engine.stopped();
    let within = reload_allowance(&config);
    let n = request.request;
    let verdict = tokio::select! {
        verdict = until_ready(&serving.engine, within) => Some(verdict),
        _ = &mut cancelled => None,
    };
    match verdict {
        Some(Ok(())) => {
            let (taken, was_taken) = oneshot::channel();
            let _ = verdicts.send(Verdict { request, outcome: Ok(Taken { config, serving, taken }) });
            if was_taken.await.is_ok() {
                return; // the service's engine now
            }
        }
        Some(Err(why)) => {
            // The rejection is published once the rejected worker is gone.
            drop(serving);
            stop_within(stopped, n).await;
            let _ = verdicts.send(Verdict { request, outcome: Err(why) });
            return;
        }
        None => drop(serving),
    }
    stop_within(stopped, n).await;
}

/// Waits for a dropped candidate's engine to stop, up to [`STOP_BOUND`].
async fn stop_within(stopped: impl std::future::Future<Output = ()>, request: u64) {
    if tokio::time::timeout(STOP_BOUND, stopped).await.is_err() {
        tracing::warn!(request, "a reload candidate's worker was not reaped within {} s", STOP_BOUND.as_secs());
    }
}
/// Why a reload's configuration cannot be applied without a restart, if it cannot: the broker
/// connection (`[mqtt]`), the queue and limits it announced and admits by (`[limits]`) and the
/// log filter are set at start. What a reload applies: `[model]`, `[engine]`, `[rknn]`, `[qnn]`,
/// `[probe]`.
pub fn reload_refusal(serving: &Config, new: &Config) -> Option<String> {
    let changed: Vec<&str> = [
        ("[mqtt]", serving.mqtt != new.mqtt),
        ("[limits]", serving.limits != new.limits),
        ("[log]", serving.log != new.log),
        // The HTTP door's listener and the thin-edge bridge's connection are opened at start.
        ("[http]", serving.http != new.http),
        ("[thin_edge]", serving.thin_edge != new.thin_edge),
    ]
    .into_iter()
    .filter_map(|(section, differs)| differs.then_some(section))
    .collect();
    (!changed.is_empty()).then(|| {
        format!(
            "the new configuration changes {}, which only a restart applies; nothing was reloaded (a reload applies [model], [engine], [rknn], [qnn] and [probe])",
            changed.join(", ")
        )
    })
}

/// How long a reload's engine may take to pass its first health call: loading
/// (`startup_timeout_s`), the first inference's allowance, and a minute for the health rows and
/// the probe.
pub fn reload_allowance(config: &Config) -> Duration {
    Duration::from_secs(config.engine.startup_timeout_s)
        + Duration::from_millis(config.engine.load_allowance_ms)
        + Duration::from_secs(60)
}

/// Waits for a new engine's verdict: `Ok` once it is ready (its worker loaded and passed its
/// health call and probe), the reason of its first failure (a restart, or degradation), or a
/// time-out after `within`.
pub async fn until_ready(engine: &Engine, within: Duration) -> Result<(), String> {
    use crate::engine::{BackendState, NoticeKind};
    use tokio::sync::broadcast::error::RecvError;
    let mut state = engine.backend_state();
    let mut notices = engine.notices();
    let wait = async {
        loop {
            match *state.borrow_and_update() {
                BackendState::Ready => return Ok(()),
                BackendState::Degraded => return Err("the new backend is degraded".to_owned()),
                BackendState::Starting => {}
            }
            tokio::select! {
                changed = state.changed() => if changed.is_err() {
                    return Err("the new engine stopped".to_owned());
                },
                notice = notices.recv() => match notice {
                    Ok(n) if n.kind == NoticeKind::WorkerRestart => return Err(n.message),
                    Ok(_) | Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => return Err("the new engine stopped".to_owned()),
                },
            }
        }
    };
    match tokio::time::timeout(within, wait).await {
        Ok(verdict) => verdict,
        Err(_) => Err(format!("its worker did not pass a health call within {} s", within.as_secs())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_that_changes_only_the_model_and_engine_is_applied() {
        let serving = Config::default();
        let mut new = Config::default();
        new.model.dir = "/opt/laya/other".into();
        new.engine.startup_timeout_s += 1;
        assert_eq!(reload_refusal(&serving, &new), None);
    }

    #[test]
    fn a_reload_that_changes_the_broker_or_the_limits_is_refused_naming_both() {
        let serving = Config::default();
        let mut new = Config::default();
        new.mqtt.keep_alive_s += 1;
        new.limits.queue += 1;
        let why = reload_refusal(&serving, &new).expect("refused");
        assert!(why.contains("[mqtt], [limits]"), "{why}");
        assert!(why.contains("only a restart applies"), "{why}");
        // So is one that moves the HTTP door or the thin-edge bridge (opened at start only).
        let mut new = Config::default();
        new.http.max_connections += 1;
        new.thin_edge.service = "other".into();
        let why = reload_refusal(&serving, &new).expect("refused");
        assert!(why.contains("[http], [thin_edge]"), "{why}");
    }

    fn req(n: u64) -> ReloadRef {
        ReloadRef { request: n, model: Some(format!("/m/{n}")) }
    }

    #[test]
    fn a_newer_request_supersedes_the_pending_one_and_its_late_verdict_is_stale() {
        let mut t = Transaction::default();
        assert_eq!(t.begin(&req(1), true), Begun::Newest { superseded: None });
        assert_eq!(t.begin(&req(2), true), Begun::Newest { superseded: Some(req(1)) });
        assert_eq!(t.pending(), Some(&req(2)));
        assert!(!t.settle(1), "the older candidate's verdict, coming late, settles nothing");
        assert_eq!(t.pending(), Some(&req(2)));
        assert!(t.settle(2));
        assert!(!t.settle(2), "a request is settled once");
        assert_eq!(t.pending(), None);
    }

    #[test]
    fn a_newer_request_that_fails_at_once_still_supersedes_the_pending_one() {
        let mut t = Transaction::default();
        t.begin(&req(1), true);
        assert_eq!(t.begin(&req(2), false), Begun::Newest { superseded: Some(req(1)) });
        assert_eq!(t.pending(), None, "nothing pending: the failed request is settled by its caller");
        assert!(!t.settle(1));
        assert_eq!(t.begin(&req(3), true), Begun::Newest { superseded: None });
    }

    #[test]
    fn an_older_request_after_a_newer_one_is_ignored() {
        let mut t = Transaction::default();
        t.begin(&req(5), true);
        assert_eq!(t.begin(&req(4), true), Begun::Stale);
        assert_eq!(t.begin(&req(5), true), Begun::Stale);
        assert_eq!(t.pending(), Some(&req(5)));
    }

    #[test]
    fn a_reloads_engine_gets_its_start_up_time_its_first_inference_and_a_minute() {
        let mut c = Config::default();
        c.engine.startup_timeout_s = 30;
        c.engine.load_allowance_ms = 500;
        assert_eq!(reload_allowance(&c), Duration::from_millis(90_500));
    }
}
