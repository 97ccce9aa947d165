//! The thin-edge.io bridge (`[thin_edge]`, issue #42): a fleet that runs thin-edge on its boards
//! sees the agent as one of its services (registered, with a health, measurements and events)
//! without a plugin of its own reading laya's topics. The bridge runs beside the service in the
//! agent's process, on the same broker with its own connection, so the service needs no part of
//! it: it reads what the agent already publishes (its retained status, its telemetry, its events)
//! and republishes it in thin-edge's formats. Its Last Will is the service's health `down`, so a
//! killed agent is `down` in thin-edge as it is `offline` on its own status topic.
//!
//! I/O only: what is published where is `laya_topics::thin_edge`'s, pure and tested there.
//!
//! **Which status counts.** A status delivered live is the agent's (the bridge subscribed
//! before it came). One delivered retained on subscribing may be an earlier run's: it counts if
//! its `birth` is not before this bridge started (the service starts after it, in this process)
//! or is the birth of a status this bridge already saw live (the broker restarted). Until a
//! status counts, the health is `down`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rumqttc::Outgoing;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use laya_topics::thin_edge::{Health, Message, NameError, Service};
use laya_topics::topic::{Channel, Schema, TopicError};
use laya_topics::wire::{Encoding, Status};

use crate::config::Config;
use crate::service::connection::{self, ConnectionError};

/// How long stopping may take: publishing `down` and disconnecting, or giving up on a broker
/// that does not answer (the will says `down` then).
const STOP_BOUND: Duration = Duration::from_secs(3);

/// Requests the bridge may queue for its connection; beyond them a measurement or an event is
/// dropped (with a debug line) rather than the bridge waiting on a broker that is away.
const QUEUE: usize = 64;

/// Why the bridge could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ThinEdgeError {
    #[error("{0}")]
    Name(#[from] NameError),
    #[error("thin_edge: the agent's topics: {0}")]
    Topic(#[from] TopicError),
    #[error("thin_edge: the broker connection: {0}")]
    Connection(#[from] ConnectionError),
}

/// The running bridge: [`Bridge::stop`] ends it.
pub struct Bridge {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Bridge {
    /// Publishes `down` (with this process's pid and the time, which the will has not) and
    /// disconnects cleanly, within [`STOP_BOUND`].
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(STOP_BOUND + Duration::from_secs(1), &mut self.task).await.is_err() {
            tracing::warn!("thin-edge bridge: not stopped within its bound");
            self.task.abort();
        }
    }
}

/// Starts the bridge when `[thin_edge] enabled` (none otherwise), on the runtime it is called
/// from. Errors are the configuration's (names, the broker URL, TLS files), never the broker's:
/// a broker that is away is retried as the service retries it.
pub fn spawn(config: &Config) -> Result<Option<Bridge>, ThinEdgeError> {
    if !config.thin_edge.enabled {
        return Ok(None);
    }
    let state = State::new(config)?;
    let options = options(config, &state.service)?;
    let backoff = Backoff::new(config);
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(run(state, options, backoff, stopped));
    Ok(Some(Bridge { stop: Some(stop), task }))
}

/// `[mqtt]`'s connection options (broker, TLS, login, keep-alive, packet size) with the bridge's
/// own client id, a clean session, automatic acknowledgements, and `down` as the will.
fn options(config: &Config, service: &Service) -> Result<MqttOptions, ThinEdgeError> {
    let will = service.will();
    let mut o = connection::options(config, &will.topic, will.payload)?;
    o.set_client_id(config.thin_edge_client_id());
    o.set_clean_start(true);
    o.set_session_expiry_interval(None);
    o.set_manual_acks(false);
    o.set_receive_maximum(None);
    Ok(o)
}

/// The reconnect delay: `[mqtt] reconnect_min_ms`, doubled after each failure up to
/// `reconnect_max_ms`.
struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(config: &Config) -> Backoff {
        let min = Duration::from_millis(config.mqtt.reconnect_min_ms);
        let max = Duration::from_millis(config.mqtt.reconnect_max_ms).max(min);
        Backoff { min, max, next: min }
    }

    fn failed(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        now
    }

    fn connected(&mut self) {
        self.next = self.min;
    }
}

/// What the bridge knows and maps.
struct State {
    service: Service,
    status: String,
    telemetry: String,
    events: String,
    checks: [String; 2],
    health: Health,
    /// When this bridge started, in milliseconds since the epoch (a status's `birth` unit).
    started_ms: u64,
    /// The birth of the last status delivered live.
    live_birth: Option<u64>,
    max_depth: usize,
}

fn now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
}

impl State {
    fn new(config: &Config) -> Result<State, ThinEdgeError> {
        let service = config.thin_edge.service()?;
        let schema = Schema::new(&config.mqtt.prefix)?;
        let device = config.device();
        let topic = |c| schema.topic(&device, c).map(|t| t.to_string());
        Ok(State {
            checks: service.health_check_topics(),
            status: topic(Channel::Status)?,
            telemetry: topic(Channel::Telemetry)?,
            events: topic(Channel::Events)?,
            service,
            health: Health::Down,
            started_ms: u64::try_from(now().as_millis()).unwrap_or(u64::MAX),
            live_birth: None,
            max_depth: config.limits.nesting_depth,
        })
    }

