//! The `laya-edge` commands, one module each; `main.rs` only parses the command line, installs
//! logging and calls a command's `run`. What several commands share is here: reading the
//! configuration file and the runtime of the commands that are clients rather than the service.

pub mod ask;
pub mod bundle;
pub mod check;
pub mod check_config;
pub mod fleet;
pub mod jsonl;
pub mod layout;
pub mod model;
pub mod predict;
pub mod probe;
pub mod serve;
pub mod worker;

use std::path::{Path, PathBuf};

use crate::backend;
use crate::backend::{Backend, BackendError, RowResult};
use crate::bundle::HostBundle;
use crate::config::{BackendKind, Config, CpuWeights, Fallback};
use crate::engine::Policy;
use crate::engine::Role;
use crate::engine::{Engine, EngineConfig};
use crate::prompt::Row;
use laya_topics::wire::LayaVersion;

/// The flags of the commands that run a model themselves (`predict`, `probe`).
#[derive(clap::Args)]
pub struct BackendArgs {
    /// The configuration file (TOML): its [model], [engine], [rknn], [qnn] and [limits]
    /// max_request_tokens keys apply; the flags below override them.
    #[arg(long)]
    config: Option<PathBuf>,
    /// A laya checkpoint directory or NPU bundle (overrides model.dir).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Which backend runs the model (overrides engine.backend; default cpu). Named here, it
    /// answers alone: engine.fallback does not apply unless --fallback cpu asks for it.
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// What answers while the backend is degraded: `cpu` (the CPU fallback, as `serve` does with
    /// engine.fallback = "cpu") or `none` (overrides engine.fallback; with --backend, default none).
    #[arg(long, value_parser = fallback)]
    fallback: Option<Fallback>,
    /// Threads for the tensor math (overrides engine.threads; default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// The laya whose semantics the model is answered with: 0.3.20 or 0.4.15 (overrides
    /// model.laya; default 0.3.20).
    #[arg(long, value_parser = laya_version)]
    laya: Option<LayaVersion>,
    /// What the CPU model's encoder multiplies with: f32 (the reference), int8 or bf16
    /// (overrides cpu.weights; default f32). The answers' `backend` names the mode (`cpu-int8`).
    #[arg(long, value_enum)]
    cpu_weights: Option<CpuWeights>,
}

/// `laya-edge --version`: the version, the git commit it was built from (when built from git),
/// the cargo features built in, the laya semantics served and the CPU model's kernel sets (products, vector passes) on
/// this machine (chosen at run time).
pub fn version() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        let features: Vec<&str> = [
            ("demo", cfg!(feature = "demo")),
            ("http", cfg!(feature = "http")),
            ("qnn", cfg!(feature = "qnn")),
            ("rknn", cfg!(feature = "rknn")),
        ]
        .into_iter()
        .filter_map(|(name, on)| on.then_some(name))
        .collect();
        let commit = option_env!("LAYA_EDGE_COMMIT").unwrap_or("unknown (not built from git)");
        let laya: Vec<String> = LayaVersion::ALL
            .iter()
            .map(|v| if *v == LayaVersion::default() { format!("{v} (default)") } else { v.to_string() })
            .collect();
        let features = if features.is_empty() { "none".to_owned() } else { features.join(", ") };
        // Each `[cpu] weights` mode and the kernels its encoder's products run on here.
        let weights: Vec<String> = crate::backend::cpu::weight_kernels()
            .into_iter()
            .map(|(mode, kernels)| {
                let default = if mode == CpuWeights::default() { " (default)" } else { "" };
                format!("{}{default} on {kernels}", mode.name())
            })
            .collect();
        format!(
            "{}\ncommit: {commit}\nfeatures: {features}\nlaya semantics: {}\ncpu kernels: {}\ncpu vector passes: {}\ncpu weights: {}",
            env!("CARGO_PKG_VERSION"),
            laya.join(", "),
            crate::backend::cpu::kernel_set(),
            crate::backend::cpu::vector_set(),
            weights.join(", ")
        )
    })
}

/// `--fallback`: `cpu` or `none`.
fn fallback(s: &str) -> Result<Fallback, String> {
    match s {
        "cpu" => Ok(Fallback::Cpu),
        "none" => Ok(Fallback::None),
        _ => Err("cpu or none".into()),
    }
}

/// `--laya`: a [`LayaVersion`] name.
pub fn laya_version(s: &str) -> Result<LayaVersion, String> {
    s.parse().map_err(|_| {
        let known: Vec<&str> = LayaVersion::ALL.iter().map(|v| v.as_str()).collect();
        format!("one of {}", known.join(", "))
    })
}

impl BackendArgs {
    /// The file's configuration with the flags applied.
    pub fn config(&self) -> Result<Config, String> {
        let mut config = load_config(self.config.as_deref())?;
        if let Some(m) = &self.model {
            config.model.dir = m.to_path_buf();
        }
        if let Some(b) = self.backend {
            config.engine.backend = b;
            // Whoever names the backend measures that backend: a CPU answer in its place would
            // be the CPU measured against itself (issue #28).
            config.engine.fallback = Fallback::None;
        }
        if let Some(f) = self.fallback {
            config.engine.fallback = f;
        }
        if let Some(t) = self.threads {
            config.engine.threads = t;
        }
        if let Some(l) = self.laya {
            config.model.laya = l;
        }
        if let Some(w) = self.cpu_weights {
            config.cpu.weights = w;
        }
        config.check().map_err(|e| e.to_string())?;
        Ok(config)
    }
}

