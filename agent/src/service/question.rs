//! One question's path, from its publish to what is sent back ([`Outbound`]): admission, the
//! redelivery checks, and the answer through [`crate::pipeline`] on the serving engine.
//!
//! A redelivered copy of a question still in progress (after a reconnect) waits for that answer
//! instead of computing it again ([`InFlight`]); one already answered gets the remembered reply
//! (the reply cache, consulted by admission). Before it is decoded a request takes its part of
//! the memory budget of decoded requests and their rows (`flow::Budget`, `limits.decoded_bytes`),
//! waiting for it in turn, keeps only its rows' part once laid out and gives that back when
//! answered. A small request is laid out on the service's thread, in the workshop in its
//! client's turn (a hand-over to another thread would cost more than its tokenizing), and its
//! reply decided and encoded there too; a large one is laid out in the blocking pool. While a
//! question waits for the engine, others are tokenizing: the worker is never idle for host work.
//! Delivering the outcome is the caller's (`delivery`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::v5::Publish;
use tokio::sync::watch;

use laya_topics::wire::{Encoding, ErrorCode, ErrorReply, Reply, Timing, Undeliverable};

use super::admission::{Admission, Decision, Incoming, ReplyCache, ReplyTo, RequestKey, RetainedReports};
use super::delivery::Outbound;
use super::flow::{self, ClientKey, WhenFull};
use super::reload::Current;
use super::telemetry::{Counters, Interval};
use super::workshop::Workshop;
use crate::engine::Role;
use crate::engine::{Asker, EngineError};
use crate::pipeline;
use crate::prompt::Row;

/// A reply in the making: `None` until the original's answer is sent; the sender dropped
/// without one means the original failed.
type Pending = watch::Receiver<Option<Vec<u8>>>;

/// Questions being answered, by key: a redelivered copy waits on its original's reply.
#[derive(Debug, Default)]
pub struct InFlight {
    map: Mutex<HashMap<RequestKey, Pending>>,
}

/// What [`InFlight::claim`] found.
pub enum Claim<'a> {
    /// No copy of this question is in progress: this one is the original.
    Original(Original<'a>),
    /// Another copy is in progress: wait for its reply ([`reply_of`]).
    Copy(Pending),
}

/// The in-progress entry of an original question; removed when its handling ends, however it
/// ends.
pub struct Original<'a> {
    in_flight: &'a InFlight,
    key: RequestKey,
    reply: watch::Sender<Option<Vec<u8>>>,
}

impl Original<'_> {
    /// The original was answered: its copies get `payload`.
    pub fn answered(&self, payload: &[u8]) {
        let _ = self.reply.send(Some(payload.to_vec()));
    }

    pub fn key(&self) -> &RequestKey {
        &self.key
    }
}

impl Drop for Original<'_> {
    fn drop(&mut self) {
        self.in_flight.map.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.key);
    }
}

impl InFlight {
    /// Registers `key` as in progress, unless a copy of it already is.
    pub fn claim(&self, key: RequestKey) -> Claim<'_> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&key) {
            Some(rx) => Claim::Copy(rx.clone()),
            None => {
                let (tx, rx) = watch::channel(None);
                map.insert(key.clone(), rx);
                Claim::Original(Original { in_flight: self, key, reply: tx })
            }
        }
    }

    /// Questions in progress now.
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no question is in progress.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The original's reply, once it has one; `None` if it failed (then the copy is answered on
/// its own).
pub async fn reply_of(mut pending: Pending) -> Option<Vec<u8>> {
    match pending.wait_for(Option::is_some).await {
        Ok(reply) => Some(reply.clone().unwrap_or_default()),
        Err(_) => None,
    }
}

