//! `laya-edge serve`: questions in over MQTT (and through the HTTP door), typed decisions out.
//!
//! The service runs on a single-threaded runtime, so no task may block it for long. [`run`]
//! wires the parts; the loop-owned [`Service`] has one method per arm of its ONE `select!` loop,
//! and each task gets only the state it needs (mini-redis's Listener/Handler split):
//!
//! - `poller` polls rumqttc's event loop and does nothing else; `link` decides when the
//!   connection is lost and how long to wait (pure); `connection` builds the broker options.
//! - One question path behind two front doors: an MQTT publish and a request the HTTP door
//!   admitted (`door`, through a [`Doorway`]) both go through `flow`, which decides where an
//!   arriving question goes: a place in `limits.queue`, the waiting room (clients in turn, the
//!   heaviest giving way when it is full), or a refusal (pure); [`Handler`] runs each admitted
//!   question in its own task.
//! - `question` is one question's path (admission, redelivery, the memory budget, the answer via
//!   `pipeline` on the engine), and `delivery` the gate that publishes an MQTT reply and
//!   acknowledges it, together or not at all; `admission` decides what to do with a message (pure).
//! - `telemetry` builds the status and telemetry documents, `identity` what they say is served;
//!   `events` maps the engine's notices to events (pure); `outbox` queues what the loop publishes
//!   for itself; `liveness` watches the loop and the connection task.
//! - `reload` holds what answers questions, runs each SIGHUP as a transaction and takes over.
//!
//! On shutdown, questions in progress get `mqtt.shutdown_grace_s` to finish; then the delivery
//! gate closes and the agent publishes `offline` and disconnects.

pub mod admission;
pub mod connection;
pub mod delivery;
#[cfg(feature = "demo")]
pub mod demo;
pub mod door;
pub mod events;
pub mod flow;
pub mod identity;
pub mod latency;
pub mod link;
pub mod liveness;
pub mod outbox;
pub mod poller;
pub mod question;
pub mod reload;
pub mod report;
pub mod telemetry;
pub mod turnstile;
pub mod workshop;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rumqttc::v5::AsyncClient;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Publish;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use laya_topics::topic::{Channel, Schema};
use laya_topics::wire::{Encoding, EngineEvent};

pub use flow::INLINE_TOKENIZE_BYTES;
pub use reload::{Reload, Serving};

use admission::{Admission, ReplyCache, ReplyTo};
use delivery::Gate;
use door::{Asked, Refused};
use events::{notice_events, probe_event, takeover_event};
use flow::{ClientKey, Entered, Flow, Full, Room};
use liveness::{Liveness, Part};
use outbox::{Item, Outbox};
use poller::Net;
use question::Questions;
use reload::{Current, Reloads, Settled};
use telemetry::{Birth, Counters, Interval, Reporter};

use crate::bundle::HostBundle;
use crate::config::Config;
use crate::engine::Engine;
use crate::platform::systemd::Notifier;

/// Why the service stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Connection(#[from] connection::ConnectionError),
    #[error(transparent)]
    Topic(#[from] laya_topics::topic::TopicError),
}

/// What a question's task needs: its handling, its delivery, the queue's places and the flow.
struct Handler {
    questions: Questions,
    gate: Gate,
    /// The `limits.queue` places: a question holds one ([`Seat`]) from its start to its
    /// acknowledgement.
    places: Arc<Semaphore>,
    flow: Arc<Flow>,
    /// The questions waiting for a place, by client, served in turn, and the places each client
    /// holds ([`flow::Room`]).
    room: Mutex<Room<Arrival>>,
}

/// A question's place in the queue, counted against its client's share; when it is given back
/// (dropped, before the acknowledgement), the next waiting question in turn takes a place.
struct Seat {
    permit: Option<OwnedSemaphorePermit>,
    client: ClientKey,
    handler: Arc<Handler>,
}

impl Drop for Seat {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.handler.room().unseat(&self.client);
        self.handler.dispatch();
    }
}

