//! Where the binary's log lines go: `tracing` events, written to stderr.
//!
//! Every part of the agent and the worker logs through `tracing` macros with a level and fields;
//! only the binary installs a subscriber, here. The filter follows `RUST_LOG` syntax
//! (`info`, `laya_edge::engine=debug,warn`), taken from the `LAYA_LOG` environment variable, else
//! `RUST_LOG`, else `info`. Under systemd (`JOURNAL_STREAM` set, stderr is the journal) lines carry
//! no timestamp or colours, since the journal adds its own; elsewhere they are human-readable
//! lines with a timestamp.

use tracing_subscriber::EnvFilter;

/// The environment variable read for the filter first.
pub const FILTER_VAR: &str = "LAYA_LOG";

/// Installs the process's subscriber. `directive` (a `--log` flag, a `[log] level` key) wins over
/// the environment. A malformed filter falls back to `info` and says so, never aborts.
pub fn init(directive: Option<&str>) {
    let from_env = std::env::var(FILTER_VAR).ok().or_else(|| std::env::var("RUST_LOG").ok());
    let wanted = directive.map(str::to_owned).or(from_env).filter(|s| !s.trim().is_empty());
    let (filter, bad) = match wanted.as_deref().map(EnvFilter::try_new) {
        Some(Ok(f)) => (f, None),
        Some(Err(e)) => (EnvFilter::new("info"), Some(e.to_string())),
        None => (EnvFilter::new("info"), None),
    };
    let journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let colour = !journal && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(colour);
    // try_init: a second call keeps the first subscriber.
    let _ = if journal { builder.without_time().try_init() } else { builder.try_init() };
    if let Some(e) = bad {
        tracing::warn!(filter = wanted.as_deref().unwrap_or(""), error = %e, "invalid log filter; logging at info");
    }
}
