//! The broker link's policy, without I/O: how long to wait before reconnecting, when a connection
//! that says nothing is dead, and how long one poll of the connection may take.
//!
//! The connection task (`poller`) asks this state machine and does the I/O. It exists
//! because a broker can fail us in ways rumqttc does not notice on its own:
//! - a connection whose broker stopped answering (dropped us, or a half-open TCP link) is only
//!   found by rumqttc at the keep-alive after an unanswered ping, two keep-alives on; here it is
//!   declared lost once nothing came from the broker for one and a half keep-alives (MQTT 5
//!   §3.1.2.10: the broker itself gives up on us after that long). The keep-alive is the
//!   connection's own ([`negotiated_keep_alive`]): a broker may assign another in its CONNACK
//!   (Server Keep Alive, MQTT 5 §3.2.2.3.14; EMQX's `mqtt.server_keepalive`, several cloud
//!   brokers), and rumqttc then pings at the broker's value, so the silence is measured by it
//!   too: a check at our own value would drop a healthy idle link whose broker assigned more
//!   than one and a half times ours, before its first ping;
//! - a CONNACK the link cannot work with ([`check_connack`]: Receive Maximum 0, a protocol
//!   error that would leave rumqttc sending nothing at all) ends the connection at once;
//! - a poll stuck in a write to a broker that stopped reading never returns to send a ping, so
//!   one poll is bounded too (`poll_bound`), and the connection dropped when it runs out;
//! - two agents with one client id (a cloned SD card) take each other's session
//!   (DISCONNECT 0x8E) as fast as they reconnect: after a takeover the next connection waits at
//!   least `TAKEOVER_MIN` (doubling to `TAKEOVER_MAX`), so two clones cost the broker at most one
//!   takeover every few seconds, and the cause is named (`takeovers`). rumqttc 0.25 drops a
//!   DISCONNECT without properties (mosquitto's 0x8E is two bytes: its parser wants a property
//!   length) and reports the closed socket instead, so a connection the broker closes before it
//!   was `STABLE` counts the same way, and two such in a row are taken for a takeover
//!   (`Link::suspected_takeover`).
//!
//! Backoff after an ordinary loss doubles from `reconnect_min_ms` to `reconnect_max_ms` with a
//! per-process jitter; it starts again from the minimum only once a connection has lasted
//! `STABLE` (a connection that is accepted and dropped at once is a failure like any other).

use std::time::{Duration, Instant};

/// The least wait before reconnecting after our session was taken over.
pub const TAKEOVER_MIN: Duration = Duration::from_secs(5);
/// The most, after takeovers in a row.
pub const TAKEOVER_MAX: Duration = Duration::from_secs(120);
/// A connection that lasted this long resets the backoffs.
pub const STABLE: Duration = Duration::from_secs(60);
/// How long connecting (TCP, TLS, CONNECT/CONNACK) may take beyond rumqttc's own timeout.
const CONNECT_SLACK: Duration = Duration::from_secs(10);

/// Why a connection ended, as the link tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loss {
    /// Connecting failed, the broker refused us, or the network failed (rumqttc's error).
    Error,
    /// The broker closed the connection without a reason we could read.
    Closed,
    /// Another client connected with our client id (DISCONNECT 0x8E, Session Taken Over).
    TakenOver,
    /// Nothing came from the broker for one and a half keep-alives.
    Silent,
    /// A poll of the connection made no progress within `poll_bound` (stuck writing).
    Stuck,
    /// The broker's CONNACK broke the protocol ([`check_connack`]).
    Protocol,
}

/// A CONNACK the link cannot work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnAckFault {
    /// MQTT 5 §3.2.2.3.3: "It is a Protocol Error to include the Receive Maximum value of 0".
    /// rumqttc would take it as a window of no publish at all: not one reply, status or
    /// acknowledgement would go out, while the pings kept the link looking healthy.
    #[error(
        "the broker's CONNACK has Receive Maximum 0, a protocol error (MQTT 5 §3.2.2.3.3): nothing could be published on this connection"
    )]
    ReceiveMaximumZero,
}

/// Whether a CONNACK with this Receive Maximum can be worked with.
pub fn check_connack(receive_maximum: Option<u16>) -> Result<(), ConnAckFault> {
    match receive_maximum {
        Some(0) => Err(ConnAckFault::ReceiveMaximumZero),
        _ => Ok(()),
    }
}

