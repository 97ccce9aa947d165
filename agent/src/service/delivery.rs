//! The delivery gate: a question's reply is published and the question acknowledged together,
//! or not at all.
//!
//! A question is acknowledged only after its reply (or error reply) has been handed to the
//! client, so a crash at any point leaves it unacknowledged and the broker delivers it again to
//! this persistent session. At shutdown the gate closes ([`Gate::close`]) once the questions in
//! progress had their grace: from then on nothing is published or acknowledged, so each question
//! was either answered *and* acknowledged before the agent's `offline` status and its
//! DISCONNECT, or neither.
//!
//! Deliveries are handed to the connection a few at a time, their clients in turn
//! ([`Turnstile`]): one client's flood of replies does not make another's wait behind it.

use std::sync::Arc;
use std::time::Duration;

use rumqttc::v5::AsyncClient;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Publish, PublishProperties};
use tokio::sync::RwLock;

use laya_topics::wire::Encoding;

use super::admission::ReplyTo;
use super::flow::{self, ClientKey, Flow};
use super::telemetry::Counters;
use super::turnstile::Turnstile;

/// What a handled question sends back before it is acknowledged.
#[derive(Debug)]
pub struct Outbound {
    pub to: ReplyTo,
    pub payload: Vec<u8>,
    /// An answer computed for this question (counted in `answered`), not an error or a resend.
    pub answered: bool,
}

/// Publishes replies and acknowledges questions, until closed.
pub struct Gate {
    client: AsyncClient,
    /// Closed (true) once shutdown has waited for the questions in progress. Publishing a reply
    /// and acknowledging its question happen under the read lock, so the two are both sent
    /// before the DISCONNECT, or neither is.
    closed: RwLock<bool>,
    counters: Arc<Counters>,
    /// Told when a reply went out (the heap trim after a burst).
    flow: Arc<Flow>,
    /// Deliveries being handed to the connection, and those waiting their client's turn.
    way_out: Turnstile,
}

impl Gate {
    pub fn new(client: AsyncClient, counters: Arc<Counters>, flow: Arc<Flow>) -> Gate {
        Gate { client, closed: RwLock::new(false), counters, flow, way_out: Turnstile::new(flow::OUTLET_PASSES) }
    }

    /// Sends what a question's handling produced, then acknowledges the question; after
    /// shutdown closed the gate, neither.
    ///
    /// `place` (the question's place in `limits.queue`) is given back before the acknowledgement:
    /// the broker sends the next question as soon as it has the PUBACK, and that question must
    /// find its place free (or its turn in the waiting room), not be refused `overloaded`.
    /// `client` (whose question it is) takes its turn at the connection ([`Turnstile`]).
    pub async fn deliver<P>(&self, client: ClientKey, publish: &Publish, out: Option<Outbound>, place: Option<P>) {
        let _pass = self.way_out.pass(client).await;
        let closed = self.closed.read().await;
        if *closed {
            return; // not acknowledged: the broker delivers it again to the next run
        }
        if let Some(out) = out {
            if self.publish(&out.to, out.payload).await.is_err() {
                return;
            }
            if out.answered {
                self.counters.answered();
            }
            self.flow.replied();
        }
        drop(place);
        let _ = self.client.ack(publish).await;
    }

    async fn publish(&self, to: &ReplyTo, payload: Vec<u8>) -> Result<(), rumqttc::v5::ClientError> {
        self.client
            .publish_with_properties(to.topic.clone(), QoS::AtLeastOnce, false, payload, reply_properties(to))
            .await
    }

    /// Closes the gate: from here no reply and no acknowledgement is sent. Waits up to `within`
    /// for a delivery being sent (it holds the lock for moments); false if one still was.
    pub async fn close(&self, within: Duration) -> bool {
        match tokio::time::timeout(within, self.closed.write()).await {
            Ok(mut closed) => {
                *closed = true;
                true
            }
            Err(_) => false,
        }
    }
}

