//! The service watching itself: heartbeats of the service loop and of the broker connection task,
//! and a plain thread that ends the process when either stops beating.
//!
//! Both tasks run on one single-threaded runtime; a bug that makes either wait for ever (the
//! flood deadlock of issue #31 was one) leaves a process that looks alive and does nothing. The
//! loop only pings systemd's watchdog while both beat (`Liveness::fresh`), so under systemd a
//! stall stops the pings and systemd restarts the service; without systemd the watch thread,
//! which needs nothing of the runtime, exits the process with `STALL_EXIT` once a heartbeat is
//! older than its bound, so whatever supervises it restarts it. The worker dies with it
//! (`PR_SET_PDEATHSIG`) and the broker publishes the Last Will (`online: false`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The exit status of a process that found its own loop stalled (`EX_SOFTWARE`).
pub const STALL_EXIT: i32 = 70;

/// Which part stopped beating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The service loop (questions in, status, telemetry, events).
    Loop,
    /// The broker connection task.
    Link,
}

impl Part {
    pub fn as_str(self) -> &'static str {
        match self {
            Part::Loop => "the service loop",
            Part::Link => "the broker connection task",
        }
    }
}

/// A part that has not beaten within its bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    pub part: Part,
    pub silent_for: Duration,
}

/// How long each part may go without a heartbeat.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub service_loop: Duration,
    pub link: Duration,
}

/// The two heartbeats, as milliseconds since `epoch`.
#[derive(Debug)]
pub struct Liveness {
    epoch: Instant,
    service_loop: AtomicU64,
    link: AtomicU64,
    /// Milliseconds the connection task's bound is lengthened by now: a broker that assigns a
    /// longer keep-alive than ours lengthens a poll of an idle link (`Liveness::extend_link`).
    link_extra: AtomicU64,
    stopped: AtomicBool,
}

impl Liveness {
    pub fn new(now: Instant) -> Liveness {
        Liveness {
            epoch: now,
            service_loop: AtomicU64::new(0),
            link: AtomicU64::new(0),
            link_extra: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        }
    }

    fn at(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64
    }

    pub fn beat(&self, part: Part) {
        let now = self.at(Instant::now());
        match part {
            Part::Loop => self.service_loop.store(now, Ordering::Relaxed),
            Part::Link => self.link.store(now, Ordering::Relaxed),
        }
    }

