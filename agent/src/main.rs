//! The `laya-edge` command line: parses it, installs logging and dispatches to a command, each in
//! its own module under `cli/` (in the library). The commands that have a configuration (`serve`, `predict`,
//! `check-config`, and the worker, which gets its agent's) load it here first, so that its
//! `[log] level` can set up logging before the command runs. Then, for every command, a panic
//! in any thread or task is logged and ends the process (`platform::panic`): a service that
//! lost a task is restarted by its supervisor, never left half alive.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use laya_edge::cli::{ask, bundle, check, check_config, fleet, layout, model, predict, probe, serve, worker};

#[derive(Parser)]
#[command(name = "laya-edge", version = laya_edge::cli::version(), about = "Laya typed decisions on edge NPUs")]
struct Cli {
    /// What to log, as a RUST_LOG-style filter (`debug`, `laya_edge::engine=debug,info`);
    /// overrides `[log] level`, LAYA_LOG and RUST_LOG.
    #[arg(long, global = true, value_name = "FILTER")]
    log: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print each question's token layout for JSON-lines requests read from stdin.
    Layout(layout::Args),
    /// Answer JSON-lines requests read from stdin, one result line per request.
    Predict(predict::Args),
    /// Serve questions over MQTT (the board's service).
    Serve(serve::Args),
    /// Check a configuration file and print the effective configuration (TOML).
    CheckConfig(check_config::Args),
    /// Ask one question request over MQTT and print the reply.
    Ask(ask::Args),
    /// Assemble a board bundle: a checkpoint, its NPU graphs, sha256 of every file, the probe.
    Bundle(bundle::Args),
    /// Validate a bundle or checkpoint without running it; name what is wrong.
    Check(check::Args),
    /// Run a bundle's probe on a backend and print how closely it answers like the float model.
    Probe(probe::Args),
    /// A live view of every device's status and telemetry, trouble first (a broker client).
    Fleet(fleet::Args),
    /// A model store's versions: install one and wait until it serves, roll back, commit, list.
    Model(model::Args),
    /// Host one backend for a supervising agent, speaking frames on stdin/stdout (not for humans).
    #[command(hide = true)]
    Worker(worker::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match &cli.command {
        Command::Predict(a) => a.config(),
        Command::Serve(a) => a.config(),
        Command::CheckConfig(a) => a.config(),
        Command::Worker(a) => a.config(),
        Command::Probe(a) => a.config(),
        Command::Layout(_)
        | Command::Ask(_)
        | Command::Bundle(_)
        | Command::Check(_)
        | Command::Fleet(_)
        | Command::Model(_) => Ok(Default::default()),
    };
    // The flag wins over the key; folded into the configuration, it reaches the worker too.
    let config = config.and_then(|mut c| match &cli.log {
        Some(filter) => {
            c.log.level = filter.clone();
            c.check().map(|()| c).map_err(|e| e.to_string())
        }
        None => Ok(c),
    });
    let filter = config.as_ref().ok().map(|c| c.log.level.as_str()).or(cli.log.as_deref());
    laya_edge::platform::logging::init(filter);
    laya_edge::platform::panic::install();
    let done = |r: Result<(), String>| r.map(|()| ExitCode::SUCCESS);
    let result = config.and_then(|config| match cli.command {
        // `ask` says with its exit status how the question went (ask::ExitStatus).
        Command::Ask(args) => ask::run(args).map(ExitCode::from),
        Command::Layout(args) => done(layout::run(args)),
        Command::Predict(_) => done(predict::run(config)),
        Command::Serve(args) => done(serve::run(args, config)),
        Command::CheckConfig(args) => done(check_config::run(args, config)),
        Command::Worker(args) => done(worker::run(args, config)),
        Command::Bundle(args) => done(bundle::run(args)),
        Command::Check(args) => done(check::run(args)),
        Command::Probe(_) => done(probe::run(config)),
        Command::Fleet(args) => done(fleet::run(args)),
        Command::Model(args) => done(model::run(args)),
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}