/// The keep-alive of a connection: the broker's Server Keep Alive when it assigned one (MQTT 5
/// §3.2.2.3.14: the client MUST use it, lower or higher than what it asked), else what we
/// asked. rumqttc 0.25 pings at the assigned value from the CONNACK on (`mqtt_connect` writes it
/// into its options before the ping timer starts). An assigned 0 means no keep-alive at all; we
/// keep pinging at our own (a PINGREQ is always allowed) so that a dead link is still found,
/// and the connection task gives rumqttc our value back (at 0 it would ping without pause).
pub fn negotiated_keep_alive(asked: Duration, assigned: Option<u16>) -> Duration {
    match assigned {
        Some(0) | None => asked,
        Some(secs) => Duration::from_secs(u64::from(secs)),
    }
}

/// The link's state: connected or not, since when, and the backoffs.
#[derive(Debug)]
pub struct Link {
    /// The keep-alive we ask for.
    asked: Duration,
    /// This connection's ([`negotiated_keep_alive`]); `asked` while not connected.
    keep_alive: Duration,
    min_backoff: Duration,
    max_backoff: Duration,
    /// Jitter added to every wait, fixed per process so clones drift apart.
    jitter: Duration,
    backoff: Duration,
    takeover_backoff: Duration,
    connected_at: Option<Instant>,
    last_incoming: Instant,
    /// Connections in a row the broker closed before they were `STABLE`.
    early_closes: u32,
    /// Sessions taken over from us in this run.
    pub takeovers: u64,
}

impl Link {
    /// `jitter` is added to every wait (a per-process value below a second).
    pub fn new(
        keep_alive: Duration,
        min_backoff: Duration,
        max_backoff: Duration,
        jitter: Duration,
        now: Instant,
    ) -> Link {
        let min_backoff = min_backoff.max(Duration::from_millis(1));
        let keep_alive = keep_alive.max(Duration::from_secs(1));
        Link {
            asked: keep_alive,
            keep_alive,
            min_backoff,
            max_backoff: max_backoff.max(min_backoff),
            jitter,
            backoff: min_backoff,
            takeover_backoff: TAKEOVER_MIN,
            connected_at: None,
            last_incoming: now,
            early_closes: 0,
            takeovers: 0,
        }
    }

    /// A CONNACK arrived; the connection's keep-alive is `keep_alive` (what rumqttc pings at,
    /// [`negotiated_keep_alive`]).
    pub fn connected(&mut self, now: Instant, keep_alive: Duration) {
        self.connected_at = Some(now);
        self.last_incoming = now;
        self.keep_alive = keep_alive.max(Duration::from_secs(1));
    }

    /// The keep-alive the link watches now: the connection's, else the one we ask for.
    pub fn keep_alive(&self) -> Duration {
        self.keep_alive
    }

    /// Any packet from the broker.
    pub fn incoming(&mut self, now: Instant) {
        self.last_incoming = now;
    }

    /// Whether a CONNACK was seen and no loss since.
    pub fn is_connected(&self) -> bool {
        self.connected_at.is_some()
    }

    /// How long the next poll may take before the connection counts as lost: while connected,
    /// until one and a half keep-alives after the last packet from the broker (a healthy link
    /// hears a PINGRESP every keep-alive); while connecting, rumqttc's connection timeout plus
    /// some slack.
    pub fn poll_bound(&self, now: Instant, connect_timeout: Duration) -> Duration {
        match self.connected_at {
            Some(_) => {
                let silent_at = self.last_incoming + self.keep_alive * 3 / 2;
                silent_at.saturating_duration_since(now).max(Duration::from_millis(100))
            }
            None => connect_timeout + CONNECT_SLACK,
        }
    }

    /// The poll ran out of `poll_bound`: why the connection is given up (`Silent` if the broker
    /// has said nothing for too long, else `Stuck`).
    pub fn poll_timed_out(&self, now: Instant) -> Loss {
        if self.connected_at.is_some() && now.duration_since(self.last_incoming) >= self.keep_alive * 3 / 2 {
            Loss::Silent
        } else {
            Loss::Stuck
        }
    }

