//! A minimal MQTT 5 client for `laya-edge ask` and the demo: publish one request with a response
//! topic and correlation data, wait for the reply.
//!
//! The response topic is `{prefix}/reply/{user name}/{random key}` (the client id stands in for
//! the user name on a broker without logins), and only a message on it that carries this
//! question's correlation data (16 random bytes) is its reply. Anyone may ask a device to answer
//! on someone else's response topic; the device then echoes *that* question's correlation data,
//! so a reply reflected onto this topic is recognised and ignored (docs/security.md).

use std::time::Duration;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};

use laya_topics::Value;
use laya_topics::topic::{Channel, Schema};
use laya_topics::wire::Encoding;

/// Why asking failed.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// No reply in time; `last_status` is the device's retained status as last seen (none: no
    /// status at all, which is what a misnamed device or a wrong prefix looks like).
    #[error("{}", timeout_message(*.after, .last_status.as_ref()))]
    Timeout { after: Duration, last_status: Option<Value> },
    #[error("broker: {0}")]
    Connection(String),
    #[error("the reply could not be decoded: {0}")]
    Decode(String),
    #[error(transparent)]
    Topic(#[from] laya_topics::topic::TopicError),
    #[error("no random bytes for the correlation data")]
    Random,
}

fn timeout_message(after: Duration, last_status: Option<&Value>) -> String {
    match last_status {
        None => format!(
            "no reply within {after:?}, and no status from the device either: is it named right (--device, --prefix) and online?"
        ),
        Some(s) => format!(
            "no reply within {after:?}; the device's last status: {}",
            laya_topics::json::to_string(s, laya_topics::json::Style::COMPACT)
        ),
    }
}

/// `n` random bytes from the operating system, as lowercase hex.
fn random_hex(n: usize) -> Result<String, AskError> {
    use ring::rand::SecureRandom;
    let mut bytes = vec![0u8; n];
    ring::rand::SystemRandom::new().fill(&mut bytes).map_err(|_| AskError::Random)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Where to ask.
#[derive(Debug, Clone)]
pub struct Target {
    pub schema: Schema,
    /// A device id, or `None` with `fleet` set to ask the fleet.
    pub device: Option<String>,
    pub fleet: Option<String>,
}

/// Sends `request` and waits for its reply (decoded, whatever its encoding).
pub async fn ask(
    options: MqttOptions,
    target: &Target,
    request: &Value,
    encoding: Encoding,
    timeout: Duration,
) -> Result<Value, AskError> {
    // The level the broker's ACL lets only this user read (docs/security.md).
    let client = match options.credentials() {
        Some(login) => login.username,
        None => options.client_id().replace(['/', '+', '#'], "-"),
    };
    let correlation = random_hex(16)?.into_bytes();
    let reply_topic = target.schema.client_reply(&client, &random_hex(8)?)?;
    let ask_topic = match (&target.device, &target.fleet) {
        (Some(d), _) => target.schema.topic(d, Channel::Ask)?.to_string(),
        (None, Some(f)) => target.schema.fleet_ask(f)?,
        (None, None) => return Err(AskError::Connection("name a device or a fleet".into())),
    };
    // The device's retained status, to say on a timeout what was last known of it.
    let status_topic = match &target.device {
        Some(d) => Some(target.schema.topic(d, Channel::Status)?.to_string()),
        None => None,
    };
    let last_status = std::sync::Mutex::new(None::<Value>);
    let mut pending_subacks = if status_topic.is_some() { 2 } else { 1 };
    let (client, mut eventloop) = AsyncClient::new(options, 16);
    let work = async {
        let mut sent = false;
        loop {
            let event = eventloop.poll().await.map_err(|e| AskError::Connection(e.to_string()))?;
            match event {
                Event::Incoming(Packet::ConnAck(_)) => {
                    if let Some(t) = &status_topic {
                        client
                            .subscribe(t.clone(), QoS::AtMostOnce)
                            .await
                            .map_err(|e| AskError::Connection(e.to_string()))?;
                    }
                    client
                        .subscribe(reply_topic.clone(), QoS::AtLeastOnce)
                        .await
                        .map_err(|e| AskError::Connection(e.to_string()))?;
                }
                Event::Incoming(Packet::Publish(p))
                    if status_topic.as_deref().is_some_and(|t| p.topic.as_ref() == t.as_bytes()) =>
                {
                    if let Ok(v) = Encoding::Json.decode(&p.payload, 8)
                        && let Ok(mut last) = last_status.lock()
                    {
                        *last = Some(v);
                    }
                }
                // The reply topic's SUBACK: subscribed last, so the status topic's came first.
                Event::Incoming(Packet::SubAck(_)) if !sent && sub_acks_left(&mut pending_subacks) => {
                    sent = true;
                    let props = PublishProperties {
                        response_topic: Some(reply_topic.clone()),
                        correlation_data: Some(correlation.clone().into()),
                        content_type: Some(encoding.content_type().into()),
                        ..PublishProperties::default()
                    };
                    client
                        .publish_with_properties(
                            ask_topic.clone(),
                            QoS::AtLeastOnce,
                            false,
                            encoding.encode(request),
                            props,
                        )
                        .await
                        .map_err(|e| AskError::Connection(e.to_string()))?;
                }
                Event::Incoming(Packet::Publish(p)) if p.topic.as_ref() == reply_topic.as_bytes() => {
                    let theirs = p.properties.as_ref().and_then(|x| x.correlation_data.as_deref());
                    if theirs != Some(correlation.as_slice()) {
                        // Another question's reply, sent here by whoever named this topic.
                        tracing::warn!(topic = %reply_topic, "ignored a reply without this question's correlation data");
                        continue;
                    }
                    let ct = p.properties.as_ref().and_then(|x| x.content_type.clone());
                    let enc = Encoding::detect(ct.as_deref(), &p.payload);
                    let v = enc.decode(&p.payload, 256).map_err(|e| AskError::Decode(e.to_string()))?;
                    let _ = client.disconnect().await;
                    return Ok(v);
                }
                _ => {}
            }
        }
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(result) => result,
        Err(_) => {
            let last_status = last_status.lock().ok().and_then(|mut s| s.take());
            Err(AskError::Timeout { after: timeout, last_status })
        }
    }
}

/// Counts one SUBACK down; true when it was the last one awaited.
fn sub_acks_left(pending: &mut u32) -> bool {
    *pending = pending.saturating_sub(1);
    *pending == 0
}

/// Waits until `device`'s retained status says `online` (so a question sent now is heard).
pub async fn wait_online(
    options: MqttOptions,
    schema: &Schema,
    device: &str,
    timeout: Duration,
) -> Result<(), AskError> {
    let topic = schema.topic(device, Channel::Status)?.to_string();
    let (client, mut eventloop) = AsyncClient::new(options, 16);
    let work = async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    client
                        .subscribe(topic.clone(), QoS::AtLeastOnce)
                        .await
                        .map_err(|e| AskError::Connection(e.to_string()))?;
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let v = Encoding::Json.decode(&p.payload, 8).map_err(|e| AskError::Decode(e.to_string()))?;
                    if v.get("state").and_then(Value::as_str) == Some("online") {
                        let _ = client.disconnect().await;
                        return Ok(());
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| AskError::Timeout { after: timeout, last_status: None })?
}
