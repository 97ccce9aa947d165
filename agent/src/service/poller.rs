//! The connection task: polls rumqttc's event loop and does nothing else, reconnecting with
//! back-off and jitter (the decisions are `link`'s, this file does the I/O).
//!
//! It waits on nothing but the connection (the channel to the service loop is unbounded: every
//! question it carries is taken at once by the loop, which never waits either), and no poll may
//! take longer than the link allows ([`Link::poll_bound`]): a broker that stopped talking or
//! reading is dropped. It beats its part of the liveness watch on every turn.
//!
//! Each CONNACK settles the connection's terms ([`accept`]): the keep-alive the broker assigned
//! is the one the link watches (rumqttc already pings at it), a CONNACK the link cannot work with
//! ends the connection at once. rumqttc keeps what a CONNACK assigned in its options, so what we
//! ask for is put back before every new attempt ([`Asked`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::v5::{ConnAck, Packet, Publish};
use rumqttc::v5::{Event, EventLoop, MqttOptions, MqttState};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::link::{ConnAckFault, Link, Loss, check_connack, negotiated_keep_alive};
use super::liveness::{Liveness, Part};

/// What the connection task tells the service loop.
pub enum Net {
    Connected {
        session_present: bool,
        /// The connection's keep-alive ([`negotiated_keep_alive`]).
        keep_alive: Duration,
    },
    Question(Box<Publish>),
    /// Our session was taken over: `named` by the broker (0x8E), else inferred from closes.
    TakenOver {
        named: bool,
    },
    /// The connection was lost (it is being retried).
    Lost,
    /// The broker closed the connection after our DISCONNECT.
    Closed,
}

/// What we ask the broker for in CONNECT and a CONNACK may overrule: rumqttc 0.25 writes the
/// broker's Server Keep Alive and Session Expiry Interval into its options, and would ask the
/// next broker for those.
struct Asked {
    keep_alive: Duration,
    session_expiry: Option<u32>,
}

impl Asked {
    fn of(options: &MqttOptions) -> Asked {
        Asked { keep_alive: options.keep_alive(), session_expiry: options.session_expiry_interval() }
    }

    /// Puts our own values back before the next attempt.
    fn restore(&self, options: &mut MqttOptions) {
        // `set_keep_alive` refuses less than 5 s; ours came through it.
        if self.keep_alive >= Duration::from_secs(5) {
            options.set_keep_alive(self.keep_alive);
        }
        options.set_session_expiry_interval(self.session_expiry);
    }
}

/// Settles a connection's terms from its CONNACK: the keep-alive it is watched and pinged at, or
/// why it cannot be used. rumqttc already pings at an assigned keep-alive; an assigned 0 (none)
/// would make it ping without pause, so it gets ours back.
fn accept(eventloop: &mut EventLoop, asked: &Asked, ack: &ConnAck) -> Result<Duration, ConnAckFault> {
    let props = ack.properties.as_ref();
    check_connack(props.and_then(|p| p.receive_max))?;
    let assigned = props.and_then(|p| p.server_keep_alive);
    let keep_alive = negotiated_keep_alive(asked.keep_alive, assigned);
    match assigned {
        Some(0) => {
            asked.restore(&mut eventloop.options);
            tracing::warn!(
                keep_alive_s = keep_alive.as_secs(),
                "the broker assigned no keep-alive (Server Keep Alive 0): pinging and watching the link at our own"
            );
        }
        Some(secs) if keep_alive != asked.keep_alive => tracing::info!(
            keep_alive_s = secs,
            asked_s = asked.keep_alive.as_secs(),
            "the broker assigned its own keep-alive: pinging and watching the link at the broker's"
        ),
        _ => {}
    }
    Ok(keep_alive)
}

