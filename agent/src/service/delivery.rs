//! The delivery gate: a question's reply is published and the question acknowledged together,
//! or not at all.
//!
//! A question is acknowledged only after its reply (or error reply) has been handed to the
//! client, so a crash at any point leaves it unacknowledged and the broker delivers it again to
//! this persistent session. At shutdown the gate closes ([`Gate::close`]) once the questions in
//! progress had their grace: from then on nothing is published or acknowledged, so each question
//! was either answered *and* acknowledged before the agent's `offline` status and its
//! DISCONNECT, or neither.

use std::sync::Arc;
use std::time::Duration;

use rumqttc::v5::AsyncClient;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Publish, PublishProperties};
use tokio::sync::RwLock;

use laya_topics::wire::Encoding;

use super::admission::ReplyTo;
use super::flow::Flow;
use super::telemetry::Counters;

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
}

impl Gate {
    pub fn new(client: AsyncClient, counters: Arc<Counters>, flow: Arc<Flow>) -> Gate {
        Gate { client, closed: RwLock::new(false), counters, flow }
    }

    /// Sends what a question's handling produced, then acknowledges the question; after
    /// shutdown closed the gate, neither.
    ///
    /// `place` (the question's place in `limits.queue`) is given back before the acknowledgement:
    /// the broker sends the next question as soon as it has the PUBACK, and that question must
    /// find its place free (or its turn in the waiting room), not be refused `overloaded`.
    pub async fn deliver<P>(&self, publish: &Publish, out: Option<Outbound>, place: Option<P>) {
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
