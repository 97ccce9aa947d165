//! `laya-edge predict`: answers JSON-lines requests on stdin with laya's result per line, on the
//! backend the configuration and flags name. The CPU backend runs in this process; any other runs
//! in a supervised worker process built exactly as `serve` builds it (`laya_edge::backends`), so
//! `[engine]`, `[rknn]` and `[qnn]` keys reach it through `--config` (and `[limits]
//! max_request_tokens` bounds each line as it bounds a request to `serve`).

use std::path::{Path, PathBuf};

use laya_edge::backends::BackendKind;
use laya_edge::bundle::HostBundle;
use laya_edge::config::Config;
use laya_edge::lines;

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

pub fn run(config: Config) -> Result<(), String> {
    let kind = BackendKind::parse(&config.engine.backend).map_err(|e| e.to_string())?;
    let bundle = HostBundle::load_verified(Path::new(&config.model.dir)).map_err(|e| e.to_string())?;
    let mut backend = super::backend_for(&config, &bundle, true)?;
    tracing::debug!(backend = kind.name(), model = %config.model.dir, "predict: answering the lines on stdin");
    let out = std::io::BufWriter::new(std::io::stdout().lock());
    let max_tokens = config.limits.max_request_tokens;
    lines::for_each_line(std::io::stdin().lock(), out, |line| {
        lines::predict_line(&bundle, backend.as_mut(), max_tokens, line)
    })
    .map_err(|e| e.to_string())
}
