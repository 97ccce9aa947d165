//! `laya-edge serve`: questions in over MQTT, typed decisions out.
//!
//! The service runs on a single-threaded runtime (`laya-edge serve`), so no task may block it for
//! long. One task polls rumqttc's event loop and does nothing else; each admitted question is
//! handled by its own task (tokenize, the engine's worker for the model, decode, publish the
//! reply, then acknowledge the question). A small request is tokenized in place (a hand-over to
//! another thread would cost more than its tokenizing); a large one in the blocking pool. A question is
//! acknowledged only after its reply or error reply has been handed to the client, so a crash at
//! any point leaves it unacknowledged and the broker delivers it again to this persistent session.
//! While a task waits for the engine, others are tokenizing: the worker is never idle for host work.
//!
//! A redelivered copy of a question still in progress (after a reconnect) waits for that answer
//! instead of computing it again; one already answered gets the remembered reply. On shutdown,
//! questions in progress get `mqtt.shutdown_grace_s` to finish; then the delivery gate closes:
//! a question is either answered *and* acknowledged before the agent's `offline` status and its
//! DISCONNECT, or neither (the broker delivers it again to the next run).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, Event};
use tokio::sync::{OwnedSemaphorePermit, RwLock, Semaphore, mpsc, watch};

use laya_topics::load::Load;
use laya_topics::topic::{Channel, Schema};
use laya_topics::wire::{
    Encoding, EngineEvent, ErrorCode, ErrorReply, ProbeFigures, Reply, Status, Telemetry, Timing, TokenMemo,
    Undeliverable,
};

use super::admission::{Admission, Decision, Incoming, ReplyCache, ReplyTo, RequestKey};
use super::connection;
use super::latency::StageLatencies;
use crate::bundle::HostBundle;
use crate::config::Config;
use crate::decide::{self, RowOutput};
use crate::engine::process::{Engine, EngineError};
use crate::pipeline;
use crate::prompt::Row;
use crate::systemd::Notifier;

/// Why the service stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Connection(#[from] connection::ConnectionError),
    #[error(transparent)]
    Topic(#[from] laya_topics::topic::TopicError),
}

/// JSON requests up to this size are tokenized on the runtime's thread (half a millisecond at
/// most on this machine: ~450 tokens); larger ones in the blocking pool. CBOR is denser than the
/// text it becomes (a 3-byte half float prints as up to 17 characters), so its limit is an
/// eighth of this.
pub const INLINE_TOKENIZE_BYTES: usize = 2048;

/// Counters for telemetry.
#[derive(Debug, Default)]
struct Counters {
    answered: AtomicU64,
    refused: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    dropped: AtomicU64,
    resent: AtomicU64,
}

struct Shared {
    client: AsyncClient,
    admission: Admission,
    bundle: Arc<HostBundle>,
    engine: Engine,
    replies: Mutex<ReplyCache>,
    /// Questions being answered, by key: a redelivered copy waits on its original's reply
    /// (`None` until then; the sender dropped without one means the original failed).
    in_progress: Mutex<std::collections::HashMap<RequestKey, watch::Receiver<Option<Vec<u8>>>>>,
    permits: Arc<Semaphore>,
    /// Payload bytes of questions waiting for a place (`limits.waiting_bytes`).
    waiting: AtomicUsize,
    waiting_limit: usize,
    device: String,
    backend: String,
    /// `{prefix}/{device}/errors`, where undeliverable questions are reported.
    errors_to: ReplyTo,
    counters: Counters,
    stopping: AtomicBool,
    /// This run's identity in the status document (`Status::birth`, `model_name`, `bundle_sha256`).
    identity: Identity,
    /// The current telemetry interval: latencies of its answers and where it started.
    interval: Mutex<Interval>,
    /// Questions in the waiting room (beyond `limits.queue`).
    waiting_questions: AtomicUsize,
    /// How telemetry documents are encoded (`mqtt.telemetry_encoding`).
    telemetry_encoding: Encoding,
    /// Closed (true) once shutdown has waited for the questions in progress. Publishing a reply
    /// and acknowledging its question happen under the read lock, so the two are both sent
    /// before the DISCONNECT, or neither is.
    closed: RwLock<bool>,
}

