//! `laya-edge predict`: answers JSON-lines requests on stdin with laya's result per line, on the
//! backend the configuration and flags name. The CPU backend runs in this process; any other runs
//! in a supervised worker process built exactly as `serve` builds it (`laya_edge::backends`), so
//! `[engine]`, `[rknn]` and `[qnn]` keys reach it through `--config` (and `[limits]
//! max_request_tokens` bounds each line as it bounds a request to `serve`).

use std::path::{Path, PathBuf};

use laya_edge::backends::{self, BackendKind};
use laya_edge::bundle::HostBundle;
use laya_edge::config::Config;
use laya_edge::engine::process::{Engine, EngineError};
use laya_edge::engine::{Backend, BackendError, RowResult};
use laya_edge::lines;
use laya_edge::prompt::Row;

#[derive(clap::Args)]
pub struct Args {
    /// The configuration file (TOML): its [model], [engine], [rknn], [qnn] and [limits]
    /// max_request_tokens keys apply; the flags below override them.
    #[arg(long)]
    config: Option<PathBuf>,
    /// A laya checkpoint directory or NPU bundle (overrides model.dir).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Which backend runs the model (overrides engine.backend; default cpu).
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Threads for the tensor math (overrides engine.threads; default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

impl Args {
    /// The file's configuration with the flags applied.
    pub fn config(&self) -> Result<Config, String> {
        let mut config = super::load_config(self.config.as_deref())?;
        if let Some(m) = &self.model {
            config.model.dir = m.display().to_string();
        }
        if let Some(b) = self.backend {
            config.engine.backend = b.name().into();
        }
        if let Some(t) = self.threads {
            config.engine.threads = t;
        }
        config.check().map_err(|e| e.to_string())?;
        Ok(config)
    }
}

/// A backend in a supervised worker process, driven synchronously: NPU runtimes are loaded
/// only in workers, never in this process.
struct WorkerBackend {
    runtime: tokio::runtime::Runtime,
    engine: Engine,
    name: &'static str,
}

impl Backend for WorkerBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    fn run(&mut self, rows: &[&Row]) -> Result<Vec<RowResult>, BackendError> {
        let rows = rows.iter().map(|r| (*r).clone()).collect();
        // As `serve` answers: a backend that is restarting or degraded is retryable
        // (`backend_unavailable`), a request that killed the worker twice is `internal`.
        self.runtime.block_on(self.engine.run(rows, None)).map(|out| out.rows).map_err(|e| match e {
            EngineError::Input(m) => BackendError::Input(m),
            e @ (EngineError::Unavailable(_) | EngineError::Overloaded(_) | EngineError::Stopped) => {
                BackendError::Transient(e.to_string())
            }
            other => BackendError::Fatal { code: None, message: other.to_string() },
        })
    }
}

pub fn run(config: Config) -> Result<(), String> {
    let kind = BackendKind::parse(&config.engine.backend).map_err(|e| e.to_string())?;
    backends::set_threads(config.engine.threads)?;
    let bundle = HostBundle::load(Path::new(&config.model.dir)).map_err(|e| e.to_string())?;
    let mut backend: Box<dyn Backend> = if kind == BackendKind::Cpu {
        backends::load(kind, &config)?
    } else {
        let program = backends::this_program().map_err(|e| e.to_string())?;
        let engine_config = backends::engine_config(&program, &config, &bundle).map_err(|e| e.to_string())?;
        let runtime = super::runtime()?;
        let engine = {
            let _guard = runtime.enter();
            Engine::start(engine_config)
        };
        Box::new(WorkerBackend { runtime, engine, name: kind.name() })
    };
    tracing::debug!(backend = kind.name(), model = %config.model.dir, "predict: answering the lines on stdin");
    let out = std::io::BufWriter::new(std::io::stdout().lock());
    let max_tokens = config.limits.max_request_tokens;
    lines::for_each_line(std::io::stdin().lock(), out, |line| {
        lines::predict_line(&bundle, backend.as_mut(), max_tokens, line)
    })
    .map_err(|e| e.to_string())
}