/// What handling a question needs, and nothing of the broker connection or of telemetry's.
pub struct Questions {
    pub admission: Admission,
    pub current: Arc<Current>,
    /// Replies of answered questions, for redelivered copies.
    pub replies: Mutex<ReplyCache>,
    pub in_flight: InFlight,
    /// Retained questions reported in this MQTT session (each is reported once a session).
    pub retained: Mutex<RetainedReports>,
    /// The memory budget of requests being decoded and laid out, and of their rows until
    /// answered.
    pub budget: flow::Budget,
    pub device: String,
    /// `{prefix}/{device}/errors`, where undeliverable questions are reported.
    pub errors_to: ReplyTo,
    pub counters: Arc<Counters>,
    /// Where answered questions' timings go (telemetry's latencies).
    pub interval: Arc<Mutex<Interval>>,
    /// Where a question's small requests are laid out and its reply decided and encoded, one
    /// at a time, the clients in turn (the thread's tasks otherwise run in wake-up order).
    pub workshop: Arc<Workshop>,
}

impl Questions {
    /// Handles one question of `asker` end to end, up to what to send back; the caller delivers
    /// it.
    pub async fn handle(
        &self,
        publish: &Publish,
        received: Instant,
        (client, asker): (ClientKey, Asker),
    ) -> Option<Outbound> {
        let incoming = incoming(publish);
        // Its part of the budget before it is decoded, kept (its rows' part) until answered.
        let encoding = Encoding::detect(incoming.content_type, incoming.payload);
        let share = self.budget.take(flow::preparing_cost(encoding, publish.payload.len())).await;
        let aside = flow::prepared_aside(encoding, publish.payload.len());
        let decision = self.admission.decide_with(&incoming, received, |key| {
            self.replies.lock().unwrap_or_else(|e| e.into_inner()).get(key).map(<[u8]>::to_vec)
        });
        match decision {
            // A retained copy reported already in this session: acknowledged, not reported again.
            Decision::Drop { .. }
                if incoming.retained
                    && !self
                        .retained
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .first(self.admission.retained_key(&incoming)) =>
            {
                None
            }
            Decision::Drop { report } => {
                tracing::warn!(
                    topic = %String::from_utf8_lossy(&publish.topic),
                    reason = %report.error.message,
                    "a question not answered where it asks (nowhere allowed to reply to, or retained), reported on the errors topic"
                );
                Some(self.report(&report))
            }
            Decision::Refuse { error, reply_to } => Some(self.refusal(&reply_to, error)),
            Decision::Resend { reply_to, payload } => {
                self.counters.resent();
                Some(Outbound { to: reply_to, payload, answered: false })
            }
            Decision::Answer { request, reply_to, deadline, key } => {
                let original = match self.in_flight.claim(key) {
                    Claim::Original(original) => Some(original),
                    // A redelivered copy of a question in progress: its original's reply, unless
                    // the original failed (then this copy is answered on its own).
                    Claim::Copy(pending) => match reply_of(pending).await {
                        Some(payload) => {
                            self.counters.resent();
                            return Some(Outbound { to: reply_to, payload, answered: false });
                        }
                        None => None,
                    },
                };
                // Everything logged while answering names the question.
                let span = tracing::info_span!(
                    "question",
                    id = %request.id.as_ref().map(id_text).unwrap_or_default(),
                    device = %self.device,
                    questions = request.questions.len(),
                );
                let encoding = reply_to.encoding;
                let encoded = move |reply: Reply| encoding.encode(&reply.to_value());
                let answer = self.answer(*request, deadline, received, (share, aside), (client, asker), encoded);
                match tracing::Instrument::instrument(answer, span).await {
                    Ok(payload) => {
                        if let Some(o) = original {
                            self.replies
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .put(o.key().clone(), payload.clone());
                            o.answered(&payload);
                        }
                        Some(Outbound { to: reply_to, payload, answered: true })
                    }
                    Err(error) => Some(self.refusal(&reply_to, error)),
                }
            }
        }
    }

    /// A new MQTT session began (the broker sends retained messages again at subscription).
    pub fn new_session(&self) {
        self.retained.lock().unwrap_or_else(|e| e.into_inner()).new_session();
    }