/// What the status document says about this run and its model, fixed at start.
struct Identity {
    /// The start time in milliseconds since the Unix epoch (see `Status::birth`).
    birth: u64,
    model_name: String,
    bundle_sha256: Option<String>,
    fleet: String,
}

impl Identity {
    fn new(bundle: &HostBundle, fleet: &str, started: SystemTime) -> Identity {
        let birth = started.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        let manifest = bundle.dir.join(crate::bundle::MANIFEST);
        let bundle_sha256 = if manifest.is_file() {
            match crate::bundle::digest::sha256_file(&manifest) {
                Ok(d) => Some(d),
                Err(e) => {
                    tracing::warn!(file = %manifest.display(), error = %e, "cannot hash the bundle manifest");
                    None
                }
            }
        } else {
            None
        };
        let named = bundle.manifest.as_ref().and_then(|m| m.raw.get("name")).and_then(|v| v.as_str());
        let model_name = named
            .map(str::to_owned)
            .unwrap_or_else(|| bundle.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
        Identity { birth, model_name, bundle_sha256, fleet: fleet.to_owned() }
    }
}

/// One telemetry interval in the making.
struct Interval {
    latencies: StageLatencies,
    started: Instant,
    /// The engine's busy time when it started.
    busy_at_start: Duration,
}

/// What a handled question sends back before it is acknowledged.
struct Outbound {
    to: ReplyTo,
    payload: Vec<u8>,
    /// An answer computed for this question (counted in `answered`), not an error or a resend.
    answered: bool,
}

/// Removes a question from the in-progress map when its handling ends, however it ends.
struct InProgress<'a> {
    shared: &'a Shared,
    key: RequestKey,
    reply: watch::Sender<Option<Vec<u8>>>,
}

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        self.shared.in_progress.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.key);
    }
}

fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn reply_properties(to: &ReplyTo) -> PublishProperties {
    PublishProperties {
        payload_format_indicator: Some(u8::from(to.encoding == Encoding::Json)),
        content_type: Some(to.encoding.content_type().to_owned()),
        correlation_data: to.correlation.clone().map(Into::into),
        ..PublishProperties::default()
    }
}

impl Shared {
    async fn publish(&self, to: &ReplyTo, payload: Vec<u8>) -> Result<(), rumqttc::v5::ClientError> {
        self.client
            .publish_with_properties(to.topic.clone(), QoS::AtLeastOnce, false, payload, reply_properties(to))
            .await
    }

    fn count_refusal(&self, code: ErrorCode) {
        if let Ok(mut m) = self.counters.refused.lock() {
            *m.entry(code.as_str()).or_default() += 1;
        }
    }

    fn refusal(&self, to: &ReplyTo, error: ErrorReply) -> Outbound {
        self.count_refusal(error.code);
        tracing::info!(
            id = %error.id.as_ref().map(id_text).unwrap_or_default(),
            code = error.code.as_str(),
            reason = %error.message,
            "question refused"
        );
        Outbound { to: to.clone(), payload: to.encoding.encode(&error.to_value()), answered: false }
    }

    /// Sends what a question's handling produced, then acknowledges the question; after
    /// shutdown closed the gate, neither.
    ///
    /// `permit` (the question's place in `limits.queue`) is given back before the acknowledgement:
    /// the broker sends the next question as soon as it has the PUBACK (the Receive Maximum is the
    /// queue), and that question must find its place free, not be refused `overloaded`.
    async fn deliver(&self, publish: &Publish, out: Option<Outbound>, permit: Option<OwnedSemaphorePermit>) {
        let closed = self.closed.read().await;
        if *closed {
            return; // not acknowledged: the broker delivers it again to the next run
        }
        if let Some(out) = out {
            if self.publish(&out.to, out.payload).await.is_err() {
                return;
            }
            if out.answered {
                self.counters.answered.fetch_add(1, Ordering::Relaxed);
            }
        }
        drop(permit);
        let _ = self.client.ack(publish).await;
    }