    /// The filters the bridge subscribes to.
    fn filters(&self) -> Vec<&str> {
        let mut f = vec![self.status.as_str(), self.telemetry.as_str(), self.events.as_str()];
        f.extend(self.checks.iter().map(String::as_str));
        f
    }

    /// The current health as published by the bridge: with the pid and the time.
    fn health_message(&self) -> Message {
        self.service.health(self.health, Some(std::process::id()), Some(now().as_secs()))
    }

    /// What to publish for a message on one of the agent's topics or a health check.
    fn on_publish(&mut self, p: &Publish) -> Option<Message> {
        let topic = std::str::from_utf8(&p.topic).ok()?;
        if self.checks.iter().any(|c| c == topic) {
            return Some(self.health_message());
        }
        let content_type = p.properties.as_ref().and_then(|x| x.content_type.as_deref());
        let doc = match Encoding::detect(content_type, &p.payload).decode(&p.payload, self.max_depth) {
            Ok(doc) => doc,
            Err(e) => {
                tracing::debug!(topic, error = %e, "thin-edge bridge: a document it cannot read");
                return None;
            }
        };
        if topic == self.status {
            let status = Status::from_value(&doc)?;
            if p.retain {
                let ours = status.birth >= self.started_ms || Some(status.birth) == self.live_birth;
                if !ours {
                    tracing::debug!(birth = status.birth, "thin-edge bridge: an earlier run's retained status");
                    return None;
                }
            } else {
                self.live_birth = Some(status.birth);
            }
            let health = Health::of(&status);
            if health == self.health {
                return None;
            }
            self.health = health;
            tracing::info!(health = health.as_str(), "thin-edge bridge: the service's health");
            Some(self.health_message())
        } else if topic == self.telemetry {
            self.service.measurement(&doc)
        } else if topic == self.events {
            self.service.event(&doc)
        } else {
            None
        }
    }
}

/// Queues `m` for the connection; a full queue drops it (the broker is away).
fn publish(client: &AsyncClient, m: Message) {
    // Health and registration are state (QoS 1, retained); a measurement is the next one's to
    // replace (QoS 0, as the agent's telemetry); an event QoS 1.
    let qos = if m.topic.contains("/m/") { QoS::AtMostOnce } else { QoS::AtLeastOnce };
    if let Err(e) = client.try_publish(m.topic.as_str(), qos, m.retain, m.payload) {
        tracing::debug!(topic = %m.topic, error = %e, "thin-edge bridge: not queued");
    }
}