impl Handler {
    fn room(&self) -> std::sync::MutexGuard<'_, Room<Arrival>> {
        self.room.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Handles a question that has its place, in a task of its own.
    fn spawn(self: &Arc<Self>, arrival: Arrival, permit: OwnedSemaphorePermit, client: ClientKey) {
        let asker = self.flow.asker(&client);
        let seat = Seat { permit: Some(permit), client: client.clone(), handler: self.clone() };
        let h = self.clone();
        match arrival {
            Arrival::Mqtt { p, received } => tokio::spawn(async move {
                let out = h.questions.handle(&p, received, (client.clone(), asker)).await;
                h.gate.deliver(client, &p, out, Some(seat)).await;
            }),
            Arrival::Asked(asked) => tokio::spawn(async move {
                let Asked { request, bytes, received, reply, .. } = *asked;
                let outcome = h.questions.handle_request(request, bytes, received, (client, asker)).await;
                // Its place is given back once the door has the answer (a caller that left
                // no longer waits for it: nothing to send).
                let _ = reply.send(outcome.map_err(Refused::from));
                drop(seat);
            }),
        };
    }

    /// A question that arrived at a door: it takes a free place if its client is below its
    /// share, else waits in the room, else is refused.
    fn arrived(self: &Arc<Self>, arrival: Arrival) {
        let client = match &arrival {
            Arrival::Mqtt { p, .. } => self.questions.admission.client_of(&question::incoming(p)),
            Arrival::Asked(a) => a.client.clone(),
        };
        let entered = {
            let mut room = self.room();
            // A free place means nothing that may take one waits ([`Handler::dispatch`]).
            if let Ok(permit) = self.places.clone().try_acquire_owned()
                && room.seat(&client)
            {
                drop(room);
                return self.spawn(arrival, permit, client);
            }
            // The question waits (unacknowledged, over MQTT) for a place in its client's turn;
            // its deadline runs from its arrival.
            let charge = flow::waiting_charge(arrival.bytes());
            let entered = room.enter(client, charge, arrival);
            self.flow.waiting(&room);
            entered
        };
        match entered {
            Entered::Waits(gave_way) => gave_way.into_iter().for_each(|w| self.refuse(w, Full::GaveWay)),
            Entered::Refused(w) => self.refuse(w, Full::Queue),
        }
    }

    /// A question not taken (or not kept): a retryable error, then the ack (not redelivered for
    /// ever). The refusal is made now and the question's payload let go: what waits to be sent
    /// is the small refusal only.
    fn refuse(self: &Arc<Self>, arrival: Arrival, why: Full) {
        let p = match arrival {
            Arrival::Mqtt { p, .. } => p,
            Arrival::Asked(asked) => {
                self.questions.counters.refused(laya_topics::wire::ErrorCode::Overloaded);
                let _ = asked.reply.send(Err(Refused::Busy));
                return;
            }
        };
        let client = self.questions.admission.client_of(&question::incoming(&p));
        let out = self.questions.when_full(&p, why);
        let ack = delivery::ack_only(&p);
        drop(p);
        let h = self.clone();
        tokio::spawn(async move { h.gate.deliver(client, &ack, Some(out), None::<Seat>).await });
    }

    /// Empties the waiting room as the agent stops: another door's requests are refused busy;
    /// MQTT questions are dropped unacknowledged (delivered again to the next run).
    fn close_room(self: &Arc<Self>) {
        let waiting = {
            let mut room = self.room();
            let waiting = room.drain();
            self.flow.waiting(&room);
            waiting
        };
        for arrival in waiting {
            if let Arrival::Asked(asked) = arrival {
                let _ = asked.reply.send(Err(Refused::Busy));
            }
        }
    }

    /// Hands free places to waiting questions, their clients in turn, while both last; called
    /// whenever a place is given back. Not while stopping: what waits is left unacknowledged,
    /// for the broker to deliver again later.
    fn dispatch(self: &Arc<Self>) {
        // A place given back as the runtime goes away (its tasks dropped) starts nothing.
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        while !self.flow.stopping() {
            let next = {
                let mut room = self.room();
                if room.is_empty() {
                    return;
                }
                let Ok(permit) = self.places.clone().try_acquire_owned() else { return };
                let next = room.take().map(|(client, w)| (permit, client, w));
                self.flow.waiting(&room);
                next
            };
            let Some((permit, client, arrival)) = next else { return };
            self.spawn(arrival, permit, client);
        }
    }
}

