//! Telling the fleet why this agent cannot serve: a `serve` whose model or engine configuration is
//! refused at start (a bundle file whose sha256 does not match, a missing checkpoint, a backend
//! without its libraries) would otherwise only say so in a board's journal. With a usable
//! `[mqtt]` section it connects once, publishes a `config_error` event on
//! `{prefix}/{device}/events` (QoS 1, waiting for the broker's acknowledgement, bounded), and
//! disconnects cleanly; `serve` then exits with the error as before.
//!
//! It connects under its own client id (`{client id}-report`) with a clean session, so the
//! agent's persistent session and the questions queued in it are left alone.

use std::time::Duration;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event};

use laya_topics::topic::{Channel, Schema};
use laya_topics::wire::{Encoding, EngineEvent, EventKind, Role};

use super::connection;
use super::identity::{Identity, Served};
use super::telemetry::{self, Birth};
use crate::config::Config;

/// How long the report may take (connect, publish, acknowledgement).
pub const REPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The `config_error` event for `message`.
pub fn config_error_event(message: &str) -> EngineEvent {
    EngineEvent {
        event: EventKind::ConfigError,
        reason: None,
        code: None,
        name: None,
        message: message.to_owned(),
        deadline_ms: None,
        role: Some(Role::Primary),
        probe: None,
        reload: None,
        serving: None,
    }
}

/// Publishes `config_error` with `message` for this device; an error if the broker could not be
/// told (the caller logs it: the configuration error is what matters).
pub async fn config_error(config: &Config, message: &str) -> Result<(), String> {
    let schema = Schema::new(&config.mqtt.prefix).map_err(|e| e.to_string())?;
    let device = config.device();
    let events = schema.topic(&device, Channel::Events).map_err(|e| e.to_string())?.to_string();
    let status = schema.topic(&device, Channel::Status).map_err(|e| e.to_string())?.to_string();
    // Nothing is known of the model yet: the configured directory, no name, no digest.
    let unknown = Identity::default();
    let served = Served {
        backend: config.engine.backend.name(),
        model: config.model.dir.display().to_string(),
        identity: &unknown,
        since: 0,
        last_reload: None,
    };
    let offline = telemetry::status(false, &served, &Birth::now(&config.mqtt.fleet), None, 0);
    let mut own = config.clone();
    own.mqtt.client_id = format!("{}-report", config.client_id());
    let mut options =
        connection::options(&own, &status, Encoding::Json.encode(&offline.to_value())).map_err(|e| e.to_string())?;
    options.set_clean_start(true);
    options.set_session_expiry_interval(None);
    options.set_manual_acks(false);
    let (client, mut eventloop) = AsyncClient::new(options, 8);
    let payload = Encoding::Json.encode(&config_error_event(message).to_value());
    let work = async {
        loop {
            match eventloop.poll().await.map_err(|e| e.to_string())? {
                Event::Incoming(Packet::ConnAck(_)) => {
                    client
                        .publish(events.clone(), QoS::AtLeastOnce, false, payload.clone())
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Event::Incoming(Packet::PubAck(_)) => {
                    let _ = client.disconnect().await;
                    // Until the DISCONNECT is written.
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), async { while eventloop.poll().await.is_ok() {} })
                            .await;
                    return Ok(());
                }
                _ => {}
            }
        }
    };
    tokio::time::timeout(REPORT_TIMEOUT, work)
        .await
        .map_err(|_| "the broker did not take the report in time".to_owned())?
}