/// Starts the connection task; it ends after the DISCONNECT (or when the loop is gone).
pub fn spawn(
    mut eventloop: EventLoop,
    mut link: Link,
    link_alive: Arc<Liveness>,
    connect_timeout: Duration,
) -> (JoinHandle<()>, mpsc::UnboundedReceiver<Net>) {
    let (net_tx, net_rx) = mpsc::unbounded_channel::<Net>();
    let asked = Asked::of(&eventloop.options);
    // The turn the liveness watch was given; a longer keep-alive extends it.
    let base_turn = link.longest_turn(connect_timeout);
    let poller = tokio::spawn(async move {
        loop {
            link_alive.beat(Part::Link);
            let bound = link.poll_bound(Instant::now(), connect_timeout);
            let loss = match tokio::time::timeout(bound, eventloop.poll()).await {
                Ok(Ok(Event::Incoming(Packet::ConnAck(ack)))) => match accept(&mut eventloop, &asked, &ack) {
                    Ok(keep_alive) => {
                        link.connected(Instant::now(), keep_alive);
                        link_alive.extend_link(link.longest_turn(connect_timeout).saturating_sub(base_turn));
                        let connected = Net::Connected { session_present: ack.session_present, keep_alive };
                        if net_tx.send(connected).is_err() {
                            break;
                        }
                        continue;
                    }
                    Err(fault) => {
                        tracing::error!(%fault, "dropping the connection and connecting again");
                        eventloop.clean();
                        // rumqttc keeps a CONNACK's Receive Maximum until another CONNACK names
                        // one: a fresh state, so that a next CONNACK without one (65,535) is not
                        // read as 0. `clean` moved what was unacknowledged to `pending`.
                        let limit = eventloop.options.get_outgoing_inflight_upper_limit().unwrap_or(u16::MAX);
                        eventloop.state = MqttState::new(limit, eventloop.options.manual_acks());
                        Loss::Protocol
                    }
                },
                Ok(Ok(event)) => {
                    match event {
                        Event::Incoming(packet) => {
                            link.incoming(Instant::now());
                            let sent = match packet {
                                Packet::Publish(p) => net_tx.send(Net::Question(Box::new(p))),
                                _ => Ok(()),
                            };
                            if sent.is_err() {
                                break;
                            }
                        }
                        Event::Outgoing(rumqttc::Outgoing::Disconnect) => {
                            // Read on until the broker closes the connection: closing a socket with
                            // unread bytes (a PUBACK for `offline`) sends a TCP reset, which can
                            // discard the DISCONNECT before the broker reads it, and then the Last
                            // Will fires.
                            let drain = async { while eventloop.poll().await.is_ok() {} };
                            let _ = tokio::time::timeout(Duration::from_secs(3), drain).await;
                            let _ = net_tx.send(Net::Closed);
                            break;
                        }
                        Event::Outgoing(_) => {}
                    }
                    continue;
                }
                Ok(Err(rumqttc::v5::ConnectionError::MqttState(rumqttc::v5::StateError::ServerDisconnect {
                    reason_code: rumqttc::v5::mqttbytes::v5::DisconnectReasonCode::SessionTakenOver,
                    ..
                }))) => Loss::TakenOver,
                Ok(Err(rumqttc::v5::ConnectionError::MqttState(rumqttc::v5::StateError::ConnectionAborted)))
                    if link.is_connected() =>
                {
                    tracing::warn!("the broker closed the connection");
                    Loss::Closed
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "broker connection lost");
                    Loss::Error
                }
                Err(_) => {
                    // The poll was cut short: drop the connection, keep what is unacknowledged
                    // for the next one.
                    let loss = link.poll_timed_out(Instant::now());
                    eventloop.clean();
                    match loss {
                        Loss::Silent => tracing::warn!(
                            silent_s = bound.as_secs_f64(),
                            keep_alive_s = link.keep_alive().as_secs(),
                            "the broker said nothing for one and a half keep-alives: the connection is taken for lost"
                        ),
                        _ => tracing::warn!(
                            stuck_s = bound.as_secs_f64(),
                            "the broker connection made no progress (a write the broker does not read): reconnecting"
                        ),
                    }
                    loss
                }
            };
            if net_tx.send(Net::Lost).is_err() {
                break;
            }
            let taken_before = link.takeovers;
            let wait = link.lost(&loss, Instant::now());
            asked.restore(&mut eventloop.options);
            link_alive.extend_link(Duration::ZERO);
            if link.takeovers > taken_before {
                let named = loss == Loss::TakenOver;
                tracing::warn!(
                    client_id = %eventloop.options.client_id(),
                    takeovers = link.takeovers,
                    retry_in = ?wait,
                    "another client connected with this agent's client id and took its session \
                     (two devices with one client id, e.g. a cloned image?): reconnecting later"
                );
                if net_tx.send(Net::TakenOver { named }).is_err() {
                    break;
                }
            } else {
                tracing::info!(retry_in = ?wait, "reconnecting to the broker");
            }
            link_alive.beat(Part::Link);
            tokio::time::sleep(wait).await;
        }
    });
    (poller, net_rx)
}