/// What another door (HTTP) holds of the service: its way onto the one question path.
#[derive(Clone)]
pub struct Doorway {
    handler: Arc<Handler>,
    reporter: Arc<Reporter>,
}

impl Doorway {
    /// Answers `request` (`bytes` as it came) for `client` on the one path: through the queue's
    /// places (the client's share), the waiting room in clients' turns, the memory budget, the
    /// engine and the decision step, as an MQTT question.
    pub async fn ask(
        &self,
        request: laya_topics::Request,
        client: String,
        bytes: usize,
    ) -> Result<laya_topics::wire::Reply, Refused> {
        if self.handler.flow.stopping() {
            return Err(Refused::Busy);
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let client = ClientKey::Named(client);
        self.handler.arrived(Arrival::Asked(Box::new(Asked {
            request,
            client,
            bytes,
            received: Instant::now(),
            reply,
        })));
        // A sender dropped unanswered: the agent stopped with the request still waiting.
        answer.await.unwrap_or(Err(Refused::Busy))
    }

    /// The Prometheus side of the service's facts, which the HTTP door serves.
    pub fn metrics(&self) -> Arc<crate::metrics::Metrics> {
        self.reporter.counters.metrics.clone()
    }

    /// What the status document says, for a door's own health report.
    pub fn reporter(&self) -> &Reporter {
        &self.reporter
    }

    /// The memory budget's share for decoding a request body of `bytes` (JSON), taken in turn
    /// with every question's; the door gives it back before it asks.
    pub async fn decoding(&self, bytes: usize) -> flow::Share {
        self.handler.questions.budget.take(flow::preparing_cost(laya_topics::wire::Encoding::Json, bytes)).await
    }

    /// The serving bundle's directory, read alone (not the engine's whole status).
    pub fn served_from(&self) -> String {
        self.reporter.current.get().bundle.dir.display().to_string()
    }
}

/// A question as it came through a door, until it has its place (then in the waiting room).
enum Arrival {
    /// An MQTT publish: admission decides on it once it has its place.
    Mqtt { p: Box<Publish>, received: Instant },
    /// A request another door admitted (HTTP), boxed like the publish: the room holds many.
    Asked(Box<Asked>),
}

impl Arrival {
    /// What the waiting room reckons it at, besides its publish or request overhead.
    fn bytes(&self) -> usize {
        match self {
            Arrival::Mqtt { p, .. } => p.payload.len(),
            Arrival::Asked(a) => a.bytes,
        }
    }
}

/// Runs the service until `shutdown` resolves, then stops taking questions, finishes those in
/// flight, publishes `offline` and disconnects. Each [`Reload`] from `reloads` is started beside
/// the serving engine and replaces it once its health call passes. `doors` opens the other
/// front doors (HTTP) on the one question path, once it exists ([`Doorway`]); with no
/// `mqtt.broker` they are the only ones.
pub async fn run(
    config: Config,
    engine: Engine,
    bundle: Arc<HostBundle>,
    shutdown: impl Future,
    mut reloads: mpsc::UnboundedReceiver<Reload>,
    doors: impl FnOnce(Doorway),
) -> Result<(), ServeError> {
    let mqtt = !config.mqtt.broker.is_empty();
    let schema = Schema::new(&config.mqtt.prefix)?;
    let device = config.device();
    let topic = |c| schema.topic(&device, c).map(|t| t.to_string());
    let (status_topic, ask_topic, errors_topic) =
        (topic(Channel::Status)?, topic(Channel::Ask)?, topic(Channel::Errors)?);
    let topics = outbox::Topics {
        status: status_topic.clone(),
        events: topic(Channel::Events)?,
        telemetry: topic(Channel::Telemetry)?,
    };
    let fleet_filter = match config.mqtt.fleet.as_str() {
        "" => None,
        fleet => Some(schema.fleet_subscription(&config.mqtt.share_group, fleet)?),
    };
    let (started, birth) = (Instant::now(), Birth::now(&config.mqtt.fleet));
    let interval = Arc::new(Mutex::new(Interval::new(started, engine.busy_time())));
    let serving = Serving::new(bundle, engine, config.engine.backend.name());
    let will = telemetry::status(false, &serving.served(), &birth, None, 0);
    // Without a broker (HTTP alone) the client is never connected: nothing is sent on it.
    let options = match mqtt {
        true => connection::options(&config, &status_topic, Encoding::Json.encode(&will.to_value()))?,
        false => rumqttc::v5::MqttOptions::new(config.client_id(), "localhost", 1883),
    };
    let (client, eventloop) = AsyncClient::new(options, 256);
    let (current, counters) = (Arc::new(Current::new(serving)), Arc::new(Counters::default()));
    let flow = Arc::new(Flow::new(config.limits.queue));
    let telemetry_encoding = config.mqtt.telemetry_encoding.encoding();
    let reporter = Arc::new(Reporter {
        current: current.clone(),
        counters: counters.clone(),
        interval: interval.clone(),
        flow: flow.clone(),
        birth,
        device: device.clone(),
        started,
        encoding: telemetry_encoding,
        last_reload: Mutex::new(None),
    });
    // The thread's own work on questions, in clients' turns; it runs as long as the runtime.
    let workshop = Arc::new(workshop::Workshop::default());
    tokio::spawn(workshop.clone().serve());
    let handler = Arc::new(Handler {
        questions: Questions {
            admission: Admission::new(schema.clone(), device.clone(), &config),
            current: current.clone(),
            replies: Mutex::new(ReplyCache::bounded(config.limits.remember_replies, config.limits.remember_bytes)),
            in_flight: Default::default(),
            retained: Default::default(),
            budget: flow::Budget::new(config.limits.decoded_bytes),
            device: device.clone(),
            errors_to: ReplyTo { topic: errors_topic, correlation: None, encoding: Encoding::Json },
            counters: counters.clone(),
            interval: interval.clone(),
            workshop: workshop.clone(),
        },
        gate: Gate::new(client.clone(), counters.clone(), flow.clone()),
        places: Arc::new(Semaphore::new(config.limits.queue)),
        flow: flow.clone(),
        room: Mutex::new(Room::new(config.limits.waiting_bytes, config.limits.queue)),
    });

    // What the loop publishes for itself goes through the outbox: the loop never waits on the
    // client (whose connection task may be waiting for the loop).
    let outbox = Arc::new(Outbox::default());
    if mqtt {
        tokio::spawn({
            let (outbox, client) = (outbox.clone(), client.clone());
            async move { outbox.run(client, topics).await }
        });
    }
    // Serving from a model store: the pid, what is served and each reload's outcome go into it
    // too, for `laya-edge model install` (crate::store).
    let mark = config.model.store().and_then(|dir| match crate::store::Store::create(dir) {
        Ok(store) => Some(crate::store::AgentMark::claim(store)),
        Err(e) => {
            tracing::warn!(error = %e, "the model store cannot be marked as served by this agent");
            None
        }
    });
    if let Some(m) = &mark {
        m.serving(&current.get().bundle.dir);
    }
    // The loop and the connection task watch each other from a thread (`liveness`).
    let alive = Arc::new(Liveness::new(Instant::now()));
    let connect_timeout = Duration::from_secs(5);
    let link = link::Link::new(
        Duration::from_secs(config.mqtt.keep_alive_s.max(5)),
        Duration::from_millis(config.mqtt.reconnect_min_ms.max(1)),
        Duration::from_millis(config.mqtt.reconnect_max_ms.max(1)),
        link::process_jitter(Duration::from_millis(250)),
        Instant::now(),
    );
    let notifier = Notifier::from_env();
    let stall_bound = Duration::from_secs(config.limits.loop_stall_s);
    let link_turn = link.longest_turn(connect_timeout);
    if config.limits.loop_stall_s > 0 {
        let bounds = liveness::Bounds { service_loop: stall_bound, link: stall_bound + link_turn };
        if let Err(e) = liveness::watch(alive.clone(), bounds, Duration::from_secs(1), liveness::exit_on_stall) {
            tracing::warn!(error = %e, "cannot start the liveness watch");
        }
    }
    // HTTP alone: no connection task, so the loop beats for it too (below), and no message
    // ever comes from a broker.
    let (_no_broker, poller, net_rx) = match mqtt {
        true => {
            let (poller, net_rx) = poller::spawn(eventloop, link, alive.clone(), connect_timeout);
            (None, Some(poller), net_rx)
        }
        false => {
            drop(eventloop);
            let (tx, rx) = mpsc::unbounded_channel();
            (Some(tx), None, rx)
        }
    };
    doors(Doorway { handler: handler.clone(), reporter: reporter.clone() });
    if !mqtt {
        tracing::info!("no mqtt.broker: serving through the HTTP door alone");
        notifier.ready(&format!("serving as {device} (HTTP alone)"));
    }
    let mut telemetry = tokio::time::interval(Duration::from_secs(config.mqtt.telemetry_interval_s.max(1)));
    telemetry.tick().await;
    let mut heartbeat = tokio::time::interval(Duration::from_secs(1));
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watchdog = tokio::time::interval(notifier.watchdog_interval().unwrap_or(Duration::from_secs(3600)));
    let mut engine_watch = EngineWatch::of(&current.get().engine);
    // Reloads as transactions: at most one candidate, health-checked beside the serving engine.
    let (verdict_tx, mut verdicts) = mpsc::unbounded_channel();
    let mut service = Service {
        transactions: Reloads::new(verdict_tx),
        config,
        mqtt,
        device,
        ask_topic,
        fleet_filter,
        current,
        handler,
        flow,
        counters,
        interval,
        reporter,
        outbox,
        mark,
        notifier,
        alive,
        stall_bound,
        link_turn,
        ready: !mqtt,
        connected: false,
    };
    let mut net_rx = net_rx;
    tokio::pin!(shutdown);
    loop {
        service.beat();
        tokio::select! {
            _ = &mut shutdown => break,
            msg = net_rx.recv() => if service.on_net(msg).is_break() {
                break;
            },
            _ = heartbeat.tick() => service.on_heartbeat(),
            _ = watchdog.tick() => service.on_watchdog(),
            notice = engine_watch.notices.recv() => service.on_notice(notice),
            run = engine_watch.probe_runs.recv() => service.on_probe_run(run),
            Ok(()) = engine_watch.backend_state.changed() => service.on_backend_state(),
            Some(reload) = reloads.recv() => service.on_reload(reload),
            Some(verdict) = verdicts.recv() => if let Some(watch) = service.on_verdict(verdict) {
                engine_watch = watch;
            },
            _ = telemetry.tick(), if service.config.mqtt.telemetry_interval_s > 0 => service.on_telemetry(),
        }
    }
    service.stop(net_rx, poller, client, status_topic).await;
    Ok(())
}

/// The engine's streams the loop listens to: the serving engine's, replaced when a reload takes
/// over.
struct EngineWatch {
    notices: tokio::sync::broadcast::Receiver<crate::engine::Notice>,
    probe_runs: tokio::sync::broadcast::Receiver<crate::engine::ProbeRun>,
    backend_state: tokio::sync::watch::Receiver<crate::engine::BackendState>,
}

impl EngineWatch {
    fn of(engine: &Engine) -> EngineWatch {
        EngineWatch {
            notices: engine.notices(),
            probe_runs: engine.probe_runs(),
            backend_state: engine.backend_state(),
        }
    }
}

/// What the service loop owns between its turns: one method per arm of its `select!` ([`run`]
/// is the wiring), each acting on this state and queueing what it publishes in the outbox.
struct Service {
    config: Config,
    /// Whether there is a broker (`mqtt.broker` set); without, the HTTP door alone.
    mqtt: bool,
    device: String,
    ask_topic: String,
    fleet_filter: Option<String>,
    current: Arc<Current>,
    handler: Arc<Handler>,
    flow: Arc<Flow>,
    counters: Arc<Counters>,
    interval: Arc<Mutex<Interval>>,
    reporter: Arc<Reporter>,
    outbox: Arc<Outbox>,
    /// Serving from a model store: the pid, what is served and each reload's outcome go into it
    /// too, for `laya-edge model install` (crate::store).
    mark: Option<crate::store::AgentMark>,
    notifier: Notifier,
    alive: Arc<Liveness>,
    stall_bound: Duration,
    link_turn: Duration,
    transactions: Reloads,
    /// Whether systemd was told READY.
    ready: bool,
    /// Whether the broker connection is up now (the shutdown says goodbye only over one).
    connected: bool,
}

impl Service {
    /// One turn of the loop: the loop beats (and, with no broker, for the connection task too).
    fn beat(&self) {
        self.alive.beat(Part::Loop);
        if !self.mqtt {
            self.alive.beat(Part::Link);
        }
    }