    /// The error reply to a question (counted by code, and logged).
    pub fn refusal(&self, to: &ReplyTo, error: ErrorReply) -> Outbound {
        self.counters.refused(error.code);
        tracing::info!(
            id = %error.id.as_ref().map(id_text).unwrap_or_default(),
            code = error.code.as_str(),
            reason = %error.message,
            "question refused"
        );
        Outbound { to: to.clone(), payload: to.encoding.encode(&error.to_value()), answered: false }
    }

    /// The errors-topic report of a question that has nowhere to be answered (counted as
    /// dropped).
    pub fn report(&self, report: &Undeliverable) -> Outbound {
        self.counters.dropped();
        Outbound { to: self.errors_to.clone(), payload: Encoding::Json.encode(&report.to_value()), answered: false }
    }

    /// What a question that is not taken (`why`) is sent ([`flow::refusal_when_full`]).
    pub fn when_full(&self, p: &Publish, why: flow::Full) -> Outbound {
        match flow::refusal_when_full(&self.admission, &incoming(p), Instant::now(), why) {
            WhenFull::Refuse { reply_to, error } => self.refusal(&reply_to, error),
            WhenFull::Report(report) => self.report(&report),
        }
    }

    /// Answers a request another door admitted (HTTP: laya.serve's checks passed at the door),
    /// `bytes` its body's size, on the same path as an MQTT question from its part of the
    /// memory budget on: the reply, or the error it gets (counted like an MQTT question's).
    pub async fn handle_request(
        &self,
        request: laya_topics::Request,
        bytes: usize,
        received: Instant,
        (client, asker): (ClientKey, Asker),
    ) -> Result<Reply, ErrorReply> {
        let share = self.budget.take(flow::preparing_cost(Encoding::Json, bytes)).await;
        let aside = flow::prepared_aside(Encoding::Json, bytes);
        let span = tracing::info_span!(
            "question",
            id = %request.id.as_ref().map(id_text).unwrap_or_default(),
            device = %self.device,
            questions = request.questions.len(),
        );
        let answer = self.answer(request, None, received, (share, aside), (client, asker), |reply| reply);
        let outcome = tracing::Instrument::instrument(answer, span).await;
        match &outcome {
            Ok(_) => self.counters.answered(),
            Err(error) => {
                self.counters.refused(error.code);
                tracing::info!(code = error.code.as_str(), reason = %error.message, "question refused");
            }
        }
        outcome
    }

