//! MQTT 5 test clients (`Client`, clean sessions; `Persistent`, a session that outlives a broker
//! restart), the request the tests ask, and reading replies and telemetry.

use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::mpsc;

use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};
use laya_topics::wire::Encoding;

/// An MQTT 5 test client that collects what it receives.
pub struct Client {
    pub client: AsyncClient,
    rx: mpsc::Receiver<Publish>,
    /// One `()` per SUBACK, so a subscription is in place before anything is published.
    subacks: tokio::sync::Mutex<mpsc::Receiver<()>>,
}

impl Client {
    pub async fn connect(port: u16, id: &str) -> Client {
        Client::connect_as(port, id, None).await
    }

    /// The same, logging in with `(user name, password)`.
    pub async fn connect_as(port: u16, id: &str, login: Option<(&str, &str)>) -> Client {
        let mut o = MqttOptions::new(id, "127.0.0.1", port);
        if let Some((user, password)) = login {
            o.set_credentials(user, password);
        }
        o.set_max_packet_size(Some(1 << 20));
        let (client, mut eventloop) = AsyncClient::new(o, 10_000);
        let (tx, rx) = mpsc::channel(100_000);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (sub_tx, subacks) = mpsc::channel(100);
        tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        if let Some(r) = ready.take() {
                            let _ = r.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = sub_tx.send(()).await;
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if tx.send(p).await.is_err() {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(10), ready_rx).await.expect("connected").expect("connack");
        Client { client, rx, subacks: tokio::sync::Mutex::new(subacks) }
    }

    /// Subscribes and waits for the broker's SUBACK.
    pub async fn subscribe(&self, filter: &str) {
        let mut subacks = self.subacks.lock().await;
        self.client.subscribe(filter, QoS::AtLeastOnce).await.expect("subscribe");
        tokio::time::timeout(Duration::from_secs(10), subacks.recv())
            .await
            .expect("a SUBACK")
            .expect("the client runs");
    }

    pub async fn next(&mut self, within: Duration) -> Option<Publish> {
        tokio::time::timeout(within, self.rx.recv()).await.ok().flatten()
    }

    pub async fn ask(
        &self,
        topic: &str,
        payload: Vec<u8>,
        response_topic: Option<&str>,
        correlation: Option<&[u8]>,
        encoding: Encoding,
    ) {
        let props = PublishProperties {
            response_topic: response_topic.map(str::to_owned),
            correlation_data: correlation.map(|c| c.to_vec().into()),
            content_type: Some(encoding.content_type().into()),
            ..PublishProperties::default()
        };
        self.client.publish_with_properties(topic, QoS::AtLeastOnce, false, payload, props).await.expect("publish");
    }
}

/// An MQTT 5 client with a persistent session (it keeps its subscriptions and gets what was
/// published while the broker restarted), subscribing only once the broker acknowledged.
pub struct Persistent {
    pub client: AsyncClient,
    rx: mpsc::Receiver<Publish>,
    subacks: mpsc::Receiver<()>,
}

impl Persistent {
    pub async fn connect(port: u16, id: &str) -> Persistent {
        Persistent::connect_as(port, id, None).await
    }

    /// The same, logging in with `(user name, password)`.
    pub async fn connect_as(port: u16, id: &str, login: Option<(&str, &str)>) -> Persistent {
        let mut o = MqttOptions::new(id, "127.0.0.1", port);
        if let Some((user, password)) = login {
            o.set_credentials(user, password);
        }
        o.set_clean_start(false);
        o.set_session_expiry_interval(Some(600));
        o.set_max_packet_size(Some(1 << 20));
        let (client, mut eventloop) = AsyncClient::new(o, 10_000);
        let (tx, rx) = mpsc::channel(100_000);
        let (sub_tx, subacks) = mpsc::channel(100);
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if tx.send(p).await.is_err() {
                            break;
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = sub_tx.send(()).await;
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        Persistent { client, rx, subacks }
    }

    pub async fn subscribe(&mut self, filter: &str) {
        self.client.subscribe(filter, QoS::AtLeastOnce).await.expect("subscribe");
        tokio::time::timeout(Duration::from_secs(10), self.subacks.recv()).await.expect("a SubAck");
    }

    pub async fn ask(&self, topic: &str, body: Vec<u8>, response_topic: Option<&str>) {
        let props = PublishProperties {
            response_topic: response_topic.map(str::to_owned),
            content_type: Some(Encoding::Json.content_type().into()),
            ..PublishProperties::default()
        };
        self.client.publish_with_properties(topic, QoS::AtLeastOnce, false, body, props).await.expect("publish");
    }

    /// The next message that `want` accepts, within `within`, with those before it (it last);
    /// panics naming `what` if none comes.
    pub async fn until(&mut self, what: &str, within: Duration, want: impl Fn(&Publish) -> bool) -> Vec<Publish> {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let p = self.next(left).await.unwrap_or_else(|| panic!("no {what} within {within:?}; saw {}", seen.len()));
            let done = want(&p);
            seen.push(p);
            if done {
                return seen;
            }
        }
    }

    pub async fn next(&mut self, within: Duration) -> Option<Publish> {
        tokio::time::timeout(within, self.rx.recv()).await.ok().flatten()
    }
}

pub fn decode(p: &Publish) -> Value {
    let ct = p.properties.as_ref().and_then(|x| x.content_type.clone());
    Encoding::detect(ct.as_deref(), &p.payload).decode(&p.payload, 256).expect("a decodable reply")
}

pub fn request(id: &str) -> Value {
    let text = format!(
        r#"{{"id": "{id}", "state": "The app crashes when I log in, please help.", "questions": {{"bug": {{"type": "noul", "instructions": "Is this a bug report?"}}, "team": {{"type": "choice", "instructions": "Which team?", "criteria": ["billing", "technical", "sales"]}}}}}}"#
    );
    json::parse_str(&text, ParseOptions::default()).expect("json")
}

/// The next telemetry document on `c` (subscribed to the device's telemetry) that `want` accepts.
pub async fn telemetry_where(c: &mut Client, what: &str, want: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let p = c.next(left).await.unwrap_or_else(|| panic!("no telemetry with {what}"));
        let v = decode(&p);
        if want(&v) {
            return v;
        }
    }
}

/// The integer at `path` in a telemetry document (panics naming the path if there is none).
pub fn counter(v: &Value, path: &[&str]) -> i64 {
    path.iter().try_fold(v, |v, k| v.get(k)).and_then(Value::as_i64).unwrap_or_else(|| panic!("{path:?} in {v:?}"))
}