    /// Takes `bytes` of the waiting room (`limits.waiting_bytes`), if they fit.
    fn reserve_waiting(&self, bytes: usize) -> Option<usize> {
        let bytes = bytes.max(1);
        self.waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                w.checked_add(bytes).filter(|total| *total <= self.waiting_limit)
            })
            .ok()
            .map(|_| bytes)
    }

    /// Handles one question end to end, up to what to send back; the caller delivers it.
    async fn handle(self: &Arc<Self>, publish: &Publish, received: Instant) -> Option<Outbound> {
        let incoming = incoming(publish);
        let decision = self.admission.decide_with(&incoming, received, |key| {
            self.replies.lock().unwrap_or_else(|e| e.into_inner()).get(key).map(<[u8]>::to_vec)
        });
        match decision {
            Decision::Drop { report } => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    topic = %String::from_utf8_lossy(&publish.topic),
                    reason = %report.error.message,
                    "a question with nowhere to reply to, reported on the errors topic"
                );
                Some(self.report(&report))
            }
            Decision::Refuse { error, reply_to } => Some(self.refusal(&reply_to, error)),
            Decision::Resend { reply_to, payload } => {
                self.counters.resent.fetch_add(1, Ordering::Relaxed);
                Some(Outbound { to: reply_to, payload, answered: false })
            }
            Decision::Answer { request, reply_to, deadline, key } => {
                let original = {
                    let mut map = self.in_progress.lock().unwrap_or_else(|e| e.into_inner());
                    match map.get(&key) {
                        Some(rx) => Err(rx.clone()),
                        None => {
                            let (tx, rx) = watch::channel(None);
                            map.insert(key.clone(), rx);
                            Ok(InProgress { shared: self, key, reply: tx })
                        }
                    }
                };
                let guard = match original {
                    Ok(guard) => Some(guard),
                    // A redelivered copy of a question in progress: its original's reply, unless
                    // the original failed (then this copy is answered on its own).
                    Err(mut rx) => match rx.wait_for(Option::is_some).await {
                        Ok(reply) => {
                            let payload = reply.clone().unwrap_or_default();
                            self.counters.resent.fetch_add(1, Ordering::Relaxed);
                            return Some(Outbound { to: reply_to, payload, answered: false });
                        }
                        Err(_) => None,
                    },
                };
                let limit = match reply_to.encoding {
                    Encoding::Json => INLINE_TOKENIZE_BYTES,
                    Encoding::Cbor => INLINE_TOKENIZE_BYTES / 8,
                };
                let inline = publish.payload.len() <= limit;
                // Everything logged while answering names the question.
                let span = tracing::info_span!(
                    "question",
                    id = %request.id.as_ref().map(id_text).unwrap_or_default(),
                    device = %self.device,
                    questions = request.questions.len(),
                );
                let answer = self.answer(*request, &reply_to, deadline, received, inline);
                match tracing::Instrument::instrument(answer, span).await {
                    Ok(payload) => {
                        if let Some(g) = guard {
                            self.replies.lock().unwrap_or_else(|e| e.into_inner()).put(g.key.clone(), payload.clone());
                            let _ = g.reply.send(Some(payload.clone()));
                        }
                        Some(Outbound { to: reply_to, payload, answered: true })
                    }
                    Err(error) => Some(self.refusal(&reply_to, error)),
                }
            }
        }
    }

    /// The errors-topic report of a question that has nowhere to be answered.
    fn report(&self, report: &Undeliverable) -> Outbound {
        Outbound { to: self.errors_to.clone(), payload: Encoding::Json.encode(&report.to_value()), answered: false }
    }

    /// Answers an admitted request: the reply payload, or the error to reply with.
    async fn answer(
        self: &Arc<Self>,
        request: laya_topics::Request,
        to: &ReplyTo,
        deadline: Option<Instant>,
        received: Instant,
        inline: bool,
    ) -> Result<Vec<u8>, ErrorReply> {
        let id = request.id.clone();
        let error = |code, message: String| ErrorReply { id: id.clone(), code, message };
        let bundle = self.bundle.clone();
        let t0 = Instant::now();
        let request = Arc::new(request);
        let req = request.clone();
        let max_tokens = self.admission.limits.max_request_tokens;
        let prepare = move || pipeline::prepare(&bundle, &req, max_tokens);
        // A panic must not lose the question: it gets an error reply like any other failure.
        let prepared = if inline {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(prepare)).map_err(|_| "it panicked".to_owned())
        } else {
            tokio::task::spawn_blocking(prepare).await.map_err(|e| e.to_string())
        };
        let prepared = match prepared {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return Err(error(e.code(), e.to_string())),
            Err(e) => return Err(error(ErrorCode::Internal, format!("tokenizer task failed: {e}"))),
        };
        let tokenized = Instant::now();
        if deadline.is_some_and(|d| tokenized >= d) {
            return Err(error(ErrorCode::DeadlineExceeded, "the deadline passed before inference".into()));
        }
        let rows: Vec<Row> = prepared.iter().filter_map(|p| p.outcome.as_ref().ok().map(|(_, r)| r.clone())).collect();
        let mut answered_by = (self.backend.clone(), crate::engine::supervisor::Role::Primary);
        let (outputs, infer_ms) = if rows.is_empty() {
            (Vec::new(), 0.0)
        } else {
            let run = self.engine.run(rows, deadline);
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
                    answered_by = (out.backend, out.role);
                    (out.rows, out.elapsed.as_secs_f64() * 1000.0)
                }
                Err(EngineError::Input(m)) => return Err(error(ErrorCode::BadRequest, m)),
                Err(EngineError::Expired) => {
                    return Err(error(ErrorCode::DeadlineExceeded, "the deadline passed before inference".to_owned()));
                }
                Err(e @ EngineError::Overloaded(_)) => return Err(error(ErrorCode::Overloaded, e.to_string())),
                Err(e @ EngineError::Quarantined(_)) => return Err(error(ErrorCode::Internal, e.to_string())),
                Err(e @ (EngineError::Unavailable(_) | EngineError::Stopped)) => {
                    return Err(error(ErrorCode::BackendUnavailable, e.to_string()));
                }
            }
        };
        let inferred = Instant::now();
        let outputs: Vec<RowOutput> = outputs
            .into_iter()
            .map(|r| RowOutput { act_probs: decide::act_probabilities(&r.act_logits), logits: r.logits })
            .collect();
        let result = decide::assemble(&prepared, &outputs, &self.bundle.config.temperatures, request.lang.as_deref())
            .map_err(|e| error(ErrorCode::Internal, e.to_string()))?;
        let done = Instant::now();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let timing = Timing {
            queue: ms(t0 - received) + (ms(inferred - tokenized) - infer_ms).max(0.0),
            tokenize: ms(tokenized - t0),
            infer: infer_ms,
            decode: ms(done - inferred),
            total: ms(done - received),
        };
        if let Ok(mut i) = self.interval.lock() {
            i.latencies.record(&timing);
        }
        tracing::debug!(total_ms = timing.total, infer_ms = timing.infer, "answered");
        let (backend, role) = answered_by;
        let backend = if backend.is_empty() { self.backend.clone() } else { backend };
        let serving = role.as_str().to_owned();
        let reply = Reply { id, device: self.device.clone(), backend, serving, result, timing };
        Ok(to.encoding.encode(&reply.to_value()))
    }

    fn status(&self, online: bool, started_at: u64) -> Vec<u8> {
        let s = Status {
            online,
            version: env!("CARGO_PKG_VERSION").into(),
            backend: self.backend.clone(),
            model: self.bundle.dir.display().to_string(),
            started_at,
            degraded: self.engine.status().degraded,
            backend_state: self.engine.status().state.as_str().into(),
            birth: self.identity.birth,
            runtime: self.engine.status().runtime,
            model_name: self.identity.model_name.clone(),
            bundle_sha256: self.identity.bundle_sha256.clone(),
            fleet: self.identity.fleet.clone(),
        };
        Encoding::Json.encode(&s.to_value())
    }

    /// The load figures of the interval that ends now, and the start of the next.
    fn load(&self, es: &crate::engine::process::EngineStatus) -> Load {
        let now = Instant::now();
        let busy = self.engine.busy_time();
        let (questions, latency_ms, span, busy_in) = match self.interval.lock() {
            Ok(mut i) => {
                let (n, p) = i.latencies.take();
                let span = now - i.started;
                let busy_in = busy.saturating_sub(i.busy_at_start);
                i.started = now;
                i.busy_at_start = busy;
                (n, p, span, busy_in)
            }
            Err(_) => (0, [None; 5], Duration::ZERO, Duration::ZERO),
        };
        let secs = span.as_secs_f64();
        let per = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
        Load {
            interval_s: secs,
            questions,
            questions_per_s: per(questions as f64),
            latency_ms,
            busy: per(busy_in.as_secs_f64()).clamp(0.0, 1.0),
            queue_depth: (es.queued + self.waiting_questions.load(Ordering::Relaxed)) as u64,
            rss_kb_agent: crate::vitals::own_rss_kb(),
            rss_kb_worker: es.worker_pid.and_then(crate::vitals::rss_kb),
            temperature_c: crate::vitals::max_temperature_c(),
        }
    }

    fn telemetry(&self, started: Instant) -> Vec<u8> {
        let es = self.engine.status();
        let load = self.load(&es);
        let memo = self.bundle.tokenizer.memo_stats();
        let t = Telemetry {
            device: self.device.clone(),
            uptime_s: started.elapsed().as_secs(),
            answered: self.counters.answered.load(Ordering::Relaxed),
            resent: self.counters.resent.load(Ordering::Relaxed),
            dropped: self.counters.dropped.load(Ordering::Relaxed),
            refused: self
                .counters
                .refused
                .lock()
                .map(|r| r.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect())
                .unwrap_or_default(),
            in_flight: es.in_flight as u64,
            backend: self.backend.clone(),
            backend_state: es.state.as_str().into(),
            primary: es.role == crate::engine::supervisor::Role::Primary,
            degraded: es.degraded,
            restarts: es.restarts,
            token_memo: TokenMemo { hits: memo.hits, misses: memo.misses, entries: memo.entries as u64 },
            probe: es.last_probe.as_ref().map(probe_figures),
            load,
        };
        self.telemetry_encoding.encode(&t.to_value())
    }
}