    fn publish_event(&self, event: &EngineEvent) {
        self.outbox.push(Item::Event(Encoding::Json.encode(&event.to_value())));
    }

    fn publish_status(&self) {
        self.outbox.push(Item::Status(self.reporter.status(true)));
    }

    /// A settled reload: its event naming what serves now, the store's record, and the status,
    /// which names it.
    fn reload_outcome(&self, event: &EngineEvent) {
        let event = &EngineEvent { serving: Some(self.reporter.served_model()), ..event.clone() };
        self.publish_event(event);
        if let Some(m) = &self.mark {
            m.reload_outcome(&event.to_value());
        }
        self.reporter.reload_settled(event);
        self.publish_status();
    }

    /// What the connection task says; `Break` when it has closed.
    fn on_net(&mut self, msg: Option<Net>) -> std::ops::ControlFlow<()> {
        match msg {
            Some(Net::Connected { session_present, keep_alive }) => {
                self.connected = true;
                let keep_alive_s = keep_alive.as_secs();
                tracing::info!(broker = %self.config.mqtt.broker, session_present, keep_alive_s, "connected to the broker");
                if !session_present {
                    self.handler.questions.new_session();
                    self.outbox.push(Item::Subscribe(self.ask_topic.clone()));
                    if let Some(f) = &self.fleet_filter {
                        self.outbox.push(Item::Subscribe(f.clone()));
                    }
                }
                self.publish_status();
                if !self.ready {
                    self.ready = true;
                    // READY once connected with the engine supervised; a failing backend does
                    // not hold it back (the status says `backend_state`).
                    self.notifier.ready(&format!("serving as {}", self.device));
                }
            }
            Some(Net::TakenOver { named }) => {
                self.publish_event(&takeover_event(named, self.counters.taken_over(), &self.config.client_id()));
                self.publish_status();
            }
            // Not acknowledged while stopping: the broker delivers it again later.
            Some(Net::Question(p)) if !self.flow.stopping() => {
                self.handler.arrived(Arrival::Mqtt { p, received: Instant::now() })
            }
            Some(Net::Question(_)) => {}
            Some(Net::Lost) => self.connected = false,
            Some(Net::Closed) | None => return std::ops::ControlFlow::Break(()),
        }
        std::ops::ControlFlow::Continue(())
    }

