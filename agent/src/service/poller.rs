//! The connection task: polls rumqttc's event loop and does nothing else, reconnecting with
//! back-off and jitter (the decisions are `link`'s, this file does the I/O).
//!
//! It waits on nothing but the connection (the channel to the service loop is unbounded: every
//! question it carries is taken at once by the loop, which never waits either), and no poll may
//! take longer than the link allows ([`Link::poll_bound`]): a broker that stopped talking or
//! reading is dropped. It beats its part of the liveness watch on every turn.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::v5::{Packet, Publish};
use rumqttc::v5::{Event, EventLoop};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::link::{Link, Loss};
use super::liveness::{Liveness, Part};

/// What the connection task tells the service loop.
pub enum Net {
    Connected {
        session_present: bool,
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

/// Starts the connection task; it ends after the DISCONNECT (or when the loop is gone).
pub fn spawn(
    mut eventloop: EventLoop,
    mut link: Link,
    link_alive: Arc<Liveness>,
    connect_timeout: Duration,
) -> (JoinHandle<()>, mpsc::UnboundedReceiver<Net>) {
    let (net_tx, net_rx) = mpsc::unbounded_channel::<Net>();
    let poller = tokio::spawn(async move {
        loop {
            link_alive.beat(Part::Link);
            let bound = link.poll_bound(Instant::now(), connect_timeout);
            let loss = match tokio::time::timeout(bound, eventloop.poll()).await {
                Ok(Ok(event)) => {
                    match event {
                        Event::Incoming(packet) => {
                            link.incoming(Instant::now());
                            let sent = match packet {
                                Packet::ConnAck(ack) => {
                                    link.connected(Instant::now());
                                    net_tx.send(Net::Connected { session_present: ack.session_present })
                                }
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