/// How a client command (`ask`, `fleet`) logs in to the broker.
#[derive(clap::Args)]
pub struct Login {
    /// The user name to log in with. With the shipped ACL (config/mosquitto.acl) a client reads
    /// replies under its own user name only, and `fleet` needs an operator's.
    #[arg(long)]
    username: Option<String>,
    /// A file holding the password (its whole content, trailing newlines trimmed).
    #[arg(long, requires = "username")]
    password_file: Option<PathBuf>,
}

impl Login {
    /// Sets the credentials on `options`, if a user name was given.
    pub fn apply(&self, options: &mut rumqttc::v5::MqttOptions) -> Result<(), String> {
        if let Some(user) = &self.username {
            let password = match &self.password_file {
                Some(p) => crate::service::connection::read_password(p).map_err(|e| e.to_string())?,
                None => String::new(),
            };
            options.set_credentials(user.clone(), password);
        }
        Ok(())
    }
}

/// The configuration file, else every key's default.
pub fn load_config(path: Option<&Path>) -> Result<Config, String> {
    let mut config = match path {
        Some(p) => Config::load(p).map_err(|e| e.to_string())?,
        None => Config::default(),
    };
    // `[model] store`: its `current` version, as it is now (a reload reads it again). A store not
    // made yet, or with no version installed (a new board), serves `model.dir`: the image's model.
    if let Some(dir) = config.model.store().map(Path::to_path_buf) {
        use crate::store::{Store, StoreError};
        match Store::open(&dir).and_then(|s| s.current_dir()) {
            Ok(current) => config.model.dir = current,
            Err(e @ (StoreError::NoStore(_) | StoreError::NoCurrent(_))) => {
                tracing::info!(store = %dir.display(), model = %config.model.dir.display(), "{e}: serving model.dir")
            }
            Err(e) => return Err(format!("model.store: {e}")),
        }
    }
    Ok(config)
}

/// A multi-threaded runtime, for `predict`'s engine and `ask`.
pub fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

/// A backend in a supervised worker process, driven synchronously: NPU runtimes are loaded
/// only in workers, never in this process.
pub struct WorkerBackend {
    runtime: tokio::runtime::Runtime,
    engine: Engine,
    name: &'static str,
    /// Who answered the last call: the backend the answering worker runs, and its role.
    last: Option<(String, Role)>,
}

impl Backend for WorkerBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    fn run(&mut self, rows: &[&Row]) -> Result<Vec<RowResult>, BackendError> {
        let rows = rows.iter().map(|r| (*r).clone()).collect();
        self.last = None;
        // As `serve` answers (the engine's `From<EngineError> for BackendError`).
        let out = self.runtime.block_on(self.engine.run(rows, None)).map_err(BackendError::from)?;
        self.last = Some((out.backend, out.role));
        Ok(out.rows)
    }
}

/// The backend of a command that answers rows itself (`predict`, `probe`): the CPU backend in
/// this process, or any backend in a supervised worker, which may have answered from its CPU
/// fallback.
pub enum CommandBackend {
    Local(Box<dyn Backend>),
    Worker(WorkerBackend),
}

impl CommandBackend {
    pub fn backend(&mut self) -> &mut dyn Backend {
        match self {
            CommandBackend::Local(b) => b.as_mut(),
            CommandBackend::Worker(w) => w,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            CommandBackend::Local(b) => b.name(),
            CommandBackend::Worker(w) => w.name,
        }
    }

    /// Forgets who answered the last call (before a line that may run none).
    pub fn forget_answer(&mut self) {
        if let CommandBackend::Worker(w) = self {
            w.last = None;
        }
    }

    /// Who answered the last call: the backend that ran it (`cpu` when the fallback did) and
    /// whether it was the configured one (`primary`) or the fallback; the configured backend as
    /// the primary before any call answered, as `serve`'s replies say.
    pub fn answered_by(&self) -> (String, Role) {
        match self {
            CommandBackend::Local(b) => (b.name().to_owned(), Role::Primary),
            CommandBackend::Worker(w) => w.last.clone().unwrap_or_else(|| (w.name.to_owned(), Role::Primary)),
        }
    }
}

/// The backend `config` names for a command that answers rows itself (`predict`, `probe`): the
/// CPU backend in this process, any other in a supervised worker built exactly as `serve`
/// builds it (with the CPU fallback only if `engine.fallback` asks for it). `with_probe`: whether
/// new workers run the bundle's probe (`probe` measures the raw backend, so it runs the probe
/// rows itself instead, without a fallback).
pub fn backend_for(config: &Config, bundle: &HostBundle, with_probe: bool) -> Result<CommandBackend, String> {
    let kind = config.engine.backend;
    backend::set_threads(config.engine.threads)?;
    if kind == BackendKind::Cpu {
        return backend::load(kind, config).map(CommandBackend::Local).map_err(|e| e.to_string());
    }
    let program = backend::this_program().map_err(|e| e.to_string())?;
    let mut engine_config = EngineConfig::from_config(&program, config, bundle).map_err(|e| e.to_string())?;
    if !with_probe {
        engine_config.probe = None;
        engine_config.fallback = None;
        engine_config.policy = Policy::from_config(config, false);
    }
    let runtime = runtime()?;
    let engine = {
        let _guard = runtime.enter();
        Engine::start(engine_config)
    };
    Ok(CommandBackend::Worker(WorkerBackend { runtime, engine, name: kind.name(), last: None }))
}
