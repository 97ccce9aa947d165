//! `laya-edge bundle`: assembles a board bundle from a laya checkpoint and the NPU graphs built
//! from it ([`assemble`]), with every file's sha256 and the probe made by the
//! CPU backend.

use std::path::PathBuf;

use crate::backend;
use crate::config::BackendKind;
pub mod assemble;
pub mod make_probe;

use crate::config::Config;
use assemble::Plan;

#[derive(clap::Args)]
pub struct Args {
    /// The laya checkpoint directory (rl_agent_config.json, tokenizer/, encoder/, model.safetensors).
    #[arg(long)]
    checkpoint: PathBuf,
    /// The bundle directory to write (new or empty).
    #[arg(long)]
    out: PathBuf,
    /// A QNN context binary built from the checkpoint (repeat for each length).
    #[arg(long, value_name = "FILE.bin")]
    qnn: Vec<PathBuf>,
    /// An RKNN graph built from the checkpoint (repeat for each).
    #[arg(long, value_name = "FILE.rknn")]
    rknn: Vec<PathBuf>,
    /// JSON-lines requests to probe the backend with (default: a built-in set of 20 requests).
    /// Each graph needs at least 20 rows of its own length: a graph your requests leave short is
    /// filled from the built-in set.
    #[arg(long, value_name = "REQUESTS.jsonl")]
    probe: Option<PathBuf>,
    /// Use min-max calibrated QNN graphs above 128 tokens anyway (only if the probe holds there).
    #[arg(long)]
    allow_minmax_above_128: bool,
    /// libQnnSystem.so, to read the QNN binaries (default: qnn.system_lib of --config).
    #[arg(long, value_name = "PATH")]
    qnn_system_lib: Option<PathBuf>,
    /// Runtime versions the graphs may run on (default: the QAIRT release the binaries name;
    /// 2.3.2 for RKNN).
    #[arg(long, value_name = "VERSION")]
    runtime_allowlist: Vec<String>,
    /// A configuration file, for qnn.system_lib.
    #[arg(long)]
    config: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<(), String> {
    let config = crate::cli::load_config(args.config.as_deref())?;
    let system_lib = args.qnn_system_lib.clone().or_else(|| config.qnn.system_lib.clone());
    let plan = Plan {
        checkpoint: args.checkpoint,
        out: args.out.clone(),
        qnn: args.qnn,
        rknn: args.rknn,
        probe_requests: args.probe,
        allow_minmax_above_128: args.allow_minmax_above_128,
        qnn_system_lib: system_lib,
        runtime_allowlist: args.runtime_allowlist,
    };
    let summary = assemble::assemble(&plan, |bundle| {
        let mut cpu = Config::default();
        cpu.model.dir = bundle.dir.to_path_buf();
        cpu.engine.threads = config.engine.threads;
        backend::load(BackendKind::Cpu, &cpu).map_err(|e| e.to_string())
    })?;
    for w in &summary.warnings {
        tracing::warn!("{w}");
    }
    let split: Vec<String> = summary.probe_split.iter().map(ToString::to_string).collect();
    println!(
        "{}: {} bundle, {} graph(s), {} file(s) with sha256, probe of {} rows made by the CPU backend ({})",
        args.out.display(),
        summary.backend,
        summary.graphs.len(),
        summary.files,
        summary.probe_rows,
        split.join(", ")
    );
    Ok(())
}