    /// Answers an admitted request of `client`'s: the reply as `deliver` makes it (the bytes of
    /// an MQTT reply, the `Reply` itself for another door), or the error to reply with. The
    /// thread's own work on it, `deliver` included, is done in the workshop in `client`'s turns.
    async fn answer<T: Send + 'static>(
        &self,
        request: laya_topics::Request,
        deadline: Option<Instant>,
        received: Instant,
        (mut share, aside): (flow::Share, bool),
        (client, asker): (ClientKey, Asker),
        deliver: impl FnOnce(Reply) -> T + Send + 'static,
    ) -> Result<T, ErrorReply> {
        let id = request.id.clone();
        let error = |code, message: String| ErrorReply { id: id.clone(), code, message };
        // The bundle and engine this question started with, whatever a reload does meanwhile.
        let serving = self.current.get();
        let bundle = serving.bundle.clone();
        let t0 = Instant::now();
        // The request itself (its state document, the larger part of its memory) is dropped
        // with the layout's work: what decoding needs of it is in the prepared request.
        let max_tokens = self.admission.limits.max_request_tokens;
        // A panic must not lose the question: it gets an error reply like any other failure
        // (contained: logged, and not the end of the process that any other panic is).
        let prepare = move || {
            crate::platform::panic::contained(|| pipeline::prepare(&bundle, &request, max_tokens))
                .map_err(|_| "it panicked".to_owned())
        };
        let prepared = if aside {
            tokio::task::spawn_blocking(prepare).await.map_err(|e| e.to_string()).and_then(|r| r)
        } else {
            self.workshop.run(client.clone(), prepare).await.map_err(|e| e.to_string()).and_then(|r| r)
        };
        let prepared = match prepared {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return Err(error(e.code(), e.to_string())),
            Err(e) => return Err(error(ErrorCode::Internal, format!("tokenizer task failed: {e}"))),
        };
        // Laid out: what stays of it until answered is its rows.
        let (rows, tokens) = prepared.rows().fold((0, 0), |(n, t), r| (n + 1, t + r.input_ids.len()));
        share.keep(flow::rows_cost(rows, tokens));
        let tokenized = Instant::now();
        if deadline.is_some_and(|d| tokenized >= d) {
            return Err(error(ErrorCode::DeadlineExceeded, "the deadline passed before inference".into()));
        }
        let rows: Vec<Row> = prepared.rows().cloned().collect();
        let mut answered_by = (serving.backend.clone(), Role::Primary);
        let (outputs, infer_ms) = if rows.is_empty() {
            (Vec::new(), 0.0)
        } else {
            let run = serving.engine.run_as(asker, rows, deadline);
            let result = match deadline {
                Some(d) => match tokio::time::timeout_at(d.into(), run).await {
                    Ok(r) => r,
                    Err(_) => {
                        return Err(error(ErrorCode::DeadlineExceeded, "the deadline passed during inference".into()));
                    }
                },
                None => run.await,
            };
            match result {
                Ok(out) => {
                    self.counters.metrics.observe_inference(out.elapsed.as_secs_f64());
                    answered_by = (out.backend, out.role);
                    (out.rows, out.elapsed.as_secs_f64() * 1000.0)
                }
                Err(e) => {
                    // The code is the engine's one mapping; the message is the model's own for a
                    // refused row, and says where the deadline passed.
                    let code = ErrorCode::from(&e);
                    let message = match e {
                        EngineError::Input(m) => m,
                        EngineError::Expired => "the deadline passed before inference".to_owned(),
                        e => e.to_string(),
                    };
                    return Err(error(code, message));
                }
            }
        };
        let inferred = Instant::now();
        let (backend, role) = answered_by;
        let backend = if backend.is_empty() { serving.backend.clone() } else { backend };
        let (bundle, device, reply_id) = (serving.bundle.clone(), self.device.clone(), id.clone());
        let interval = self.interval.clone();
        let decided = move || {
            let result = pipeline::finish(&bundle, &prepared, outputs)?;
            let done = Instant::now();
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            let timing = Timing {
                queue: ms(t0 - received) + (ms(inferred - tokenized) - infer_ms).max(0.0),
                tokenize: ms(tokenized - t0),
                infer: infer_ms,
                decode: ms(done - inferred),
                total: ms(done - received),
            };
            if let Ok(mut i) = interval.lock() {
                i.record(&timing);
            }
            tracing::debug!(total_ms = timing.total, infer_ms = timing.infer, "answered");
            Ok::<_, pipeline::PipelineError>(deliver(Reply {
                id: reply_id,
                device,
                backend,
                serving: role,
                result,
                timing,
            }))
        };
        match self.workshop.run(client, decided).await {
            Ok(Ok(delivered)) => Ok(delivered),
            Ok(Err(e)) => Err(error(e.code(), e.to_string())),
            Err(stopping) => Err(error(ErrorCode::Internal, stopping.to_string())),
        }
    }
}

/// A request id for logs: its JSON text (`"r1"`, `7`).
fn id_text(id: &laya_topics::Value) -> String {
    laya_topics::json::to_string(id, laya_topics::json::Style::COMPACT)
}