/// Runs the service until `shutdown` resolves, then stops taking questions, finishes those in
/// flight, publishes `offline` and disconnects.
pub async fn run(
    config: Config,
    engine: Engine,
    bundle: Arc<HostBundle>,
    shutdown: impl Future,
) -> Result<(), ServeError> {
    let schema = Schema::new(&config.mqtt.prefix)?;
    let device = config.device();
    let status_topic = schema.topic(&device, Channel::Status)?.to_string();
    let telemetry_topic = schema.topic(&device, Channel::Telemetry)?.to_string();
    let events_topic = schema.topic(&device, Channel::Events)?.to_string();
    let ask_topic = schema.topic(&device, Channel::Ask)?.to_string();
    let errors_topic = schema.topic(&device, Channel::Errors)?.to_string();
    let fleet_filter = if config.mqtt.fleet.is_empty() {
        None
    } else {
        Some(schema.fleet_subscription(&config.mqtt.share_group, &config.mqtt.fleet)?)
    };
    let started_at = now_unix();
    let started = Instant::now();
    let identity = Identity::new(&bundle, &config.mqtt.fleet, SystemTime::now());
    let telemetry_encoding = if config.mqtt.telemetry_encoding == "cbor" { Encoding::Cbor } else { Encoding::Json };
    let busy_at_start = engine.busy_time();
    let backend = config.engine.backend.clone();
    let offline = Encoding::Json.encode(
        &Status {
            online: false,
            version: env!("CARGO_PKG_VERSION").into(),
            backend: backend.clone(),
            model: bundle.dir.display().to_string(),
            started_at,
            degraded: false,
            backend_state: "starting".into(),
            birth: identity.birth,
            runtime: String::new(),
            model_name: identity.model_name.clone(),
            bundle_sha256: identity.bundle_sha256.clone(),
            fleet: identity.fleet.clone(),
        }
        .to_value(),
    );
    let options = connection::options(&config, &status_topic, offline)?;
    let (client, mut eventloop) = AsyncClient::new(options, 256);
    let shared = Arc::new(Shared {
        client: client.clone(),
        admission: Admission::new(schema.clone(), device.clone(), &config),
        bundle,
        engine,
        replies: Mutex::new(ReplyCache::new(config.limits.remember_replies)),
        in_progress: Mutex::default(),
        permits: Arc::new(Semaphore::new(config.limits.queue)),
        waiting: AtomicUsize::new(0),
        waiting_limit: config.limits.waiting_bytes,
        device: device.clone(),
        backend,
        errors_to: ReplyTo { topic: errors_topic, correlation: None, encoding: Encoding::Json },
        counters: Counters::default(),
        stopping: AtomicBool::new(false),
        identity,
        interval: Mutex::new(Interval { latencies: StageLatencies::default(), started, busy_at_start }),
        waiting_questions: AtomicUsize::new(0),
        telemetry_encoding,
        closed: RwLock::new(false),
    });

    // The waiting room: one task hands places to waiting questions in arrival order.
    let (waiting_tx, mut waiting_rx) = mpsc::unbounded_channel::<(Box<Publish>, Instant, usize)>();
    {
        let shared = shared.clone();
        tokio::spawn(async move {
            while let Some((p, received, bytes)) = waiting_rx.recv().await {
                let permit = shared.permits.clone().acquire_owned().await;
                shared.waiting.fetch_sub(bytes, Ordering::Relaxed);
                shared.waiting_questions.fetch_sub(1, Ordering::Relaxed);
                let Ok(permit) = permit else { break };
                if shared.stopping.load(Ordering::Relaxed) {
                    continue; // not acknowledged: the broker delivers it again later
                }
                let s = shared.clone();
                tokio::spawn(async move {
                    let out = s.handle(&p, received).await;
                    s.deliver(&p, out, Some(permit)).await;
                });
            }
        });
    }

    // The event loop's own task: poll, forward, reconnect with backoff and jitter.
    enum Net {
        Connected { session_present: bool },
        Question(Box<Publish>),
        Closed,
    }
    let (net_tx, mut net_rx) = mpsc::channel::<Net>(1024);
    let (min_backoff, max_backoff) = (
        Duration::from_millis(config.mqtt.reconnect_min_ms.max(1)),
        Duration::from_millis(config.mqtt.reconnect_max_ms.max(1)),
    );
    let poller = tokio::spawn(async move {
        let mut backoff = min_backoff;
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                    backoff = min_backoff;
                    if net_tx.send(Net::Connected { session_present: ack.session_present }).await.is_err() {
                        break;
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    if net_tx.send(Net::Question(Box::new(p))).await.is_err() {
                        break;
                    }
                }
                Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => {
                    // Read on until the broker closes the connection: closing a socket with
                    // unread bytes (a PUBACK for `offline`) sends a TCP reset, which can discard
                    // the DISCONNECT before the broker reads it, and then the Last Will fires.
                    let drain = async { while eventloop.poll().await.is_ok() {} };
                    let _ = tokio::time::timeout(Duration::from_secs(3), drain).await;
                    let _ = net_tx.try_send(Net::Closed);
                    break;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "broker connection lost");
                    let jitter = Duration::from_millis(u64::from(std::process::id() ^ now_unix() as u32) % 250);
                    tokio::time::sleep(backoff + jitter).await;
                    backoff = (backoff * 2).min(max_backoff);
                }
            }
        }
    });

    let notifier = Notifier::from_env();
    let mut watchdog = tokio::time::interval(notifier.watchdog_interval().unwrap_or(Duration::from_secs(3600)));
    let telemetry_every = Duration::from_secs(config.mqtt.telemetry_interval_s.max(1));
    let mut telemetry = tokio::time::interval(telemetry_every);
    telemetry.tick().await;
    let mut ready = false;
    let mut notices = shared.engine.notices();
    let mut probe_runs = shared.engine.probe_runs();
    let mut backend_state = shared.engine.backend_state();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            msg = net_rx.recv() => match msg {
                Some(Net::Connected { session_present }) => {
                    tracing::info!(broker = %config.mqtt.broker, session_present, "connected to the broker");
                    if !session_present {
                        let _ = client.subscribe(ask_topic.clone(), QoS::AtLeastOnce).await;
                        if let Some(f) = &fleet_filter {
                            let _ = client.subscribe(f.clone(), QoS::AtLeastOnce).await;
                        }
                    }
                    let _ = client.publish(status_topic.clone(), QoS::AtLeastOnce, true, shared.status(true, started_at)).await;
                    if !ready {
                        ready = true;
                        // READY once connected with the engine supervised; a failing backend does
                        // not hold it back (the status says `backend_state`).
                        notifier.ready(&format!("serving as {device}"));
                    }
                }
                Some(Net::Question(p)) => {
                    if shared.stopping.load(Ordering::Relaxed) {
                        continue; // not acknowledged: the broker delivers it again later
                    }
                    let received = Instant::now();
                    let s = shared.clone();
                    if let Ok(permit) = shared.permits.clone().try_acquire_owned() {
                        tokio::spawn(async move {
                            let out = s.handle(&p, received).await;
                            s.deliver(&p, out, Some(permit)).await;
                        });
                    } else if let Some(bytes) = shared.reserve_waiting(p.payload.len()) {
                        // More than the Receive Maximum lets the broker send: the question waits,
                        // unacknowledged, for a place, in arrival order; its deadline runs from
                        // its arrival.
                        shared.waiting_questions.fetch_add(1, Ordering::Relaxed);
                        let _ = waiting_tx.send((p, received, bytes));
                    } else {
                        // Over the queue and the waiting room: a retryable error, then the ack
                        // (not redelivered for ever).
                        tokio::spawn(async move {
                            let out = refusal_when_full(&s, &p);
                            s.deliver(&p, out, None).await;
                        });
                    }
                }
                Some(Net::Closed) | None => break,
            },
            _ = watchdog.tick() => notifier.watchdog(),
            // Backend events go out when they happen, and the retained status follows the backend.
            notice = notices.recv() => match notice {
                Ok(n) => {
                    let event = engine_event(&n);
                    let _ = client.publish(events_topic.clone(), QoS::AtLeastOnce, false, Encoding::Json.encode(&event.to_value())).await;
                    if let Some(rejected) = runtime_rejected_event(&n) {
                        let _ = client.publish(events_topic.clone(), QoS::AtLeastOnce, false, Encoding::Json.encode(&rejected.to_value())).await;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "backend events were not published (too many at once)");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {}
            },
            // A failed probe is an event of its own, with the figures (a passed one is in telemetry).
            run = probe_runs.recv() => match run {
                Ok(run) if !run.passed() => {
                    let event = probe_event(&run);
                    let _ = client.publish(events_topic.clone(), QoS::AtLeastOnce, false, Encoding::Json.encode(&event.to_value())).await;
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "probe results were not published (too many at once)");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {}
            },
            Ok(()) = backend_state.changed() => {
                let _ = client.publish(status_topic.clone(), QoS::AtLeastOnce, true, shared.status(true, started_at)).await;
            }
            _ = telemetry.tick(), if config.mqtt.telemetry_interval_s > 0 => {
                let props = PublishProperties {
                    content_type: Some(shared.telemetry_encoding.content_type().to_owned()),
                    payload_format_indicator: Some(u8::from(shared.telemetry_encoding == Encoding::Json)),
                    ..PublishProperties::default()
                };
                let _ = client.publish_with_properties(telemetry_topic.clone(), QoS::AtMostOnce, false, shared.telemetry(started), props).await;
                notifier.status(&format!("{} answered, backend {}{}", shared.counters.answered.load(Ordering::Relaxed), shared.backend, if shared.engine.status().degraded { " (degraded)" } else { "" }));
            }
        }
    }

    // Stop taking questions, let those in flight finish, say goodbye.
    notifier.stopping();
    shared.stopping.store(true, Ordering::Relaxed);
    // Questions still arriving are left unacknowledged; the poller must never wait for room.
    tokio::spawn(async move { while net_rx.recv().await.is_some() {} });
    let grace = Duration::from_secs(config.mqtt.shutdown_grace_s);
    let all = u32::try_from(config.limits.queue).unwrap_or(u32::MAX);
    if tokio::time::timeout(grace, shared.permits.acquire_many(all)).await.is_err() {
        let left = config.limits.queue - shared.permits.available_permits();
        tracing::warn!(left, "questions still in progress at shutdown: left for the broker to deliver again");
    }
    // From here no reply and no acknowledgement is sent: whatever is still in progress is
    // neither answered nor acknowledged. (A delivery being sent holds the lock for moments.)
    match tokio::time::timeout(Duration::from_secs(5), shared.closed.write()).await {
        Ok(mut closed) => *closed = true,
        Err(_) => tracing::warn!("a reply was still being handed to the client at shutdown"),
    }
    // `offline`, then DISCONNECT with reason 0 (normal): the broker discards the Last Will.
    let _ = client.publish(status_topic, QoS::AtLeastOnce, true, shared.status(false, started_at)).await;
    let _ = client.disconnect().await;
    let _ = tokio::time::timeout(Duration::from_secs(5), poller).await;
    Ok(())
}