    /// After a burst, once nothing is in progress: freed heap back to the kernel.
    fn on_heartbeat(&self) {
        self.reporter.refresh_metrics();
        if self.flow.trim_now(self.handler.places.available_permits()) {
            crate::platform::heap::release_freed();
        }
    }

    /// Pings only while the connection task beats too: a stalled one stops them, and systemd
    /// restarts the service.
    fn on_watchdog(&self) {
        if self.alive.fresh(Instant::now(), self.stall_bound.max(Duration::from_secs(1)) + self.link_turn) {
            self.notifier.watchdog();
        } else {
            tracing::error!("the broker connection task stopped making progress: no systemd watchdog ping");
        }
    }

    /// Backend events go out when they happen.
    fn on_notice(&self, notice: Result<crate::engine::Notice, RecvError>) {
        match notice {
            Ok(n) => {
                match n.kind {
                    crate::engine::NoticeKind::WorkerRestart => self.counters.metrics.worker_restarted(),
                    crate::engine::NoticeKind::BackendDegraded => self.counters.fell_back(&n.message),
                    _ => {}
                }
                notice_events(&n).for_each(|e| self.publish_event(&e))
            }
            Err(RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "backend events were not published (too many at once)")
            }
            Err(RecvError::Closed) => {}
        }
    }