    /// The connection ended: how long to wait before the next attempt.
    pub fn lost(&mut self, loss: &Loss, now: Instant) -> Duration {
        let lasted = self.connected_at.take().map(|at| now.duration_since(at));
        self.keep_alive = self.asked;
        if lasted.is_some_and(|d| d >= STABLE) {
            self.backoff = self.min_backoff;
            self.takeover_backoff = TAKEOVER_MIN;
        }
        let closed_early = *loss == Loss::Closed && lasted.is_some_and(|d| d < STABLE);
        self.early_closes = if closed_early { self.early_closes + 1 } else { 0 };
        let taken_over = *loss == Loss::TakenOver || self.suspected_takeover();
        let wait = if taken_over {
            self.takeovers += 1;
            let wait = self.takeover_backoff.max(self.backoff);
            self.takeover_backoff = (self.takeover_backoff * 2).min(TAKEOVER_MAX);
            wait
        } else {
            self.backoff
        };
        self.backoff = (self.backoff * 2).min(self.max_backoff);
        wait + self.jitter
    }

    /// Whether the last losses look like a takeover the broker did not name readably: two or
    /// more connections in a row closed by the broker before they were `STABLE`.
    pub fn suspected_takeover(&self) -> bool {
        self.early_closes >= 2
    }

    /// The longest one turn of the connection task can take: a poll's bound (by this
    /// connection's keep-alive) or a backoff.
    pub fn longest_turn(&self, connect_timeout: Duration) -> Duration {
        let poll = (self.keep_alive * 3 / 2).max(connect_timeout + CONNECT_SLACK);
        poll.max(self.max_backoff.max(TAKEOVER_MAX) + self.jitter)
    }
}

