//! What answers questions, and replacing it while serving (SIGHUP).
//!
//! [`Serving`] is a bundle with the engine running it; [`Current`] holds the one in use. A
//! [`Reload`] candidate is started beside it and takes over only once its engine passed its
//! health call ([`until_ready`]); a question keeps the `Serving` it started with, so the old
//! engine lives until its last question is answered. A reload applies only what can change
//! without a restart ([`reload_refusal`]).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use super::telemetry::{Identity, Served};
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

    /// What the status document says is served.
    pub fn served(&self) -> Served<'_> {
        Served { backend: &self.backend, model: self.bundle.dir.display().to_string(), identity: &self.identity }
    }
}

/// The [`Serving`] in use. A std lock, held only to clone or swap the `Arc` (never across an
/// await).
pub struct Current(RwLock<Arc<Serving>>);

impl Current {
    pub fn new(serving: Serving) -> Current {
        Current(RwLock::new(Arc::new(serving)))
    }

    /// What answers questions now.
    pub fn get(&self) -> Arc<Serving> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Serves `next` from now on; the one it replaces stops once its last question is answered
    /// (its last handle is dropped then).
    pub fn replace(&self, next: Arc<Serving>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = next;
    }
}

/// A reload's candidate, made by the command line from the re-read configuration: the new
/// configuration, its bundle and the engine to start for it; or why none could be made.
pub enum Reload {
    Candidate { config: Box<Config>, bundle: Arc<HostBundle>, engine: Box<EngineConfig> },
    Failed(String),
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
    use crate::engine::supervisor::{BackendState, NoticeKind};
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
    }

    #[test]
    fn a_reloads_engine_gets_its_start_up_time_its_first_inference_and_a_minute() {
        let mut c = Config::default();
        c.engine.startup_timeout_s = 30;
        c.engine.load_allowance_ms = 500;
        assert_eq!(reload_allowance(&c), Duration::from_millis(90_500));
    }
}
