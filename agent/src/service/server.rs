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
use super::link::{Link, Loss};
use super::liveness::{self, Liveness, Part};
use super::outbox::{self, Item, Outbox};
use crate::bundle::HostBundle;
use crate::config::Config;
use crate::decide::{self, RowOutput};
use crate::engine::{Engine, EngineError};
use crate::pipeline;
use crate::prompt::Row;
use crate::platform::systemd::Notifier;

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

/// Requests larger than the inline limit decoded and laid out at once, at most. Decoding and
/// tokenizing a large request costs many times its bytes (a legal 220 KB state of 11,000 keys:
/// its document, its serialized text and the tokenizer's encoding of all of it before the cut),
/// so the rest wait for a slot as their raw bytes (issue #31: 64 of them at once took the agent
/// to 1.9 GB). Two keep both cores busy.
pub const PREPARING_AT_ONCE: usize = 2;

/// Counters for telemetry.
#[derive(Debug, Default)]
struct Counters {
    answered: AtomicU64,
    refused: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    dropped: AtomicU64,
    resent: AtomicU64,
}

/// What answers questions: a model bundle and the engine running it. A reload (SIGHUP) replaces
/// it whole once the new engine passed its health call; a question keeps the one it started
/// with, so the old engine lives until its last question is answered.
pub struct Serving {
    pub bundle: Arc<HostBundle>,
    pub engine: Engine,
    /// The configured backend's name (`engine.backend`).
    pub backend: String,
    /// This model's part of the status document (`model_name`, `bundle_sha256`).
    identity: Identity,
}

impl Serving {
    pub fn new(bundle: Arc<HostBundle>, engine: Engine, backend: &str) -> Serving {
        let identity = Identity::new(&bundle);
        Serving { bundle, engine, backend: backend.to_owned(), identity }
    }
}

/// A reload's candidate, made by the command line from the re-read configuration: the new
/// configuration, its bundle and the engine to start for it; or why none could be made.
pub enum Reload {
    Candidate { config: Box<Config>, bundle: Arc<HostBundle>, engine: crate::engine::EngineConfig },
    Failed(String),
}

struct Shared {
    client: AsyncClient,
    admission: Admission,
    /// What answers questions now (see [`Serving`]).
    serving: std::sync::RwLock<Arc<Serving>>,
    replies: Mutex<ReplyCache>,
    /// Questions being answered, by key: a redelivered copy waits on its original's reply
    /// (`None` until then; the sender dropped without one means the original failed).
    in_progress: Mutex<std::collections::HashMap<RequestKey, watch::Receiver<Option<Vec<u8>>>>>,
    permits: Arc<Semaphore>,
    /// Slots for decoding and laying out large requests ([`PREPARING_AT_ONCE`]).
    preparing: Arc<Semaphore>,
    /// Set when a question is answered; the 1 s heartbeat hands freed heap back to the kernel
    /// once nothing is in progress (after a burst, not per question).
    trim_due: AtomicBool,
    /// Payload bytes of questions waiting for a place (`limits.waiting_bytes`).
    waiting: AtomicUsize,
    waiting_limit: usize,
    device: String,
    /// `{prefix}/{device}/errors`, where undeliverable questions are reported.
    errors_to: ReplyTo,
    counters: Counters,
    stopping: AtomicBool,
    /// This run's start, in the status document (`Status::birth`: milliseconds since the epoch).
    birth: u64,
    fleet: String,
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
    /// Sessions another client with our client id took over in this run (`Status::takeovers`).
    takeovers: AtomicU64,
}

/// What the status document says about the model being served.
struct Identity {
    model_name: String,
    bundle_sha256: Option<String>,
}

