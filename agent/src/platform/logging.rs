//! Where the binary's log lines go: `tracing` events, written to stderr.
//!
//! Every part of the agent and the worker logs through `tracing` macros with a level and fields;
//! only the binary installs a subscriber, here. The filter follows `RUST_LOG` syntax
//! (`info`, `laya_edge::engine=debug,warn`): the `--log` flag, else the `[log] level` key, else
//! the `LAYA_LOG` environment variable, else `RUST_LOG`, else `info`. The worker process gets the
//! agent's effective configuration (with the flag folded into `[log] level`), so it filters the
//! same way.
//!
//! Under systemd (`JOURNAL_STREAM` set: stderr is the journal) each line starts with its syslog
//! priority (`<3>` error, `<4>` warning, `<6>` info, `<7>` debug and trace), which journald
//! strips and records as the entry's priority (`journalctl -p warning`), and carries no timestamp,
//! level word or colours, since the journal adds its own; elsewhere lines are human-readable with
//! a timestamp and the level.
//!
//! The demo's in-process broker (rumqttd) logs its own connections, at `ERROR` for a client that
//! closed before its CONNECT (the demo's own port probe does that): its lines are left out unless
//! the filter names it or asks for `debug` or `trace`.
//!
//! A worker's stderr is a pipe its agent reads: the agent starts it with [`PRIORITY_VAR`] set, so
//! the worker writes priority-prefixed lines, and logs each line again under the target
//! [`WORKER_TARGET`] at that line's level with the worker's pid and role ([`worker_line`]). The
//! worker filtered its lines already, so that target is never filtered again; lines a vendor
//! runtime prints itself (no prefix) are logged at `info`.

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The environment variable read for the filter first.
pub const FILTER_VAR: &str = "LAYA_LOG";

/// Set in a worker's environment by its agent: write `<N>`-prefixed lines, as under journald.
pub const PRIORITY_VAR: &str = "LAYA_LOG_PRIORITY";

/// The target of the lines forwarded from a worker's stderr.
pub const WORKER_TARGET: &str = "laya_worker";

/// A line of a worker's stderr: its level (from a `<N>` prefix; `info` without one) and text.
pub fn worker_line(line: &str) -> (Level, &str) {
    let prefixed = line
        .strip_prefix('<')
        .and_then(|r| r.split_once('>'))
        .and_then(|(n, rest)| n.parse::<u8>().ok().filter(|n| *n <= 7).map(|n| (n, rest)));
    match prefixed {
        Some((0..=3, rest)) => (Level::ERROR, rest),
        Some((4, rest)) => (Level::WARN, rest),
        Some((5 | 6, rest)) => (Level::INFO, rest),
        Some((_, rest)) => (Level::DEBUG, rest),
        None => (Level::INFO, line),
    }
}

/// The syslog priority journald reads from a `<N>` line prefix (sd-daemon(3)).
fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// Prefixes each line of another formatter with its event's syslog priority.
struct JournalPriority<F>(F);

impl<S, N, F> FormatEvent<S, N> for JournalPriority<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        write!(writer, "<{}>", priority(event.metadata().level()))?;
        self.0.format_event(ctx, writer, event)
    }
}

/// Installs the process's subscriber. `directive` (the `--log` flag, else the `[log] level` key)
/// wins over the environment. A malformed filter falls back to `info` and says so, never aborts.
pub fn init(directive: Option<&str>) {
    let from_env = std::env::var(FILTER_VAR).ok().or_else(|| std::env::var("RUST_LOG").ok());
    let wanted = directive.map(str::to_owned).filter(|s| !s.trim().is_empty()).or(from_env);
    let wanted = wanted.filter(|s| !s.trim().is_empty());
    let (filter, bad) = filter(wanted.as_deref());
    let journal = std::env::var_os("JOURNAL_STREAM").is_some() || std::env::var_os(PRIORITY_VAR).is_some();
    let colour = !journal && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // try_init: a second call keeps the first subscriber.
    let _ = if journal {
        let format =
            tracing_subscriber::fmt::format().without_time().with_target(false).with_level(false).with_ansi(false);
        // No colours in span fields either (the writer's setting, not the format's).
        builder.with_ansi(false).event_format(JournalPriority(format)).try_init()
    } else {
        builder.with_target(false).with_ansi(colour).try_init()
    };
    if let Some(e) = bad {
        tracing::warn!(filter = wanted.as_deref().unwrap_or(""), error = %e, "invalid log filter; logging at info");
    }
}

