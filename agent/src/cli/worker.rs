//! `laya-edge worker` (hidden, not for humans): hosts one backend for a supervising agent and
//! speaks frames on stdin/stdout (`crate::engine::worker`). Its settings are the agent's
//! effective configuration, handed over in `$LAYA_WORKER_CONFIG` (`crate::backends`); the
//! flags name the backend and model and override the fault and thread keys (tests, benchmarks).
//!
//! A worker never outlives its agent: it holds the NPU, and a stray one would keep it from the
//! next agent. It asks the kernel for SIGKILL when its parent dies, then checks that the parent
//! it was started for is still its parent (it may have died before the request was made).

use std::path::PathBuf;

use crate::backend;
use crate::config::BackendKind;
use crate::config::Config;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, value_enum)]
    backend: BackendKind,
    #[arg(long)]
    model: PathBuf,
    /// Faults to inject (null backend), e.g. `hang@3` (overrides engine.null_faults).
    #[arg(long)]
    faults: Option<String>,
    /// Overrides engine.threads.
    #[arg(long)]
    threads: Option<usize>,
    /// The agent's process id: the worker exits at once if that is not its parent any more.
    #[arg(long)]
    parent: Option<u32>,
}

impl Args {
    /// The agent's configuration with the flags applied.
    pub fn config(&self) -> Result<Config, String> {
        let mut config = crate::engine::spec::worker_config().map_err(|e| e.to_string())?;
        config.model.dir = self.model.to_path_buf();
        if let Some(f) = &self.faults {
            config.engine.null_faults = f.clone();
        }
        if let Some(t) = self.threads {
            config.engine.threads = t;
        }
        Ok(config)
    }
}

pub fn run(args: Args, config: Config) -> Result<(), String> {
    // Everything this worker logs names its backend (the agent adds its pid and role).
    let _lifetime = tracing::info_span!("worker", backend = args.backend.name()).entered();
    // Before the backend's thread pool starts: its threads share one arena's freed blocks.
    crate::platform::heap::one_arena();
    die_with_parent(args.parent)?;
    if args.parent.is_some() {
        leave_stopping_to_the_agent();
    }
    backend::set_threads(config.engine.threads)?;
    tracing::debug!(pid = std::process::id(), backend = args.backend.name(), model = %config.model.dir.display(), "worker: loading the backend");
    crate::engine::worker::serve(
        || backend::load(args.backend, &config),
        std::io::stdin().lock(),
        std::io::stdout().lock(),
    )
    .map_err(|e| e.to_string())
}

/// Ignores SIGINT and SIGTERM. Ctrl-C signals the whole foreground process group and systemd's
/// default stop (KillMode=control-group) signals every process of the unit: the worker must not
/// die under the call it is computing while the agent gives questions in progress
/// `mqtt.shutdown_grace_s`. The agent ends it (SIGKILL on drop, and PR_SET_PDEATHSIG when the
/// agent exits).
fn leave_stopping_to_the_agent() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: signal() with SIG_IGN installs no handler of ours (no code runs on delivery)
        // and touches no memory of this process; SIGINT and SIGTERM are valid signal numbers.
        let previous = unsafe { libc::signal(signal, libc::SIG_IGN) };
        if previous == libc::SIG_ERR {
            tracing::warn!(signal, error = %std::io::Error::last_os_error(), "worker: cannot ignore a stop signal");
        }
    }
}

/// SIGKILL when the parent dies; an error if `parent` already has (this process was adopted).
///
/// The kernel sends the signal when the *thread* that started this process exits: the agent
/// starts workers from its runtime threads, which live as long as the agent.
fn die_with_parent(parent: Option<u32>) -> Result<(), String> {
    // SAFETY: prctl(PR_SET_PDEATHSIG, signal) takes the signal number by value (as an unsigned
    // long) and reads or writes no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    if rc != 0 {
        return Err(format!("cannot ask to be killed with the agent: {}", std::io::Error::last_os_error()));
    }
    match parent {
        Some(agent) if std::os::unix::process::parent_id() != agent => {
            Err(format!("the agent (pid {agent}) exited before its worker started; exiting"))
        }
        _ => Ok(()),
    }
}
