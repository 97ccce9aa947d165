//! What the service loop publishes for itself (subscriptions, the retained status, events,
//! telemetry), handed to a task of its own so the loop never waits on the MQTT client.
//!
//! rumqttc's client hands each request to the connection task through a bounded channel, and that
//! task stops taking requests while the broker has not acknowledged enough of our publishes. A
//! loop that awaited a publish there could wait on the connection task while the connection task
//! waits on the loop to take the next question: the deadlock a flood through a broker that
//! ignores our Receive Maximum met (issue #31). So the loop only queues, and the queue is bounded
//! by what it keeps: the newest status and telemetry replace older ones (only the newest means
//! anything), events are kept in order up to `EVENTS` and the oldest dropped beyond (counted),
//! subscriptions are few.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use rumqttc::v5::AsyncClient;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Filter, PublishProperties, RetainForwardRule};
use tokio::sync::Notify;

/// Events kept waiting at most; older ones are dropped beyond this.
pub const EVENTS: usize = 256;

/// A subscription to questions: QoS 1, and Retain As Published, so that a question published with
/// the retain flag arrives with it even while we are subscribed (a broker clears the flag for
/// existing subscribers otherwise) and is refused like the retained copy the broker sends at
/// subscription (`admission`, docs/security.md).
pub fn question_filter(topic: String) -> Filter {
    Filter {
        path: topic,
        qos: QoS::AtLeastOnce,
        nolocal: false,
        preserve_retain: true,
        retain_forward_rule: RetainForwardRule::OnEverySubscribe,
    }
}

/// One thing to send.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// A subscription to questions ([`question_filter`]).
    Subscribe(String),
    /// The retained status document.
    Status(Vec<u8>),
    Event(Vec<u8>),
    Telemetry(Vec<u8>, PublishProperties),
}

/// The queue, without I/O.
#[derive(Debug, Default)]
pub struct Queue {
    subscribe: VecDeque<String>,
    status: Option<Vec<u8>>,
    events: VecDeque<Vec<u8>>,
    telemetry: Option<(Vec<u8>, PublishProperties)>,
    /// Events dropped because `EVENTS` were already waiting.
    pub dropped_events: u64,
}

impl Queue {
    pub fn push(&mut self, item: Item) {
        match item {
            Item::Subscribe(t) => self.subscribe.push_back(t),
            Item::Status(s) => self.status = Some(s),
            Item::Event(e) => {
                if self.events.len() >= EVENTS {
                    self.events.pop_front();
                    self.dropped_events += 1;
                }
                self.events.push_back(e);
            }
            Item::Telemetry(t, p) => self.telemetry = Some((t, p)),
        }
    }

    /// The next thing to send: subscriptions first (a new session must take questions), then the
    /// status, events in order, telemetry.
    pub fn pop(&mut self) -> Option<Item> {
        if let Some(t) = self.subscribe.pop_front() {
            return Some(Item::Subscribe(t));
        }
        if let Some(s) = self.status.take() {
            return Some(Item::Status(s));
        }
        if let Some(e) = self.events.pop_front() {
            return Some(Item::Event(e));
        }
        self.telemetry.take().map(|(t, p)| Item::Telemetry(t, p))
    }

    pub fn len(&self) -> usize {
        self.subscribe.len()
            + self.events.len()
            + usize::from(self.status.is_some())
            + usize::from(self.telemetry.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where each kind of item goes.
#[derive(Debug, Clone)]
pub struct Topics {
    pub status: String,
    pub events: String,
    pub telemetry: String,
}

/// The queue shared by the loop (pushing) and the sending task.
#[derive(Debug, Default)]
pub struct Outbox {
    queue: Mutex<Queue>,
    wake: Notify,
    /// Set by `close`: nothing more is sent.
    closed: AtomicBool,
    /// Notified when the sending task has ended.
    done: Notify,
    finished: AtomicBool,
}

impl Outbox {
    /// Queues `item`; never waits.
    pub fn push(&self, item: Item) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).push(item);
        self.wake.notify_one();
    }

    fn pop(&self) -> Option<Item> {
        if self.closed.load(Ordering::Relaxed) {
            return None;
        }
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    /// Stops sending (what is queued is dropped); the future resolves once the send under way,
    /// if any, has been handed to the client. At shutdown, before the `offline` status, so no
    /// older status follows it.
    pub fn close(&self) -> impl std::future::Future<Output = ()> + '_ {
        self.closed.store(true, Ordering::Relaxed);
        self.wake.notify_one();
        async move {
            let done = self.done.notified();
            if !self.finished.load(Ordering::Relaxed) {
                done.await;
            }
        }
    }

    /// Events dropped so far.
    pub fn dropped_events(&self) -> u64 {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).dropped_events
    }

    /// Sends what is queued until `close` (or until the client's connection task is gone).
    pub async fn run(&self, client: AsyncClient, topics: Topics) {
        self.send_all(client, topics).await;
        self.finished.store(true, Ordering::Relaxed);
        self.done.notify_waiters();
    }

    async fn send_all(&self, client: AsyncClient, topics: Topics) {
        loop {
            while let Some(item) = self.pop() {
                let sent = match item {
                    Item::Subscribe(t) => client.subscribe_many([question_filter(t)]).await,
                    Item::Status(s) => client.publish(topics.status.clone(), QoS::AtLeastOnce, true, s).await,
                    Item::Event(e) => client.publish(topics.events.clone(), QoS::AtLeastOnce, false, e).await,
                    Item::Telemetry(t, p) => {
                        client.publish_with_properties(topics.telemetry.clone(), QoS::AtMostOnce, false, t, p).await
                    }
                };
                if sent.is_err() {
                    return;
                }
            }
            if self.closed.load(Ordering::Relaxed) {
                return;
            }
            self.wake.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriptions_go_first_then_the_newest_status_events_in_order_and_the_newest_telemetry() {
        let mut q = Queue::default();
        q.push(Item::Telemetry(b"t1".to_vec(), PublishProperties::default()));
        q.push(Item::Status(b"s1".to_vec()));
        q.push(Item::Event(b"e1".to_vec()));
        q.push(Item::Subscribe("a".into()));
        q.push(Item::Event(b"e2".to_vec()));
        q.push(Item::Status(b"s2".to_vec()));
        q.push(Item::Telemetry(b"t2".to_vec(), PublishProperties::default()));
        assert_eq!(q.len(), 5);
        let order: Vec<Item> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            vec![
                Item::Subscribe("a".into()),
                Item::Status(b"s2".to_vec()),
                Item::Event(b"e1".to_vec()),
                Item::Event(b"e2".to_vec()),
                Item::Telemetry(b"t2".to_vec(), PublishProperties::default()),
            ]
        );
        assert!(q.is_empty());
    }

    #[test]
    fn events_beyond_the_bound_drop_the_oldest_and_are_counted() {
        let mut q = Queue::default();
        for i in 0..EVENTS + 10 {
            q.push(Item::Event(i.to_string().into_bytes()));
        }
        assert_eq!(q.len(), EVENTS);
        assert_eq!(q.dropped_events, 10);
        assert_eq!(q.pop(), Some(Item::Event(b"10".to_vec())));
    }
}