/// A per-process jitter below `bound`, so clones and a restarted fleet spread their reconnects.
pub fn process_jitter(bound: Duration) -> Duration {
    let seed = u64::from(std::process::id())
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u64)
            .unwrap_or(0);
    let ms = bound.as_millis().max(1) as u64;
    Duration::from_millis((seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn link(t0: Instant) -> Link {
        Link::new(30 * S, Duration::from_millis(500), 30 * S, Duration::ZERO, t0)
    }

    #[test]
    fn backoff_doubles_to_its_maximum_and_restarts_only_after_a_stable_connection() {
        let t0 = Instant::now();
        let mut l = link(t0);
        let waits: Vec<_> = (0..8).map(|_| l.lost(&Loss::Error, t0)).collect();
        assert_eq!(waits[0], Duration::from_millis(500));
        assert_eq!(waits[1], S);
        assert_eq!(waits[7], 30 * S);
        // Accepted and dropped at once: still backing off.
        l.connected(t0, 30 * S);
        assert_eq!(l.lost(&Loss::Error, t0 + S), 30 * S);
        // A connection that lasted STABLE starts again from the minimum.
        l.connected(t0, 30 * S);
        assert_eq!(l.lost(&Loss::Error, t0 + STABLE), Duration::from_millis(500));
    }

    #[test]
    fn takeovers_in_a_row_wait_at_least_five_seconds_doubling_and_are_counted() {
        let t0 = Instant::now();
        let mut l = link(t0);
        let mut at = t0;
        let mut waits = Vec::new();
        for _ in 0..7 {
            l.connected(at, 30 * S);
            at += S; // the clone takes the session over a second later
            let w = l.lost(&Loss::TakenOver, at);
            waits.push(w);
            at += w;
        }
        assert_eq!(waits[0], TAKEOVER_MIN);
        assert_eq!(waits[1], 2 * TAKEOVER_MIN);
        assert_eq!(*waits.last().unwrap(), TAKEOVER_MAX);
        assert!(waits.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(l.takeovers, 7);
        // Two clones: the takeovers are each one's reconnects, at least TAKEOVER_MIN apart.
        assert!(waits.iter().all(|w| *w >= TAKEOVER_MIN));
    }

    #[test]
    fn connections_the_broker_closes_soon_after_accepting_them_count_as_takeovers_from_the_second() {
        let t0 = Instant::now();
        let mut l = link(t0);
        l.connected(t0, 30 * S);
        assert_eq!(l.lost(&Loss::Closed, t0 + S), Duration::from_millis(500), "one early close: a broker restart");
        assert!(!l.suspected_takeover());
        l.connected(t0 + 2 * S, 30 * S);
        assert_eq!(l.lost(&Loss::Closed, t0 + 3 * S), TAKEOVER_MIN, "two in a row: a clone");
        assert!(l.suspected_takeover());
        assert_eq!(l.takeovers, 1);
        // A failed connect attempt in between does not count as a close, and ends the run.
        assert_eq!(l.lost(&Loss::Error, t0 + 9 * S), 2 * S);
        assert!(!l.suspected_takeover());
        // A close after a stable connection is an ordinary loss.
        l.connected(t0 + 10 * S, 30 * S);
        assert_eq!(l.lost(&Loss::Closed, t0 + 10 * S + STABLE), Duration::from_millis(500));
    }

    #[test]
    fn a_connection_that_hears_nothing_for_one_and_a_half_keep_alives_is_silent() {
        let t0 = Instant::now();
        let mut l = link(t0);
        assert_eq!(l.poll_bound(t0, 5 * S), 15 * S, "connecting: the connect timeout and slack");
        l.connected(t0, 30 * S);
        assert_eq!(l.poll_bound(t0, 5 * S), 45 * S);
        l.incoming(t0 + 30 * S); // the PINGRESP
        assert_eq!(l.poll_bound(t0 + 31 * S, 5 * S), 44 * S);
        assert_eq!(l.poll_timed_out(t0 + 50 * S), Loss::Stuck);
        assert_eq!(l.poll_timed_out(t0 + 75 * S), Loss::Silent);
        assert_eq!(l.poll_bound(t0 + 80 * S, 5 * S), Duration::from_millis(100));
    }

    #[test]
    fn the_keep_alive_is_the_one_the_broker_assigned_lower_or_higher_and_ours_without_one() {
        let ours = 30 * S;
        assert_eq!(negotiated_keep_alive(ours, None), ours);
        assert_eq!(negotiated_keep_alive(ours, Some(60)), 60 * S);
        assert_eq!(negotiated_keep_alive(ours, Some(2)), 2 * S);
        assert_eq!(negotiated_keep_alive(ours, Some(u16::MAX)), Duration::from_secs(u64::from(u16::MAX)));
        // 0 is "no keep-alive": we go on pinging (and watching) at our own.
        assert_eq!(negotiated_keep_alive(ours, Some(0)), ours);
    }

    #[test]
    fn a_link_whose_broker_assigned_a_keep_alive_is_silent_only_after_one_and_a_half_of_the_broker_s() {
        let t0 = Instant::now();
        let mut l = link(t0);
        // The broker assigned 60 s against our 30: rumqttc pings every 60 s, so a link that heard
        // nothing for 45 s is healthy, and the turn the liveness watch allows grows with it.
        let turn = l.longest_turn(5 * S);
        l.connected(t0, negotiated_keep_alive(30 * S, Some(60)));
        assert_eq!(l.keep_alive(), 60 * S);
        assert_eq!(l.poll_bound(t0, 5 * S), 90 * S);
        assert_eq!(l.poll_timed_out(t0 + 50 * S), Loss::Stuck);
        assert_eq!(l.poll_timed_out(t0 + 90 * S), Loss::Silent);
        let long = 1000 * S;
        l.connected(t0, long);
        assert_eq!(l.longest_turn(5 * S), long * 3 / 2);
        assert!(l.longest_turn(5 * S) > turn);
        // Lost: the next connection starts from what we ask.
        l.lost(&Loss::Closed, t0 + S);
        assert_eq!(l.keep_alive(), 30 * S);
        assert_eq!(l.longest_turn(5 * S), turn);
        // Lower: 2 s assigned, silent after 3.
        l.connected(t0, negotiated_keep_alive(30 * S, Some(2)));
        assert_eq!(l.poll_bound(t0, 5 * S), 3 * S);
        assert_eq!(l.poll_timed_out(t0 + 3 * S), Loss::Silent);
    }

    #[test]
    fn a_connack_with_receive_maximum_zero_is_a_protocol_error_and_any_other_is_accepted() {
        assert_eq!(check_connack(Some(0)), Err(ConnAckFault::ReceiveMaximumZero));
        assert!(check_connack(Some(0)).unwrap_err().to_string().contains("Receive Maximum 0"));
        for ok in [None, Some(1), Some(64), Some(u16::MAX)] {
            assert_eq!(check_connack(ok), Ok(()), "{ok:?}");
        }
        // Lost for it: an ordinary backoff, not a takeover.
        let t0 = Instant::now();
        let mut l = link(t0);
        assert_eq!(l.lost(&Loss::Protocol, t0), Duration::from_millis(500));
        assert_eq!(l.lost(&Loss::Protocol, t0), S);
        assert_eq!(l.takeovers, 0);
    }

    #[test]
    fn jitter_stays_below_its_bound() {
        for _ in 0..100 {
            assert!(process_jitter(Duration::from_millis(250)) < Duration::from_millis(250));
        }
    }
}