    /// From now on the connection task may go `extra` beyond its bound (and the systemd
    /// watchdog's freshness) without a beat: this connection's keep-alive, which the broker
    /// assigned, makes its polls that much longer than the bound was made for. Replaces the
    /// previous extension (a later connection may assign less).
    pub fn extend_link(&self, extra: Duration) {
        self.link_extra.store(extra.as_millis().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
    }

    /// The part furthest beyond its bound at `now`, if any.
    pub fn check(&self, now: Instant, bounds: Bounds) -> Option<Stall> {
        let now = self.at(now);
        let link_bound = bounds.link.saturating_add(Duration::from_millis(self.link_extra.load(Ordering::Relaxed)));
        [(Part::Loop, &self.service_loop, bounds.service_loop), (Part::Link, &self.link, link_bound)]
            .into_iter()
            .filter_map(|(part, beat, bound)| {
                let silent_for = Duration::from_millis(now.saturating_sub(beat.load(Ordering::Relaxed)));
                (silent_for > bound).then(|| (silent_for - bound, Stall { part, silent_for }))
            })
            .max_by_key(|(over, _)| *over)
            .map(|(_, stall)| stall)
    }

    /// Whether both parts beat within `within` (the systemd watchdog ping's condition).
    pub fn fresh(&self, now: Instant, within: Duration) -> bool {
        self.check(now, Bounds { service_loop: within, link: within }).is_none()
    }

    /// Ends the watch: the service is shutting down (its waits are bounded by their own
    /// timeouts) or has stopped.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }
}

/// Watches `liveness` from a thread of its own, checking every `every`; calls `on_stall` once
/// with the first stall found, then ends. Ends without calling it once `stop` was called.
pub fn watch(
    liveness: Arc<Liveness>,
    bounds: Bounds,
    every: Duration,
    on_stall: impl FnOnce(Stall) + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("laya-liveness".into()).spawn(move || {
        loop {
            std::thread::sleep(every);
            if liveness.stopped.load(Ordering::Relaxed) {
                return;
            }
            if let Some(stall) = liveness.check(Instant::now(), bounds) {
                on_stall(stall);
                return;
            }
        }
    })
}

/// What `serve` does on a stall: says so and exits with `STALL_EXIT`.
pub fn exit_on_stall(stall: Stall) {
    tracing::error!(
        part = stall.part.as_str(),
        silent_s = stall.silent_for.as_secs_f64(),
        "the agent stopped making progress: exiting so that its supervisor restarts it"
    );
    eprintln!(
        "laya-edge: {} made no progress for {:.1} s: exiting with status {STALL_EXIT}",
        stall.part.as_str(),
        stall.silent_for.as_secs_f64()
    );
    std::process::exit(STALL_EXIT);
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_part_silent_beyond_its_bound_is_a_stall_and_the_one_furthest_beyond_is_named() {
        let t0 = Instant::now();
        let l = Liveness::new(t0);
        let bounds = Bounds { service_loop: 1000 * MS, link: 3000 * MS };
        assert_eq!(l.check(t0 + 900 * MS, bounds), None);
        assert_eq!(l.check(t0 + 1500 * MS, bounds), Some(Stall { part: Part::Loop, silent_for: 1500 * MS }));
        assert_eq!(l.check(t0 + 4000 * MS, bounds).map(|s| s.part), Some(Part::Loop));
        assert!(!l.fresh(t0 + 1500 * MS, 1000 * MS));
    }

    #[test]
    fn a_link_extended_by_its_broker_s_keep_alive_is_not_a_stall_within_the_extension() {
        let t0 = Instant::now();
        let l = Liveness::new(t0);
        let bounds = Bounds { service_loop: 100_000 * MS, link: 1000 * MS };
        l.beat(Part::Loop);
        assert_eq!(l.check(t0 + 1500 * MS, bounds).map(|s| s.part), Some(Part::Link));
        l.extend_link(1000 * MS);
        assert_eq!(l.check(t0 + 1500 * MS, bounds), None);
        assert_eq!(l.check(t0 + 2500 * MS, bounds).map(|s| s.part), Some(Part::Link));
        // A later connection with a shorter keep-alive takes the extension back.
        l.extend_link(Duration::ZERO);
        assert_eq!(l.check(t0 + 1500 * MS, bounds).map(|s| s.part), Some(Part::Link));
    }

    #[test]
    fn a_beating_loop_is_never_a_stall_and_a_stopped_one_ends_the_process_path() {
        let l = Arc::new(Liveness::new(Instant::now()));
        let bounds = Bounds { service_loop: 300 * MS, link: 300 * MS };
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = watch(l.clone(), bounds, 20 * MS, move |s| {
            let _ = tx.send(s);
        })
        .unwrap();
        // Beating: no stall however long it runs.
        for _ in 0..30 {
            l.beat(Part::Loop);
            l.beat(Part::Link);
            std::thread::sleep(20 * MS);
        }
        assert!(rx.try_recv().is_err(), "a beating service was taken for stalled");
        // The loop stops; the link goes on beating: the loop is named.
        let stall = loop {
            l.beat(Part::Link);
            match rx.recv_timeout(20 * MS) {
                Ok(s) => break s,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(e) => panic!("the watch ended without a stall: {e}"),
            }
        };
        assert_eq!(stall.part, Part::Loop);
        handle.join().unwrap();
    }

    #[test]
    fn a_stopped_watch_ends_without_calling_on_stall() {
        let l = Arc::new(Liveness::new(Instant::now()));
        l.stop();
        let (tx, rx) = std::sync::mpsc::channel::<Stall>();
        let handle = watch(l, Bounds { service_loop: MS, link: MS }, 10 * MS, move |s| {
            let _ = tx.send(s);
        })
        .unwrap();
        handle.join().unwrap();
        assert!(rx.try_recv().is_err());
    }
}
