//! What a panic does: it is logged and ends the process with [`PANIC_EXIT`], from any thread.
//!
//! By default a panic ends only its thread, and tokio catches a task's panic as a `JoinError`
//! that nobody may look at: a dead engine driver, connection task or reload left the agent
//! online and refusing everything (issue #40), and systemd restarts a process only once it
//! exits. So the binary installs [`install`]'s hook first thing: a panic anywhere is logged
//! through `tracing` (under systemd, an error in the journal, with the thread and the place)
//! and the process ends at once with `_exit(101)`, Rust's own status for a panic. The broker
//! sees the connection drop without a DISCONNECT and publishes the Last Will (`offline`); a
//! question in progress was not acknowledged and is delivered again to the next run; a worker
//! dies with its agent (`PR_SET_PDEATHSIG`); `Restart=on-failure` starts it again.
//!
//! `_exit` rather than `exit` or `abort`: `exit` runs atexit handlers and C++ static destructors
//! while the other threads still run (a vendor runtime's, in the worker, may crash or hang
//! there), and `abort` makes a core dump of a process of hundreds of MB on a board's flash.
//!
//! Where a panic is expected to be caught ([`contained`], around laying out one request: a bug
//! that one input triggers must cost that question an error reply, not restart the agent into
//! the same question redelivered), it is logged and unwinds to the caller as before.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, PanicHookInfo};

/// The exit status of a process that panicked (Rust's default for a panicking main thread).
pub const PANIC_EXIT: i32 = 101;

/// Testing only: `engine-call` makes the engine's driver task panic when it takes its first
/// call ([`injected`]), so a test can see what a panic in a task does to the process.
pub const TEST_PANIC_VAR: &str = "LAYA_TEST_PANIC";

thread_local! {
    /// How many [`contained`] calls this thread is in.
    static CONTAINED: Cell<u32> = const { Cell::new(0) };
}

/// Installs the hook: log, then end the process unless the panic is [`contained`].
pub fn install() {
    std::panic::set_hook(Box::new(|info| {
        let contained = CONTAINED.with(Cell::get) > 0;
        let (thread, message, location) = describe(info);
        if contained {
            tracing::error!(%thread, %location, "panic (caught where it happened): {message}");
            return;
        }
        tracing::error!(
            %thread,
            %location,
            "panic: {message}; exiting with status {PANIC_EXIT} so that the supervisor restarts the process"
        );
        // With RUST_BACKTRACE set, as Rust's own hook would print it (an event of its own: the
        // line above stays one line).
        let backtrace = std::backtrace::Backtrace::capture();
        if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
            tracing::error!("the panic's backtrace:\n{backtrace}");
        }
        // SAFETY: `_exit` takes no pointer and never returns; it ends the process without
        // running atexit handlers or destructors, which is the point (see the module doc). The
        // log line above was written to stderr, which is unbuffered.
        unsafe { libc::_exit(PANIC_EXIT) }
    }));
}

/// The panicking thread's name, the panic's message and where it was raised.
fn describe(info: &PanicHookInfo<'_>) -> (String, String, String) {
    let current = std::thread::current();
    let thread = current.name().map_or_else(|| format!("{:?}", current.id()), str::to_owned);
    let payload = info.payload();
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a panic without a message)".to_owned());
    let location = info.location().map_or_else(|| "unknown".to_owned(), ToString::to_string);
    (thread, message, location)
}

/// Runs `f`, catching a panic in it: the hook logs it and lets it unwind to here instead of
/// ending the process. For work whose failure is one request's, not the agent's.
pub fn contained<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            CONTAINED.with(|c| c.set(c.get().saturating_sub(1)));
        }
    }
    CONTAINED.with(|c| c.set(c.get().saturating_add(1)));
    let _leave = Leave;
    std::panic::catch_unwind(AssertUnwindSafe(f))
}

/// Testing only: panics if [`TEST_PANIC_VAR`] names `point` (read once per process), at the
/// caller's place.
#[track_caller]
pub fn injected(point: &str) {
    static WANTED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let wanted = WANTED.get_or_init(|| std::env::var(TEST_PANIC_VAR).ok());
    if wanted.as_deref() == Some(point) {
        panic!("{TEST_PANIC_VAR}={point}: a panic injected for a test");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_contained_panic_comes_back_as_an_error_and_the_thread_goes_on() {
        let caught = contained(|| -> u32 { panic!("one request's bug") });
        let payload = caught.expect_err("the panic is caught");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"one request's bug"));
        assert_eq!(CONTAINED.with(Cell::get), 0, "left the contained region");
        assert_eq!(contained(|| 7).ok(), Some(7));
        // Nested: the inner region's end does not end the outer one.
        let outer = contained(|| {
            let inner = contained(|| panic!("inner"));
            (inner.is_err(), CONTAINED.with(Cell::get))
        });
        assert_eq!(outer.ok(), Some((true, 1)));
    }

    #[test]
    fn no_panic_is_injected_unless_the_variable_names_the_point() {
        // The test process does not set LAYA_TEST_PANIC.
        injected("engine-call");
        injected("");
    }
}
