//! The broker connection's options: MQTT 5, a persistent session under a stable client id,
//! manual acknowledgements, the Receive Maximum, the `offline` Last Will, the Maximum Packet
//! Size, credentials and TLS; and [`preflight`], everything `serve` checks of `[mqtt]` before it
//! connects, which `check-config` runs too.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rumqttc::Transport;
use rumqttc::v5::MqttOptions;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{LastWill, LastWillProperties};

use laya_topics::topic::{Channel, Schema, TopicError};

use crate::config::Config;

/// Bytes of headroom over `max_payload` for a packet's topic and properties.
pub const PACKET_HEADROOM: usize = 16 * 1024;

/// Why the connection could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("mqtt.broker {0:?}: expected mqtt://host[:port] or mqtts://host[:port]")]
    Url(String),
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("TLS: {0}")]
    Tls(String),
    #[error("mqtt: {0}")]
    Topic(#[from] TopicError),
    #[error("{what} is {len} bytes; MQTT carries at most {max} (a two-byte length)", max = crate::config::MQTT_STRING_MAX)]
    TooLong { what: &'static str, len: usize },
}

/// Host, port and whether TLS is on, from `mqtt://` / `mqtts://` URLs.
pub fn parse_broker(url: &str) -> Result<(String, u16, bool), ConnectionError> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("mqtts://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("mqtt://") {
        (false, r)
    } else {
        return Err(ConnectionError::Url(url.to_owned()));
    };
    let rest = rest.trim_end_matches('/');
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
            (h.trim_matches(['[', ']']).to_owned(), p.parse().map_err(|_| ConnectionError::Url(url.to_owned()))?)
        }
        _ => (rest.trim_matches(['[', ']']).to_owned(), if tls { 8883 } else { 1883 }),
    };
    if host.is_empty() || host.contains('/') {
        return Err(ConnectionError::Url(url.to_owned()));
    }
    Ok((host, port, tls))
}

fn read(path: &Path) -> Result<Vec<u8>, ConnectionError> {
    std::fs::read(path).map_err(|source| ConnectionError::Read { path: path.display().to_string(), source })
}

/// A rustls client configuration (ring provider, pure Rust) from the configured PEM files.
fn tls_config(cfg: &Config) -> Result<rustls::ClientConfig, ConnectionError> {
    let tls = |e: &dyn std::fmt::Display| ConnectionError::Tls(e.to_string());
    let Some(ca_file) = &cfg.mqtt.ca_file else {
        return Err(ConnectionError::Tls("mqtts:// needs mqtt.ca_file (PEM CA certificates)".into()));
    };
    let mut roots = rustls::RootCertStore::empty();
    let ca = read(ca_file)?;
    for cert in rustls_pemfile::certs(&mut ca.as_slice()) {
        roots.add(cert.map_err(|e| tls(&e))?).map_err(|e| tls(&e))?;
    }
    if roots.is_empty() {
        return Err(ConnectionError::Tls(format!("no certificates in {}", ca_file.display())));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(&e))?
        .with_root_certificates(roots);
    // Config::check: a client certificate comes with its key.
    let (Some(client_cert), Some(client_key)) = (&cfg.mqtt.client_cert, &cfg.mqtt.client_key) else {
        return Ok(builder.with_no_client_auth());
    };
    let certs = rustls_pemfile::certs(&mut read(client_cert)?.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls(&e))?;
    let key = rustls_pemfile::private_key(&mut read(client_key)?.as_slice())
        .map_err(|e| tls(&e))?
        .ok_or_else(|| ConnectionError::Tls(format!("no private key in {}", client_key.display())))?;
    builder.with_client_auth_cert(certs, key).map_err(|e| tls(&e))
}

/// The password in `path`: its whole content, trailing newlines (`\n`, `\r`) trimmed.
pub fn read_password(path: &Path) -> Result<String, ConnectionError> {
    Ok(String::from_utf8_lossy(&read(path)?).trim_end_matches(['\n', '\r']).to_owned())
}

/// Everything `serve` checks of `[mqtt]` before it connects, without connecting: the topics the
/// device id, prefix and fleet make (a device id with a wildcard, `/` or a reserved name is
/// refused), the response-topic allowlist, and the connection options themselves (the broker
/// URL, the password file, the CA file, the client certificate and key, read and parsed as the
/// connection would). `check-config` runs it, so it refuses what `serve` would.
pub fn preflight(cfg: &Config) -> Result<(), ConnectionError> {
    if cfg.mqtt.broker.is_empty() {
        // No broker: the HTTP door alone (`Config::check` allows it only with one).
        return Ok(());
    }
    let schema = Schema::new(&cfg.mqtt.prefix)?;
    let device = cfg.device();
    for channel in [Channel::Ask, Channel::Telemetry, Channel::Events, Channel::Errors] {
        schema.topic(&device, channel)?;
    }
    if !cfg.mqtt.fleet.is_empty() {
        schema.fleet_subscription(&cfg.mqtt.share_group, &cfg.mqtt.fleet)?;
    }
    for filter in &cfg.mqtt.response_topics {
        schema.response_filter(filter)?;
    }
    let status = schema.topic(&device, Channel::Status)?.to_string();
    options(cfg, &status, Vec::new())?;
    Ok(())
}