/// The reply to a question that arrives with the queue full: what admission would refuse it
/// for anyway (too large, malformed, ...), else `overloaded`.
fn refusal_when_full(s: &Shared, p: &Publish) -> Option<Outbound> {
    let incoming = incoming(p);
    let overloaded =
        |id| ErrorReply { id, code: ErrorCode::Overloaded, message: "the question queue is full; retry later".into() };
    match s.admission.decide(&incoming, Instant::now(), &ReplyCache::new(0)) {
        Decision::Answer { request, reply_to, .. } => Some(s.refusal(&reply_to, overloaded(request.id))),
        Decision::Refuse { error, reply_to } => Some(s.refusal(&reply_to, error)),
        Decision::Resend { reply_to, .. } => Some(s.refusal(&reply_to, overloaded(None))),
        Decision::Drop { report } => {
            s.counters.dropped.fetch_add(1, Ordering::Relaxed);
            Some(s.report(&report))
        }
    }
}

/// The wire figures of a probe run.
fn probe_figures(run: &crate::engine::process::ProbeRun) -> ProbeFigures {
    let r = run.report.as_ref();
    ProbeFigures {
        role: run.role.as_str().into(),
        backend: run.backend.clone(),
        rows: run.rows as u64,
        agree: r.map(|r| r.agree as u64),
        clear: r.map(|r| r.clear as u64),
        clear_agree: r.map(|r| r.clear_agree as u64),
        mean_dp: r.map(|r| r.mean_dp),
        max_dp: r.map(|r| r.max_dp),
        mean_cosine: r.map(|r| r.mean_cosine),
        collapse: r.and_then(|r| r.collapse.clone()),
        passed: run.passed(),
        verdict: run.verdict(),
    }
}

