//! `laya-edge predict`: answers JSON-lines requests on stdin with laya's result per line, on the
//! backend the configuration and flags name, each line saying which backend answered it
//! (`backend`, `serving`: `cpu` and `fallback` when the CPU fallback did; `cpu-int8` or
//! `cpu-bf16` for the CPU in a quantised mode, `--cpu-weights`). The CPU backend runs in
//! this process; any other runs in a supervised worker process built exactly as `serve` builds
//! it (`cli::backend_for`), so `[engine]`, `[rknn]` and `[qnn]` keys reach it through `--config`
//! (and `[limits] max_request_tokens` bounds each line as it bounds a request to `serve`). A
//! backend named with `--backend` answers alone unless `--fallback cpu` asks for the fallback:
//! whoever measures an NPU must not be answered by the CPU without knowing it.

use std::path::Path;

use crate::bundle::HostBundle;
use crate::cli::jsonl;
use crate::config::Config;

/// `predict`'s flags: the configuration file, the model, the backend, the threads.
pub type Args = super::BackendArgs;

pub fn run(config: Config) -> Result<(), String> {
    let kind = config.engine.backend;
    let bundle =
        HostBundle::load_verified_as(Path::new(&config.model.dir), config.model.laya).map_err(|e| e.to_string())?;
    // A quantised CPU mode (`--cpu-weights`) answers only once it has passed its probe, as at
    // `serve`'s start; each line's `backend` names it (`cpu-int8`).
    crate::engine::fidelity::check(&config, &bundle).map_err(|e| e.to_string())?;
    let mut backend = super::backend_for(&config, &bundle, true)?;
    tracing::debug!(backend = kind.name(), model = %config.model.dir.display(), "predict: answering the lines on stdin");
    let out = std::io::BufWriter::new(std::io::stdout().lock());
    let max_tokens = config.limits.max_request_tokens;
    jsonl::for_each_line(std::io::stdin().lock(), out, |line| {
        jsonl::predict_line(&bundle, &mut backend, max_tokens, line)
    })
    .map_err(|e| e.to_string())
}