/// The connection options for this agent.
pub fn options(cfg: &Config, status_topic: &str, offline_payload: Vec<u8>) -> Result<MqttOptions, ConnectionError> {
    let (host, port, tls) = parse_broker(&cfg.mqtt.broker)?;
    let mut o = MqttOptions::new(cfg.client_id(), host, port);
    o.set_keep_alive(Duration::from_secs(cfg.mqtt.keep_alive_s.max(5)));
    o.set_clean_start(false);
    o.set_session_expiry_interval(Some(cfg.mqtt.session_expiry_s));
    o.set_manual_acks(true);
    // At most this many questions delivered and unacknowledged: the broker holds the rest, so a
    // flood waits at the broker rather than being refused `overloaded`, and a killed agent
    // strands no more than this in its session.
    o.set_receive_maximum(Some(cfg.receive_maximum()));
    // Questions and replies are small and latency-bound: no Nagle delay.
    let mut net = rumqttc::NetworkOptions::new();
    net.set_tcp_nodelay(true);
    o.set_network_options(net);
    // Announced to the broker (it drops what is far too large) and used as rumqttc's own
    // incoming packet limit (10 KiB by default, far too small for a question).
    o.set_max_packet_size(Some((cfg.mqtt.max_payload + PACKET_HEADROOM).min(u32::MAX as usize) as u32));
    let will_props = LastWillProperties {
        delay_interval: None,
        payload_format_indicator: Some(1),
        message_expiry_interval: None,
        content_type: Some(laya_topics::wire::CONTENT_JSON.into()),
        response_topic: None,
        correlation_data: None,
        user_properties: Vec::new(),
    };
    // Longer ones could not be encoded: every CONNECT would be refused, for ever.
    if offline_payload.len() > crate::config::MQTT_STRING_MAX {
        return Err(ConnectionError::TooLong {
            what: "the Last Will (the offline status)",
            len: offline_payload.len(),
        });
    }
    o.set_last_will(LastWill::new(status_topic, offline_payload, QoS::AtLeastOnce, true, Some(will_props)));
    if !cfg.mqtt.username.is_empty() {
        let password = match &cfg.mqtt.password_file {
            None => String::new(),
            Some(file) => read_password(file)?,
        };
        if password.len() > crate::config::MQTT_STRING_MAX {
            return Err(ConnectionError::TooLong { what: "the password (mqtt.password_file)", len: password.len() });
        }
        o.set_credentials(cfg.mqtt.username.clone(), password);
    }
    if tls {
        o.set_transport(Transport::Tls(rumqttc::TlsConfiguration::Rustls(Arc::new(tls_config(cfg)?))));
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_urls_give_host_port_and_tls() {
        assert_eq!(parse_broker("mqtt://localhost").unwrap(), ("localhost".into(), 1883, false));
        assert_eq!(parse_broker("mqtts://broker.example:8884/").unwrap(), ("broker.example".into(), 8884, true));
        assert_eq!(parse_broker("mqtt://127.0.0.1:1999").unwrap(), ("127.0.0.1".into(), 1999, false));
        assert!(parse_broker("tcp://x").is_err());
        assert!(parse_broker("mqtt://:1883").is_err());
        assert!(parse_broker("mqtt://h:port").is_err());
    }

    #[test]
    fn preflight_refuses_a_device_id_with_wildcards_and_missing_credentials_files() {
        let refused = |edit: &dyn Fn(&mut Config), want: &str| {
            let mut cfg = Config::default();
            cfg.mqtt.device = "board-7".into();
            edit(&mut cfg);
            let err = preflight(&cfg).expect_err(want).to_string();
            assert!(err.contains(want), "{want}: {err}");
        };
        refused(&|c| c.mqtt.device = "board/+".into(), "device id");
        refused(&|c| c.mqtt.device = "reply".into(), "reserved");
        refused(
            &|c| {
                c.mqtt.username = "board-7".into();
                c.mqtt.password_file = Some("/nonexistent/password".into());
            },
            "/nonexistent/password",
        );
        refused(
            &|c| {
                c.mqtt.broker = "mqtts://localhost".into();
                c.mqtt.ca_file = Some("/nonexistent/ca.pem".into());
            },
            "/nonexistent/ca.pem",
        );
        let mut cfg = Config::default();
        cfg.mqtt.device = "board-7".into();
        preflight(&cfg).unwrap();
    }

    #[test]
    fn mqtts_without_a_ca_file_is_a_clear_error() {
        let mut cfg = Config::default();
        cfg.mqtt.broker = "mqtts://localhost".into();
        let err = options(&cfg, "laya/v1/d/status", b"{}".to_vec()).unwrap_err();
        assert!(err.to_string().contains("ca_file"), "{err}");
    }
}