async fn run(mut state: State, options: MqttOptions, mut backoff: Backoff, mut stopped: oneshot::Receiver<()>) {
    let (client, mut eventloop) = AsyncClient::new(options, QUEUE);
    let mut connected = false;
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            polled = eventloop.poll() => match polled {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    connected = true;
                    backoff.connected();
                    tracing::info!(entity = %state.service.entity(), "thin-edge bridge: connected");
                    for filter in state.filters() {
                        if let Err(e) = client.try_subscribe(filter, QoS::AtLeastOnce) {
                            tracing::warn!(filter, error = %e, "thin-edge bridge: cannot subscribe");
                        }
                    }
                    // thin-edge keeps both retained; a broker that lost them gets them again.
                    publish(&client, state.service.registration());
                    publish(&client, state.health_message());
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    if let Some(m) = state.on_publish(&p) {
                        publish(&client, m);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    let wait = backoff.failed();
                    if connected {
                        tracing::warn!(error = %e, "thin-edge bridge: the broker connection was lost; reconnecting");
                        connected = false;
                    } else {
                        tracing::debug!(error = %e, retry_in = ?wait, "thin-edge bridge: no broker connection");
                    }
                    tokio::select! {
                        _ = &mut stopped => break,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }
    state.health = Health::Down;
    if stop(&state, &client, &mut eventloop).await {
        tracing::info!("thin-edge bridge: down published, disconnected");
    } else {
        tracing::warn!("thin-edge bridge: could not say down before stopping; the broker's will says it");
    }
}

/// Stopping (`state` says `down`), within [`STOP_BOUND`]: nothing more in (every filter
/// unsubscribed), `down` from the bridge itself, and once the broker acknowledged both, a clean
/// DISCONNECT (no will) after which nothing is sent; then read on until the broker closes.
/// Whether the DISCONNECT went out.
///
/// The order matters on a real broker (mosquitto 2.0, reproduced under load): a PUBACK the
/// bridge sends after its DISCONNECT (for a status that arrived meanwhile), or a socket closed
/// with a PUBACK unread (reset), ended the connection before the broker read the DISCONNECT,
/// and the will fired over the bridge's own `down`.
async fn stop(state: &State, client: &AsyncClient, eventloop: &mut rumqttc::v5::EventLoop) -> bool {
    let filters = state.filters();
    for filter in &filters {
        if let Err(e) = client.try_unsubscribe(*filter) {
            tracing::debug!(filter, error = %e, "thin-edge bridge: cannot queue the unsubscribe");
        }
    }
    publish(client, state.health_message());
    let mut sent = false;
    let _ = tokio::time::timeout(STOP_BOUND, async {
        // The bridge never unsubscribes otherwise: the publish after the last of these
        // unsubscribes is `down`.
        let (mut unsubscribed, mut unsubacks, mut down) = (0, 0, false);
        loop {
            match eventloop.poll().await {
                Ok(Event::Outgoing(Outgoing::Unsubscribe(_))) => unsubscribed += 1,
                Ok(Event::Outgoing(Outgoing::Publish(_))) if unsubscribed == filters.len() => down = true,
                Ok(Event::Incoming(Packet::UnsubAck(_))) => unsubacks += 1,
                Ok(_) => {}
                Err(_) => return,
            }
            if unsubacks >= filters.len() && down && eventloop.state.inflight() == 0 {
                break;
            }
        }
        if client.try_disconnect().is_err() {
            return;
        }
        loop {
            match eventloop.poll().await {
                Ok(Event::Outgoing(Outgoing::Disconnect)) => break,
                Ok(_) => {}
                Err(_) => return,
            }
        }
        sent = true;
        // Read on until the broker closes the connection: a socket closed with unread bytes is
        // reset, which can discard the DISCONNECT before the broker reads it.
        while eventloop.poll().await.is_ok() {}
    })
    .await;
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        let mut config = Config::default();
        config.mqtt.device = "board-7".into();
        config.thin_edge.enabled = true;
        State::new(&config).expect("a state")
    }

    fn status(online: bool, birth: u64) -> Vec<u8> {
        let state = if online { "online" } else { "offline" };
        format!(r#"{{"state":"{state}","backend_state":"ready","birth":{birth}}}"#).into_bytes()
    }

    fn delivered(topic: &str, payload: Vec<u8>, retain: bool) -> Publish {
        let mut p = Publish::new(topic, QoS::AtLeastOnce, payload, None);
        p.retain = retain;
        p
    }

    fn health_of(m: &Message) -> String {
        let v = laya_topics::json::parse(&m.payload, Default::default()).expect("json");
        v.get("status").and_then(laya_topics::Value::as_str).unwrap_or_default().to_owned()
    }

    #[test]
    fn a_live_status_sets_the_health_and_only_a_change_is_published() {
        let mut s = state();
        let up = s.on_publish(&delivered("laya/v1/board-7/status", status(true, 1), false)).expect("up");
        assert_eq!(
            (up.topic.as_str(), health_of(&up).as_str()),
            ("te/device/main/service/laya-edge/status/health", "up")
        );
        assert_eq!(s.on_publish(&delivered("laya/v1/board-7/status", status(true, 1), false)), None);
        let down = s.on_publish(&delivered("laya/v1/board-7/status", status(false, 1), false)).expect("down");
        assert_eq!(health_of(&down), "down");
        // The broker restarted: the same run's status, retained, still counts.
        let up = s.on_publish(&delivered("laya/v1/board-7/status", status(true, 1), true)).expect("up");
        assert_eq!(health_of(&up), "up");
    }

    #[test]
    fn an_earlier_runs_retained_online_status_does_not_make_the_service_up() {
        let mut s = state();
        let before = s.started_ms - 60_000;
        assert_eq!(s.on_publish(&delivered("laya/v1/board-7/status", status(true, before), true)), None);
        assert_eq!(s.health, Health::Down);
        let now = s.started_ms + 5;
        let up = s.on_publish(&delivered("laya/v1/board-7/status", status(true, now), true)).expect("up");
        assert_eq!(health_of(&up), "up");
    }

    #[test]
    fn a_health_check_of_the_service_or_of_its_device_is_answered_with_the_current_health() {
        let mut s = state();
        for topic in ["te/device/main/service/laya-edge/cmd/health/check", "te/device/main///cmd/health/check"] {
            let m = s.on_publish(&delivered(topic, b"{}".to_vec(), false)).expect(topic);
            assert_eq!((m.topic.as_str(), m.retain), ("te/device/main/service/laya-edge/status/health", true));
            assert_eq!(health_of(&m), "down");
        }
        assert_eq!(s.on_publish(&delivered("te/device/main/service/other/cmd/health/check", Vec::new(), false)), None);
        // What cannot be read is left alone.
        assert_eq!(s.on_publish(&delivered("laya/v1/board-7/telemetry", b"{not json".to_vec(), false)), None);
        assert!(s.on_publish(&delivered("laya/v1/board-7/telemetry", br#"{"uptime_s":3}"#.to_vec(), false)).is_some());
    }
}
