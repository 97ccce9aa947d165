//! The `laya-edge` command line.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use laya_edge::bundle::HostBundle;
use laya_edge::engine::Backend;
use laya_edge::engine::cpu::CpuBackend;
use laya_edge::lines;

#[derive(Parser)]
#[command(name = "laya-edge", version, about = "Laya typed decisions on edge NPUs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print each question's token layout for JSON-lines requests read from stdin.
    Layout {
        /// A laya checkpoint directory (rl_agent_config.json, tokenizer/, ...).
        #[arg(long)]
        model: PathBuf,
    },
    /// Answer JSON-lines requests read from stdin, one result line per request.
    Predict {
        /// A laya checkpoint directory.
        #[arg(long)]
        model: PathBuf,
        /// Which backend runs the model.
        #[arg(long, value_enum, default_value_t = BackendKind::Cpu)]
        backend: BackendKind,
        /// Threads for the tensor math (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Host one backend for a supervising agent, speaking frames on stdin/stdout (not for humans).
    #[command(hide = true)]
    Worker {
        #[arg(long, value_enum)]
        backend: BackendKind,
        #[arg(long)]
        model: PathBuf,
        /// Faults to inject (null backend), e.g. `hang@3`.
        #[arg(long)]
        faults: Option<String>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BackendKind {
    /// The CPU reference model.
    Cpu,
    /// Deterministic logits from the input, no model (tests and benchmarks).
    Null,
}

/// Loads the backend a worker (or `predict`) runs.
fn load_backend(kind: BackendKind, model: &std::path::Path, faults: Option<&str>) -> Result<Box<dyn Backend>, String> {
    match kind {
        BackendKind::Cpu => {
            let bundle = HostBundle::load(model).map_err(|e| e.to_string())?;
            let ckpt = bundle.checkpoint.clone().ok_or("this bundle has no checkpoint for the CPU backend")?;
            Ok(Box::new(CpuBackend::load(&ckpt, &bundle.config, bundle.tokenizer.pad.id).map_err(|e| e.to_string())?))
        }
        BackendKind::Null => {
            let faults = laya_edge::engine::null::parse_faults(faults.unwrap_or(""))?;
            Ok(Box::new(laya_edge::engine::null::NullBackend::new(faults)?))
        }
    }
}

fn predict(model: &std::path::Path, backend: BackendKind, threads: Option<usize>) -> Result<(), String> {
    if let Some(n) = threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build_global()
            .map_err(|e| format!("cannot set up {n} threads: {e}"))?;
    }
    let bundle = HostBundle::load(model).map_err(|e| e.to_string())?;
    let mut backend = load_backend(backend, model, None)?;
    for_each_line(|line| lines::predict_line(&bundle, backend.as_mut(), line)).map_err(|e| e.to_string())
}

/// Runs `handle` on every non-blank stdin line and prints its answer line.
fn for_each_line(mut handle: impl FnMut(&str) -> String) -> std::io::Result<()> {
    let stdin = std::io::stdin();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in stdin.lock().lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                writeln!(out, "{}", lines::error_line(None, "bad_request", "the line is not valid UTF-8"))?;
                continue;
            }
            Err(e) => return Err(e),
        };
        if line.trim().is_empty() {
            continue;
        }
        writeln!(out, "{}", handle(&line))?;
        out.flush()?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Layout { model } => match HostBundle::load(&model) {
            Ok(bundle) => for_each_line(|line| lines::layout_line(&bundle, line)).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        },
        Command::Predict { model, backend, threads } => predict(&model, backend, threads),
        Command::Worker { backend, model, faults } => laya_edge::engine::worker::serve(
            || load_backend(backend, &model, faults.as_deref()),
            std::io::stdin().lock(),
            std::io::stdout().lock(),
        )
        .map_err(|e| e.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("laya-edge: {e}");
            ExitCode::FAILURE
        }
    }
}