impl Identity {
    fn new(bundle: &HostBundle) -> Identity {
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
        Identity { model_name, bundle_sha256 }
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
    /// What answers questions now.
    fn serving(&self) -> Arc<Serving> {
        self.serving.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

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
            self.trim_due.store(true, Ordering::Relaxed);
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
        // A large request waits for a slot before it is decoded, and keeps it until laid out.
        let encoding = Encoding::detect(incoming.content_type, incoming.payload);
        let inline = publish.payload.len() <= inline_limit(encoding);
        let slot = if inline { None } else { self.preparing.clone().acquire_owned().await.ok() };
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
                // Everything logged while answering names the question.
                let span = tracing::info_span!(
                    "question",
                    id = %request.id.as_ref().map(id_text).unwrap_or_default(),
                    device = %self.device,
                    questions = request.questions.len(),
                );
                let answer = self.answer(*request, &reply_to, deadline, received, slot);
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
        slot: Option<OwnedSemaphorePermit>,
    ) -> Result<Vec<u8>, ErrorReply> {
        let id = request.id.clone();
        let error = |code, message: String| ErrorReply { id: id.clone(), code, message };
        // The bundle and engine this question started with, whatever a reload does meanwhile.
        let serving = self.serving();
        let bundle = serving.bundle.clone();
        let t0 = Instant::now();
        // Only the language is read after layout: the request itself (its state document, the
        // larger part of its memory) is dropped with the layout's work.
        let lang = request.lang.clone();
        let max_tokens = self.admission.limits.max_request_tokens;
        let prepare = move || pipeline::prepare(&bundle, &request, max_tokens);
        // A panic must not lose the question: it gets an error reply like any other failure.
        let prepared = match slot {
            None => {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(prepare)).map_err(|_| "it panicked".to_owned())
            }
            Some(slot) => {
                let prepared = tokio::task::spawn_blocking(prepare).await.map_err(|e| e.to_string());
                drop(slot);
                prepared
            }
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
        let mut answered_by = (serving.backend.clone(), crate::engine::supervisor::Role::Primary);
        let (outputs, infer_ms) = if rows.is_empty() {
            (Vec::new(), 0.0)
        } else {
            let run = serving.engine.run(rows, deadline);
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
        let outputs: Vec<RowOutput> = outputs
            .into_iter()
            .map(|r| RowOutput { act_probs: decide::act_probabilities(&r.act_logits), logits: r.logits })
            .collect();
        let result = decide::assemble(&prepared, &outputs, &serving.bundle.config.temperatures, lang.as_deref())
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
        let backend = if backend.is_empty() { serving.backend.clone() } else { backend };
        let serving = role.as_str().to_owned();
        let reply = Reply { id, device: self.device.clone(), backend, serving, result, timing };
        Ok(to.encoding.encode(&reply.to_value()))
    }

    fn status(&self, online: bool, started_at: u64) -> Vec<u8> {
        let serving = self.serving();
        let es = serving.engine.status();
        let s = Status {
            online,
            version: env!("CARGO_PKG_VERSION").into(),
            backend: serving.backend.clone(),
            model: serving.bundle.dir.display().to_string(),
            started_at,
            degraded: es.degraded,
            backend_state: es.state.as_str().into(),
            birth: self.birth,
            runtime: es.runtime,
            model_name: serving.identity.model_name.clone(),
            bundle_sha256: serving.identity.bundle_sha256.clone(),
            fleet: self.fleet.clone(),
            takeovers: self.takeovers.load(Ordering::Relaxed),
        };
        Encoding::Json.encode(&s.to_value())
    }

    /// The load figures of the interval that ends now, and the start of the next.
    fn load(&self, engine: &Engine, es: &crate::engine::EngineStatus) -> Load {
        let now = Instant::now();
        let busy = engine.busy_time();
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
            rss_kb_agent: crate::platform::vitals::own_rss_kb(),
            rss_kb_worker: es.worker_pid.and_then(crate::platform::vitals::rss_kb),
            temperature_c: crate::platform::vitals::max_temperature_c(),
        }
    }

    fn telemetry(&self, started: Instant) -> Vec<u8> {
        let serving = self.serving();
        let es = serving.engine.status();
        let load = self.load(&serving.engine, &es);
        let memo = serving.bundle.tokenizer.memo_stats();
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
            backend: serving.backend.clone(),
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
/// flight, publishes `offline` and disconnects. Each [`Reload`] from `reloads` is started beside
/// the serving engine and replaces it once its health call passes.
pub async fn run(
    mut config: Config,
    engine: Engine,
    bundle: Arc<HostBundle>,
    shutdown: impl Future,
    mut reloads: mpsc::UnboundedReceiver<Reload>,
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
    let birth = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let telemetry_encoding = config.mqtt.telemetry_encoding.encoding();
    let busy_at_start = engine.busy_time();
    let serving = Serving::new(bundle, engine, config.engine.backend.name());
    let offline = Encoding::Json.encode(
        &Status {
            online: false,
            version: env!("CARGO_PKG_VERSION").into(),
            backend: serving.backend.clone(),
            model: serving.bundle.dir.display().to_string(),
            started_at,
            degraded: false,
            backend_state: "starting".into(),
            birth,
            runtime: String::new(),
            model_name: serving.identity.model_name.clone(),
            bundle_sha256: serving.identity.bundle_sha256.clone(),
            fleet: config.mqtt.fleet.clone(),
            takeovers: 0,
        }
        .to_value(),
    );
    let options = connection::options(&config, &status_topic, offline)?;
    let (client, mut eventloop) = AsyncClient::new(options, 256);
    let shared = Arc::new(Shared {
        client: client.clone(),
        admission: Admission::new(schema.clone(), device.clone(), &config),
        serving: std::sync::RwLock::new(Arc::new(serving)),
        replies: Mutex::new(ReplyCache::bounded(config.limits.remember_replies, config.limits.remember_bytes)),
        in_progress: Mutex::default(),
        permits: Arc::new(Semaphore::new(config.limits.queue)),
        preparing: Arc::new(Semaphore::new(PREPARING_AT_ONCE)),
        trim_due: AtomicBool::new(false),
        waiting: AtomicUsize::new(0),
        waiting_limit: config.limits.waiting_bytes,
        device: device.clone(),
        errors_to: ReplyTo { topic: errors_topic, correlation: None, encoding: Encoding::Json },
        counters: Counters::default(),
        stopping: AtomicBool::new(false),
        birth,
        fleet: config.mqtt.fleet.clone(),
        interval: Mutex::new(Interval { latencies: StageLatencies::default(), started, busy_at_start }),
        waiting_questions: AtomicUsize::new(0),
        telemetry_encoding,
        closed: RwLock::new(false),
        takeovers: AtomicU64::new(0),
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

    // What the loop publishes for itself goes through the outbox: the loop never waits on the
    // client (whose connection task may be waiting for the loop).
    let outbox = Arc::new(Outbox::default());
    {
        let outbox = outbox.clone();
        let client = client.clone();
        let topics =
            outbox::Topics { status: status_topic.clone(), events: events_topic.clone(), telemetry: telemetry_topic.clone() };
        tokio::spawn(async move { outbox.run(client, topics).await });
    }
    let publish_event = |event: &EngineEvent| outbox.push(Item::Event(Encoding::Json.encode(&event.to_value())));

    // The loop and the connection task watch each other from a thread (`bus::liveness`).
    let alive = Arc::new(Liveness::new(Instant::now()));
    let connect_timeout = Duration::from_secs(5);
    let mut link = Link::new(
        Duration::from_secs(config.mqtt.keep_alive_s.max(5)),
        Duration::from_millis(config.mqtt.reconnect_min_ms.max(1)),
        Duration::from_millis(config.mqtt.reconnect_max_ms.max(1)),
        super::link::process_jitter(Duration::from_millis(250)),
        Instant::now(),
    );
    let stall_bound = Duration::from_secs(config.limits.loop_stall_s);
    let link_turn = link.longest_turn(connect_timeout);
    if config.limits.loop_stall_s > 0 {
        let bounds = liveness::Bounds { service_loop: stall_bound, link: stall_bound + link_turn };
        if let Err(e) = liveness::watch(alive.clone(), bounds, Duration::from_secs(1), liveness::exit_on_stall) {
            tracing::warn!(error = %e, "cannot start the liveness watch");
        }
    }

    // The connection task: poll, forward, reconnect with backoff and jitter. It waits on nothing
    // but the connection (the channel to the loop is unbounded: every question it carries is
    // taken at once by the loop, which never waits either), and no poll may take longer than the
    // link allows (`Link::poll_bound`): a broker that stopped talking or reading is dropped.
    enum Net {
        Connected { session_present: bool },
        Question(Box<Publish>),
        /// Our session was taken over: `named` by the broker (0x8E), else inferred from closes.
        TakenOver { named: bool },
        Closed,
    }
    let (net_tx, mut net_rx) = mpsc::unbounded_channel::<Net>();
    let link_alive = alive.clone();
    let poller = tokio::spawn(async move {
        loop {
            link_alive.beat(Part::Link);
            let bound = link.poll_bound(Instant::now(), connect_timeout);
            let loss = match tokio::time::timeout(bound, eventloop.poll()).await {
                Ok(Ok(event)) => {
                    match event {
                        Event::Incoming(packet) => {
                            link.incoming(Instant::now());
                            let sent = match packet {
                                Packet::ConnAck(ack) => {
                                    link.connected(Instant::now());
                                    net_tx.send(Net::Connected { session_present: ack.session_present })
                                }
                                Packet::Publish(p) => net_tx.send(Net::Question(Box::new(p))),
                                _ => Ok(()),
                            };
                            if sent.is_err() {
                                break;
                            }
                        }
                        Event::Outgoing(rumqttc::Outgoing::Disconnect) => {
                            // Read on until the broker closes the connection: closing a socket with
                            // unread bytes (a PUBACK for `offline`) sends a TCP reset, which can
                            // discard the DISCONNECT before the broker reads it, and then the Last
                            // Will fires.
                            let drain = async { while eventloop.poll().await.is_ok() {} };
                            let _ = tokio::time::timeout(Duration::from_secs(3), drain).await;
                            let _ = net_tx.send(Net::Closed);
                            break;
                        }
                        Event::Outgoing(_) => {}
                    }
                    continue;
                }
                Ok(Err(rumqttc::v5::ConnectionError::MqttState(rumqttc::v5::StateError::ServerDisconnect {
                    reason_code: rumqttc::v5::mqttbytes::v5::DisconnectReasonCode::SessionTakenOver,
                    ..
                }))) => Loss::TakenOver,
                Ok(Err(rumqttc::v5::ConnectionError::MqttState(rumqttc::v5::StateError::ConnectionAborted)))
                    if link.is_connected() =>
                {
                    tracing::warn!("the broker closed the connection");
                    Loss::Closed
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "broker connection lost");
                    Loss::Error
                }
                Err(_) => {
                    // The poll was cut short: drop the connection, keep what is unacknowledged
                    // for the next one.
                    let loss = link.poll_timed_out(Instant::now());
                    eventloop.clean();
                    match loss {
                        Loss::Silent => tracing::warn!(
                            silent_s = bound.as_secs_f64(),
                            "the broker said nothing for one and a half keep-alives: the connection is taken for lost"
                        ),
                        _ => tracing::warn!(
                            stuck_s = bound.as_secs_f64(),
                            "the broker connection made no progress (a write the broker does not read): reconnecting"
                        ),
                    }
                    loss
                }
            };
            let taken_before = link.takeovers;
            let wait = link.lost(&loss, Instant::now());
            if link.takeovers > taken_before {
                let named = loss == Loss::TakenOver;
                tracing::warn!(
                    client_id = %eventloop.options.client_id(),
                    takeovers = link.takeovers,
                    retry_in = ?wait,
                    "another client connected with this agent's client id and took its session \
                     (two devices with one client id, e.g. a cloned image?): reconnecting later"
                );
                if net_tx.send(Net::TakenOver { named }).is_err() {
                    break;
                }
            } else {
                tracing::info!(retry_in = ?wait, "reconnecting to the broker");
            }
            link_alive.beat(Part::Link);
            tokio::time::sleep(wait).await;
        }
    });

    let notifier = Notifier::from_env();
    let mut watchdog = tokio::time::interval(notifier.watchdog_interval().unwrap_or(Duration::from_secs(3600)));
    let telemetry_every = Duration::from_secs(config.mqtt.telemetry_interval_s.max(1));
    let mut telemetry = tokio::time::interval(telemetry_every);
    telemetry.tick().await;
    let mut heartbeat = tokio::time::interval(Duration::from_secs(1));
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ready = false;
    let (mut notices, mut probe_runs, mut backend_state) = {
        let engine = &shared.serving().engine;
        (engine.notices(), engine.probe_runs(), engine.backend_state())
    };
    // A reload's candidate being health-checked beside the serving engine, and its verdict.
    let (verdict_tx, mut verdicts) = mpsc::unbounded_channel::<(Box<Config>, Arc<Serving>, Result<(), String>)>();
    tokio::pin!(shutdown);
    loop {
        alive.beat(Part::Loop);
        tokio::select! {
            _ = &mut shutdown => break,
            msg = net_rx.recv() => match msg {
                Some(Net::Connected { session_present }) => {
                    tracing::info!(broker = %config.mqtt.broker, session_present, "connected to the broker");
                    if !session_present {
                        outbox.push(Item::Subscribe(ask_topic.clone()));
                        if let Some(f) = &fleet_filter {
                            outbox.push(Item::Subscribe(f.clone()));
                        }
                    }
                    outbox.push(Item::Status(shared.status(true, started_at)));
                    if !ready {
                        ready = true;
                        // READY once connected with the engine supervised; a failing backend does
                        // not hold it back (the status says `backend_state`).
                        notifier.ready(&format!("serving as {device}"));
                    }
                }
                Some(Net::TakenOver { named }) => {
                    let n = shared.takeovers.fetch_add(1, Ordering::Relaxed) + 1;
                    let how = if named {
                        "the broker said another client connected with this agent's client id and took its session (DISCONNECT 0x8E)"
                    } else {
                        "the broker closed this agent's connection again soon after accepting it, as it does when another client connects with the same client id"
                    };
                    publish_event(&EngineEvent {
                        event: "session_taken_over".into(),
                        reason: Some(if named { "disconnect_0x8e" } else { "closed_after_connect" }.into()),
                        code: named.then_some(0x8E),
                        name: named.then(|| "SessionTakenOver".to_owned()),
                        message: format!(
                            "{how}, client id {:?} ({n} times in this run): two devices share one client id \
                             (a cloned image?); give each its own mqtt.device or mqtt.client_id",
                            config.client_id()
                        ),
                        deadline_ms: None,
                        role: String::new(),
                        probe: None,
                    });
                    outbox.push(Item::Status(shared.status(true, started_at)));
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
                        // (not redelivered for ever). The refusal is made now and the question's
                        // payload let go: what waits to be sent is the small refusal only.
                        let out = refusal_when_full(&s, &p);
                        let ack = ack_only(&p);
                        drop(p);
                        tokio::spawn(async move { s.deliver(&ack, out, None).await });
                    }
                }
                Some(Net::Closed) | None => break,
            },
            _ = heartbeat.tick() => {
                // After a burst, once nothing is in progress: freed heap back to the kernel.
                if shared.permits.available_permits() == config.limits.queue
                    && shared.waiting_questions.load(Ordering::Relaxed) == 0
                    && shared.trim_due.swap(false, Ordering::Relaxed)
                {
                    crate::platform::heap::release_freed();
                }
            }
            // Pings only while the connection task beats too: a stalled one stops them, and
            // systemd restarts the service.
            _ = watchdog.tick() => {
                if alive.fresh(Instant::now(), stall_bound.max(Duration::from_secs(1)) + link_turn) {
                    notifier.watchdog();
                } else {
                    tracing::error!("the broker connection task stopped making progress: no systemd watchdog ping");
                }
            }
            // Backend events go out when they happen, and the retained status follows the backend.
            notice = notices.recv() => match notice {
                Ok(n) => {
                    publish_event(&engine_event(&n));
                    if let Some(rejected) = runtime_rejected_event(&n) {
                        publish_event(&rejected);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "backend events were not published (too many at once)");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {}
            },
            // A failed probe is an event of its own, with the figures (a passed one is in telemetry).
            run = probe_runs.recv() => match run {
                Ok(run) if !run.passed() => publish_event(&probe_event(&run)),
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "probe results were not published (too many at once)");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {}
            },
            Ok(()) = backend_state.changed() => outbox.push(Item::Status(shared.status(true, started_at))),
            Some(reload) = reloads.recv() => match reload {
                Reload::Failed(why) => publish_event(&reload_event("reload_rejected", why)),
                Reload::Candidate { config: new, bundle, engine } => match reload_refusal(&config, &new) {
                    Some(why) => publish_event(&reload_event("reload_rejected", why)),
                    None => {
                        tracing::info!(model = %bundle.dir.display(), "reload: starting the new engine beside the serving one");
                        let candidate = Arc::new(Serving::new(bundle, Engine::start(engine), new.engine.backend.name()));
                        let verdicts = verdict_tx.clone();
                        let within = reload_allowance(&new);
                        tokio::spawn(async move {
                            let verdict = until_ready(&candidate.engine, within).await;
                            let _ = verdicts.send((new, candidate, verdict));
                        });
                    }
                },
            },
            Some((new, candidate, verdict)) = verdicts.recv() => match verdict {
                Ok(()) => {
                    let message = format!(
                        "now serving {} on the {} backend (the new engine passed its health call)",
                        candidate.bundle.dir.display(),
                        candidate.backend
                    );
                    tracing::info!(%message, "reload: taking over");
                    notices = candidate.engine.notices();
                    probe_runs = candidate.engine.probe_runs();
                    backend_state = candidate.engine.backend_state();
                    if let Ok(mut i) = shared.interval.lock() {
                        i.busy_at_start = candidate.engine.busy_time();
                    }
                    // The old engine stops once its last question is answered (its last handle
                    // is dropped then).
                    *shared.serving.write().unwrap_or_else(|e| e.into_inner()) = candidate;
                    config = *new;
                    publish_event(&reload_event("reloaded", message));
                    outbox.push(Item::Status(shared.status(true, started_at)));
                }
                Err(why) => {
                    // Dropping the candidate stops its worker; the serving engine never paused.
                    drop(candidate);
                    publish_event(&reload_event("reload_rejected", format!("the new engine failed its health call: {why}")));
                }
            },
            _ = telemetry.tick(), if config.mqtt.telemetry_interval_s > 0 => {
                let props = PublishProperties {
                    content_type: Some(shared.telemetry_encoding.content_type().to_owned()),
                    payload_format_indicator: Some(u8::from(shared.telemetry_encoding == Encoding::Json)),
                    ..PublishProperties::default()
                };
                outbox.push(Item::Telemetry(shared.telemetry(started), props));
                let serving = shared.serving();
                notifier.status(&format!("{} answered, backend {}{}", shared.counters.answered.load(Ordering::Relaxed), serving.backend, if serving.engine.status().degraded { " (degraded)" } else { "" }));
            }
        }
    }

    // Stop taking questions, let those in flight finish, say goodbye. Every wait below has its
    // own bound, so the liveness watch ends here.
    alive.stop();
    notifier.stopping();
    let outbox_done = outbox.close();
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
    // What the outbox was sending goes before `offline`.
    let _ = tokio::time::timeout(Duration::from_secs(5), outbox_done).await;
    // `offline`, then DISCONNECT with reason 0 (normal): the broker discards the Last Will.
    let _ = client.publish(status_topic, QoS::AtLeastOnce, true, shared.status(false, started_at)).await;
    let _ = client.disconnect().await;
    let _ = tokio::time::timeout(Duration::from_secs(5), poller).await;
    Ok(())
}

/// Why a reload's configuration cannot be applied without a restart, if it cannot: the broker
/// connection (`[mqtt]`), the queue and limits it announced and admits by (`[limits]`) and the
/// log filter are set at start. What a reload applies: `[model]`, `[engine]`, `[rknn]`, `[qnn]`,
/// `[probe]`.
fn reload_refusal(serving: &Config, new: &Config) -> Option<String> {
    let changed: Vec<&str> = [
        ("[mqtt]", serving.mqtt != new.mqtt),
        ("[limits]", serving.limits != new.limits),
        ("[log]", serving.log != new.log),
    ]
    .into_iter()
    .filter_map(|(section, differs)| differs.then_some(section))
    .collect();
    (!changed.is_empty()).then(|| {
        format!(
            "the new configuration changes {}, which only a restart applies; nothing was reloaded (a reload applies [model], [engine], [rknn], [qnn] and [probe])",
            changed.join(", ")
        )
    })
}

/// How long a reload's engine may take to pass its first health call: loading
/// (`startup_timeout_s`), the first inference's allowance, and a minute for the health rows and
/// the probe.
fn reload_allowance(config: &Config) -> Duration {
    Duration::from_secs(config.engine.startup_timeout_s)
        + Duration::from_millis(config.engine.load_allowance_ms)
        + Duration::from_secs(60)
}

/// Waits for a new engine's verdict: `Ok` once it is ready (its worker loaded and passed its
/// health call and probe), the reason of its first failure (a restart, or degradation), or a
/// time-out after `within`.
async fn until_ready(engine: &Engine, within: Duration) -> Result<(), String> {
    use crate::engine::supervisor::{BackendState, NoticeKind};
    use tokio::sync::broadcast::error::RecvError;
    let mut state = engine.backend_state();
    let mut notices = engine.notices();
    let wait = async {
        loop {
            match *state.borrow_and_update() {
                BackendState::Ready => return Ok(()),
                BackendState::Degraded => return Err("the new backend is degraded".to_owned()),
                BackendState::Starting => {}
            }
            tokio::select! {
                changed = state.changed() => if changed.is_err() {
                    return Err("the new engine stopped".to_owned());
                },
                notice = notices.recv() => match notice {
                    Ok(n) if n.kind == NoticeKind::WorkerRestart => return Err(n.message),
                    Ok(_) | Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => return Err("the new engine stopped".to_owned()),
                },
            }
        }
    };
    match tokio::time::timeout(within, wait).await {
        Ok(verdict) => verdict,
        Err(_) => Err(format!("its worker did not pass a health call within {} s", within.as_secs())),
    }
}

/// A reload's event: `reloaded` or `reload_rejected`, with what happened.
fn reload_event(kind: &str, message: String) -> EngineEvent {
    if kind == "reloaded" {
        tracing::info!(%message, "reloaded");
    } else {
        tracing::warn!(%message, "reload rejected: the serving engine goes on");
    }
    EngineEvent {
        event: kind.into(),
        reason: None,
        code: None,
        name: None,
        message,
        deadline_ms: None,
        role: String::new(),
        probe: None,
    }
}

/// The largest request tokenized on the runtime's thread, by encoding (see
/// [`INLINE_TOKENIZE_BYTES`]).
fn inline_limit(encoding: Encoding) -> usize {
    match encoding {
        Encoding::Json => INLINE_TOKENIZE_BYTES,
        Encoding::Cbor => INLINE_TOKENIZE_BYTES / 8,
    }
}

/// A publish that carries only what acknowledging `p` needs (its packet id and QoS), so that a
/// question's payload is not held while its acknowledgement waits to be sent.
fn ack_only(p: &Publish) -> Publish {
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
fn probe_figures(run: &crate::engine::ProbeRun) -> ProbeFigures {
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
fn probe_event(run: &crate::engine::ProbeRun) -> EngineEvent {
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
    use crate::backend::{LoadError, LoadFailure};
    use crate::engine::supervisor::{NoticeKind, RestartReason};
    let Some(RestartReason::LoadFailed(LoadError { kind: LoadFailure::RuntimeRejected, message })) = &n.reason else {
        return None;
    };
    if n.kind != NoticeKind::WorkerRestart {
        return None;
    }
    Some(EngineEvent {
        event: "runtime_rejected".into(),
        reason: Some("load_failed".into()),
        code: None,
        name: None,
        message: message.clone(),
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