    /// A failed probe is an event of its own, with the figures (a passed one is in telemetry).
    fn on_probe_run(&self, run: Result<crate::engine::ProbeRun, RecvError>) {
        if let Ok(run) = &run {
            self.counters.metrics.probe(run.passed());
        }
        match run {
            Ok(run) if !run.passed() => self.publish_event(&probe_event(&run)),
            Ok(_) | Err(RecvError::Closed) => {}
            Err(RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "probe results were not published (too many at once)")
            }
        }
    }

    /// The retained status follows the backend.
    fn on_backend_state(&self) {
        self.publish_status();
    }

    /// A reload request (SIGHUP): a transaction begins, superseding a pending one.
    fn on_reload(&mut self, reload: Reload) {
        for event in self.transactions.request(reload, &self.config) {
            self.reload_outcome(&event);
        }
    }

    /// A candidate's verdict: it takes over ([`reload::take_over`]), or is rejected (dropping it
    /// stopped its worker; the serving engine never paused), or it was superseded. The new
    /// engine's streams when it took over.
    fn on_verdict(&mut self, verdict: reload::Verdict) -> Option<EngineWatch> {
        match self.transactions.settle(verdict) {
            Settled::TakeOver(request, taken) => {
                let (event, config) = reload::take_over(&self.current, request, taken, &self.interval);
                let serving = self.current.get();
                if let Some(m) = &self.mark {
                    m.serving(&serving.bundle.dir);
                }
                self.config = config;
                let watch = EngineWatch::of(&serving.engine);
                self.reload_outcome(&event);
                Some(watch)
            }
            Settled::Rejected(event) => {
                self.reload_outcome(&event);
                None
            }
            Settled::Stale => None,
        }
    }

    fn on_telemetry(&self) {
        self.outbox.push(Item::Telemetry(self.reporter.telemetry(), self.reporter.telemetry_properties()));
        self.notifier.status(&self.reporter.systemd_status());
    }

    /// Stops taking questions, lets those in flight finish, says goodbye. Every wait here has its
    /// own bound, so the liveness watch ends first.
    async fn stop(
        self,
        mut net_rx: mpsc::UnboundedReceiver<Net>,
        poller: Option<tokio::task::JoinHandle<()>>,
        client: AsyncClient,
        status_topic: String,
    ) {
        let Service { config, handler, flow, outbox, reporter, notifier, alive, connected, mqtt, .. } = self;
        alive.stop();
        notifier.stopping();
        let in_progress = config.limits.queue.saturating_sub(handler.places.available_permits());
        tracing::info!(in_progress, connected, "stopping");
        let outbox_done = outbox.close();
        flow.stop();
        // What waits for a place gets no place now: another door's requests are refused busy;
        // MQTT questions are left unacknowledged (the broker delivers them again later).
        handler.close_room();
        // Questions still arriving are left unacknowledged; the poller must never wait for room.
        tokio::spawn(async move { while net_rx.recv().await.is_some() {} });
        let grace = Duration::from_secs(config.mqtt.shutdown_grace_s);
        let all = u32::try_from(config.limits.queue).unwrap_or(u32::MAX);
        if tokio::time::timeout(grace, handler.places.acquire_many(all)).await.is_err() {
            let left = config.limits.queue - handler.places.available_permits();
            tracing::warn!(left, "questions still in progress at shutdown: left for the broker to deliver again");
        }
        // From here no reply and no acknowledgement is sent: whatever is still in progress is
        // neither answered nor acknowledged.
        if !handler.gate.close(Duration::from_secs(5)).await {
            tracing::warn!("a reply was still being handed to the client at shutdown");
        }
        if !connected {
            if mqtt {
                // Nothing can be sent: the broker's Last Will says `offline` for us.
                tracing::info!("not connected to the broker: stopped without a goodbye (the Last Will says offline)");
            }
            if let Some(poller) = poller {
                poller.abort();
            }
            return;
        }
        // What the outbox was sending goes before `offline`.
        let _ = tokio::time::timeout(Duration::from_secs(5), outbox_done).await;
        // `offline`, then DISCONNECT with reason 0 (normal): the broker discards the Last Will.
        let _ = client.publish(status_topic, QoS::AtLeastOnce, true, reporter.status(false)).await;
        let _ = client.disconnect().await;
        if let Some(poller) = poller {
            let _ = tokio::time::timeout(Duration::from_secs(5), poller).await;
        }
    }
}