/// The filter for `wanted` (`info` when it is absent or malformed, with the parse error).
///
/// The worker's lines, filtered by the worker already, pass at every level the filter enables
/// anywhere (the worker filters the same way) and at `info` (a vendor runtime's own lines) even
/// when the filter asks for less. Not at every level: the filter's most verbose level is also
/// the `log` crate's maximum (tracing-subscriber sets it from this hint), and a `log::debug!` below
/// it is dropped at the call site; at `trace`, every `debug!` rumqttc writes per packet went
/// through the filter's target match, ~8% of the service thread beside a flood (BENCHMARKS.md).
fn filter(wanted: Option<&str>) -> (EnvFilter, Option<String>) {
    let (filter, bad) = match wanted.map(EnvFilter::try_new) {
        Some(Ok(f)) => (f, None),
        Some(Err(e)) => (EnvFilter::new("info"), Some(e.to_string())),
        None => (EnvFilter::new("info"), None),
    };
    let most = filter.max_level_hint().unwrap_or(LevelFilter::TRACE).max(LevelFilter::INFO);
    let filter = match format!("{WORKER_TARGET}={most}").parse() {
        Ok(d) => filter.add_directive(d),
        Err(_) => filter,
    };
    let filter = match quiet_broker(wanted).then(|| "rumqttd=off".parse()) {
        Some(Ok(d)) => filter.add_directive(d),
        _ => filter,
    };
    (filter, bad)
}

/// Whether the demo broker's lines are left out under `filter`: unless it names the broker or
/// asks for debug or trace.
fn quiet_broker(filter: Option<&str>) -> bool {
    let f = filter.unwrap_or("").to_ascii_lowercase();
    !(f.contains("rumqttd") || f.contains("debug") || f.contains("trace"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_most_verbose_level_is_what_it_asks_for_and_never_trace_for_the_workers_lines() {
        let hint = |wanted| filter(wanted).0.max_level_hint();
        assert_eq!(hint(None), Some(LevelFilter::INFO));
        assert_eq!(hint(Some("info")), Some(LevelFilter::INFO));
        assert_eq!(hint(Some("warn")), Some(LevelFilter::INFO), "a vendor runtime's lines pass at info");
        assert_eq!(hint(Some("laya_edge::engine=debug,warn")), Some(LevelFilter::DEBUG));
        assert_eq!(hint(Some("trace")), Some(LevelFilter::TRACE));
        assert_eq!(hint(Some("not a = filter [")), Some(LevelFilter::INFO));
    }

    #[test]
    fn the_workers_lines_pass_at_the_filters_levels_and_at_info_under_warn() {
        use tracing::subscriber::with_default;
        use tracing_subscriber::layer::SubscriberExt;
        // Counts the events the filter lets through.
        let seen = |wanted: &str, emit: &dyn Fn()| {
            let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let layer = Counter(count.clone());
            let subscriber = tracing_subscriber::registry().with(layer.with_filter(filter(Some(wanted)).0));
            with_default(subscriber, emit);
            count.load(std::sync::atomic::Ordering::SeqCst)
        };
        use tracing_subscriber::Layer;
        struct Counter(std::sync::Arc<std::sync::atomic::AtomicUsize>);
        impl<S: Subscriber> Layer<S> for Counter {
            fn on_event(&self, _: &Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let info = || tracing::info!(target: "laya_worker", "a vendor runtime's line");
        let debug = || tracing::debug!(target: "laya_worker", "a worker's debug line");
        assert_eq!(seen("warn", &info), 1);
        assert_eq!(seen("info", &debug), 0);
        assert_eq!(seen("laya_edge::engine=debug,info", &debug), 1);
        assert_eq!(seen("warn", &|| tracing::info!(target: "laya_edge", "the agent's own")), 0);
    }

    #[test]
    fn the_demo_brokers_lines_are_left_out_unless_asked_for() {
        assert!(quiet_broker(None));
        assert!(quiet_broker(Some("info")));
        assert!(quiet_broker(Some("laya_edge::engine=warn,info")));
        assert!(!quiet_broker(Some("debug")));
        assert!(!quiet_broker(Some("rumqttd=info")));
        assert!(!quiet_broker(Some("laya_edge=TRACE")));
    }

    #[test]
    fn a_worker_line_keeps_its_level_and_an_unprefixed_line_is_info() {
        assert_eq!(worker_line("<3>load failed"), (Level::ERROR, "load failed"));
        assert_eq!(worker_line("<4>slow"), (Level::WARN, "slow"));
        assert_eq!(worker_line("<6>ready"), (Level::INFO, "ready"));
        assert_eq!(worker_line("<7>worker: loading"), (Level::DEBUG, "worker: loading"));
        assert_eq!(worker_line("E RKNN: failed to submit"), (Level::INFO, "E RKNN: failed to submit"));
        assert_eq!(worker_line("<9>not a priority"), (Level::INFO, "<9>not a priority"));
        assert_eq!(worker_line("<x>"), (Level::INFO, "<x>"));
    }
}