/// The parts of an MQTT publish that admission reads.
pub fn incoming(p: &Publish) -> Incoming<'_> {
    let props = p.properties.as_ref();
    Incoming {
        payload: &p.payload,
        content_type: props.and_then(|x| x.content_type.as_deref()),
        response_topic: props.and_then(|x| x.response_topic.as_deref()),
        correlation: props.and_then(|x| x.correlation_data.as_deref()),
        message_expiry_s: props.and_then(|x| x.message_expiry_interval),
        retained: p.retain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use laya_topics::topic::Schema;

    /// One admission for a test (its digest keys are random per admission).
    fn admission() -> Admission {
        Admission::new(Schema::default(), "dev1".into(), &config::Config::default())
    }

    /// The key `a` gives a question with this payload.
    fn key_of(a: &Admission, payload: &[u8]) -> RequestKey {
        let m = Incoming {
            payload,
            content_type: None,
            response_topic: None,
            correlation: None,
            message_expiry_s: None,
            retained: false,
        };
        match a.decide(&m, Instant::now(), &ReplyCache::new(0)) {
            Decision::Answer { key, .. } => key,
            other => panic!("{other:?}"),
        }
    }

    const R1: &[u8] = br#"{"id": "r1", "state": "s", "questions": {}}"#;

    #[tokio::test]
    async fn a_redelivered_copy_of_a_question_in_progress_gets_its_originals_reply() {
        let (a, in_flight) = (admission(), InFlight::default());
        let Claim::Original(original) = in_flight.claim(key_of(&a, R1)) else { panic!("the first is the original") };
        let Claim::Copy(pending) = in_flight.claim(key_of(&a, R1)) else { panic!("the second is a copy") };
        original.answered(b"the reply");
        assert_eq!(reply_of(pending).await.as_deref(), Some(&b"the reply"[..]));
    }

    #[tokio::test]
    async fn a_copy_whose_original_failed_is_answered_on_its_own() {
        let (a, in_flight) = (admission(), InFlight::default());
        let Claim::Original(original) = in_flight.claim(key_of(&a, R1)) else { panic!("the first is the original") };
        let Claim::Copy(pending) = in_flight.claim(key_of(&a, R1)) else { panic!("the second is a copy") };
        drop(original);
        assert_eq!(reply_of(pending).await, None);
    }

    #[test]
    fn a_question_leaves_the_in_progress_map_when_its_handling_ends() {
        let (a, in_flight) = (admission(), InFlight::default());
        {
            let Claim::Original(_original) = in_flight.claim(key_of(&a, R1)) else { panic!("original") };
            assert_eq!(in_flight.len(), 1);
        }
        assert_eq!(in_flight.len(), 0);
        assert!(matches!(in_flight.claim(key_of(&a, R1)), Claim::Original(_)), "a later delivery is a new original");
    }

    #[test]
    fn a_reused_id_with_new_content_is_a_new_question_not_a_copy() {
        let (a, in_flight) = (admission(), InFlight::default());
        let Claim::Original(_first) = in_flight.claim(key_of(&a, R1)) else { panic!("original") };
        let other = br#"{"id": "r1", "state": "t", "questions": {}}"#;
        let second = in_flight.claim(key_of(&a, other));
        assert!(matches!(second, Claim::Original(_)));
        assert_eq!(in_flight.len(), 2);
    }

    #[test]
    fn the_parts_admission_reads_come_from_the_publish_and_its_properties() {
        use rumqttc::v5::mqttbytes::QoS;
        use rumqttc::v5::mqttbytes::v5::PublishProperties;
        let props = PublishProperties {
            content_type: Some("application/cbor".into()),
            response_topic: Some("r/t".into()),
            correlation_data: Some(b"c".to_vec().into()),
            message_expiry_interval: Some(9),
            ..PublishProperties::default()
        };
        let p = Publish::new("laya/v1/dev1/ask", QoS::AtLeastOnce, b"x".to_vec(), Some(props));
        let i = incoming(&p);
        assert_eq!((i.payload, i.content_type, i.response_topic), (&b"x"[..], Some("application/cbor"), Some("r/t")));
        assert_eq!((i.correlation, i.message_expiry_s), (Some(&b"c"[..]), Some(9)));
    }
}