/// The MQTT 5 properties of a reply: its format and content type, and the question's
/// correlation data echoed.
pub fn reply_properties(to: &ReplyTo) -> PublishProperties {
    PublishProperties {
        payload_format_indicator: Some(u8::from(to.encoding == Encoding::Json)),
        content_type: Some(to.encoding.content_type().to_owned()),
        correlation_data: to.correlation.clone().map(Into::into),
        ..PublishProperties::default()
    }
}

/// A publish that carries only what acknowledging `p` needs (its packet id and QoS), so that a
/// question's payload is not held while its acknowledgement waits to be sent.
pub fn ack_only(p: &Publish) -> Publish {
    Publish {
        dup: false,
        qos: p.qos,
        retain: false,
        topic: Default::default(),
        pkid: p.pkid,
        payload: Default::default(),
        properties: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn another_clients_reply_goes_out_in_its_turn_not_behind_a_flood_of_replies() {
        // A connection that takes one request at a time, when the test reads it.
        let (tx, rx) = flume::bounded(1);
        let gate =
            Arc::new(Gate::new(AsyncClient::from_senders(tx), Arc::new(Counters::default()), Arc::new(Flow::new(64))));
        let deliver = |client: &str, n: usize| {
            let gate = gate.clone();
            let to = ReplyTo { topic: format!("{client}/{n}"), correlation: None, encoding: Encoding::Json };
            let client = ClientKey::named(client);
            let mut question = Publish::new("laya/v1/dev1/ask", QoS::AtLeastOnce, vec![], None);
            question.pkid = n as u16 + 1;
            tokio::spawn(async move {
                let out = Outbound { to, payload: b"{}".to_vec(), answered: true };
                gate.deliver(client, &question, Some(out), None::<()>).await;
            })
        };
        let mut tasks: Vec<_> = (0..20).map(|n| deliver("flood", n)).collect();
        // Every flood delivery is under way: holding a pass or waiting for one.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        tasks.push(deliver("other", 0));
        // The connection takes what the gate hands it, one request at a time (replies and
        // acknowledgements), each freeing its one slot for the next.
        let mut sent = Vec::new();
        for _ in 0..100_000 {
            if sent.len() == 21 {
                break;
            }
            tokio::task::yield_now().await;
            if let Ok(rumqttc::v5::Request::Publish(p)) = rx.try_recv() {
                sent.push(String::from_utf8_lossy(&p.topic).into_owned());
            }
        }
        // The last acknowledgements.
        let drain = tokio::spawn(async move { while rx.recv_async().await.is_ok() {} });
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(20), t).await.expect("delivered in time").expect("delivered");
        }
        assert_eq!(gate.way_out.counts(), (0, 0), "every pass given back");
        drain.abort();
        let at = sent.iter().position(|t| t.starts_with("other")).expect("the other client's reply went out");
        // Behind the replies already handed over (the passes, and the one its turn comes after).
        assert!(at <= flow::OUTLET_PASSES + 1, "the other client's reply was number {} of {sent:?}", at + 1);
        assert_eq!(sent.len(), 21, "every reply went out once: {sent:?}");
    }

    #[test]
    fn a_reply_echoes_the_correlation_data_and_says_its_encoding() {
        let to = ReplyTo { topic: "r".into(), correlation: Some(b"abc".to_vec()), encoding: Encoding::Json };
        let p = reply_properties(&to);
        assert_eq!(p.correlation_data.as_deref(), Some(&b"abc"[..]));
        assert_eq!((p.payload_format_indicator, p.content_type.as_deref()), (Some(1), Some("application/json")));
        let cbor = reply_properties(&ReplyTo { encoding: Encoding::Cbor, correlation: None, ..to });
        assert_eq!((cbor.payload_format_indicator, cbor.content_type.as_deref()), (Some(0), Some("application/cbor")));
        assert_eq!(cbor.correlation_data, None);
    }

    #[test]
    fn an_acknowledgement_keeps_the_packet_id_and_qos_but_not_the_payload() {
        let mut p = Publish::new("laya/v1/dev1/ask", QoS::AtLeastOnce, vec![b'x'; 4096], None);
        p.pkid = 42;
        let ack = ack_only(&p);
        assert_eq!((ack.pkid, ack.qos), (42, QoS::AtLeastOnce));
        assert!(ack.payload.is_empty() && ack.topic.is_empty());
    }
}