/// The `probe_failed` event of a failed probe run.
fn probe_event(run: &crate::engine::process::ProbeRun) -> EngineEvent {
    EngineEvent {
        event: "probe_failed".into(),
        reason: None,
        code: None,
        name: None,
        message: format!("the {} backend does not answer like the float model: {}", run.backend, run.verdict()),
        deadline_ms: None,
        role: run.role.as_str().into(),
        probe: Some(probe_figures(run)),
    }
}

/// `runtime_rejected`, for a restart whose worker refused its vendor runtime (a version the
/// bundle does not allow): the operator must change the board, not wait for a restart to help.
fn runtime_rejected_event(n: &crate::engine::supervisor::Notice) -> Option<EngineEvent> {
    use crate::engine::supervisor::{NoticeKind, RestartReason};
    let Some(RestartReason::LoadFailed(why)) = &n.reason else { return None };
    if n.kind != NoticeKind::WorkerRestart {
        return None;
    }
    let at = why.find(crate::engine::RUNTIME_REJECTED)?;
    Some(EngineEvent {
        event: "runtime_rejected".into(),
        reason: Some("load_failed".into()),
        code: None,
        name: None,
        message: why[at + crate::engine::RUNTIME_REJECTED.len()..].to_owned(),
        deadline_ms: None,
        role: n.role.as_str().into(),
        probe: None,
    })
}

/// The events-topic document for an engine notice.
fn engine_event(n: &crate::engine::supervisor::Notice) -> EngineEvent {
    use crate::engine::supervisor::RestartReason;
    let reason = n.reason.as_ref();
    EngineEvent {
        event: n.kind.as_str().into(),
        reason: reason.map(|r| r.label().into()),
        code: reason.and_then(RestartReason::code),
        name: reason.and_then(RestartReason::name),
        message: n.message.clone(),
        deadline_ms: match reason {
            Some(RestartReason::Deadline(d)) => Some(d.as_millis() as u64),
            _ => None,
        },
        role: n.role.as_str().into(),
        probe: None,
    }
}

/// A request id for logs: its JSON text (`"r1"`, `7`).
fn id_text(id: &laya_topics::Value) -> String {
    laya_topics::json::to_string(id, laya_topics::json::Style::COMPACT)
}

/// The parts of an MQTT publish that admission reads.
fn incoming(p: &Publish) -> Incoming<'_> {
    let props = p.properties.as_ref();
    Incoming {
        payload: &p.payload,
        content_type: props.and_then(|x| x.content_type.as_deref()),
        response_topic: props.and_then(|x| x.response_topic.as_deref()),
        correlation: props.and_then(|x| x.correlation_data.as_deref()),
        message_expiry_s: props.and_then(|x| x.message_expiry_interval),
    }
}
