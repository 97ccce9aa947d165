//! `laya-edge serve`: questions in over MQTT, typed decisions out.
//!
//! The service runs on a single-threaded runtime, so no task may block it for long. [`run`]
//! wires the parts and runs ONE `select!` loop whose arms call into them; each task gets only
//! the state it needs (mini-redis's Listener/Handler split):
//!
//! - `poller` polls rumqttc's event loop and does nothing else; `link` decides when the
//!   connection is lost and how long to wait (pure); `connection` builds the broker options.
//! - `flow` decides where an arriving question goes: a place in `limits.queue`, the waiting room
//!   (clients in turn, the heaviest giving way when it is full), or a refusal (pure); [`Handler`]
//!   runs each admitted question in its own task.
//! - `question` is one question's path (admission, redelivery, the answer via `pipeline`), and
//!   `delivery` the gate that publishes its reply and acknowledges it, together or not at all;
//!   `admission` decides what to do with a message (pure).
//! - `telemetry` builds the status and telemetry documents; `events` maps the engine's notices
//!   to events (pure); `outbox` queues what the loop publishes for itself; `liveness` watches
//!   the loop and the connection task.
//! - `reload` holds what answers questions and replaces it on SIGHUP.
//!
//! On shutdown, questions in progress get `mqtt.shutdown_grace_s` to finish; then the delivery
//! gate closes and the agent publishes `offline` and disconnects.

pub mod admission;
pub mod connection;
pub mod delivery;
#[cfg(feature = "demo")]
pub mod demo;
pub mod events;
pub mod flow;
pub mod latency;
pub mod link;
pub mod liveness;
pub mod outbox;
pub mod poller;
pub mod question;
pub mod reload;
pub mod report;
pub mod telemetry;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rumqttc::v5::AsyncClient;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Publish;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use laya_topics::topic::{Channel, Schema};
use laya_topics::wire::{Encoding, EngineEvent, EventKind};

pub use flow::INLINE_TOKENIZE_BYTES;
pub use reload::{Reload, Serving};

use admission::{Admission, ReplyCache, ReplyTo};
use delivery::Gate;
use events::{notice_events, probe_event, reload_event, takeover_event};
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
    room: Mutex<Room<Waiting>>,
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
    fn room(&self) -> std::sync::MutexGuard<'_, Room<Waiting>> {
        self.room.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Handles a question that has its place, in a task of its own.
    fn spawn(self: &Arc<Self>, p: Box<Publish>, received: Instant, permit: OwnedSemaphorePermit, client: ClientKey) {
        let asker = self.flow.asker(&client);
        let seat = Seat { permit: Some(permit), client, handler: self.clone() };
        let h = self.clone();
        tokio::spawn(async move {
            let out = h.questions.handle(&p, received, asker).await;
            h.gate.deliver(&p, out, Some(seat)).await;
        });
    }

    /// A question that arrived: it takes a free place if its client is below its share, else
    /// waits in the room, else is refused.
    fn arrived(self: &Arc<Self>, p: Box<Publish>, received: Instant) {
        let client = self.questions.admission.client_of(&question::incoming(&p));
        let entered = {
            let mut room = self.room();
            // A free place means nothing that may take one waits ([`Handler::dispatch`]).
            if let Ok(permit) = self.places.clone().try_acquire_owned()
                && room.seat(&client)
            {
                drop(room);
                return self.spawn(p, received, permit, client);
            }
            // The question waits, unacknowledged, for a place in its client's turn; its
            // deadline runs from its arrival.
            let entered = room.enter(client, flow::waiting_charge(p.payload.len()), Waiting { p, received });
            self.flow.waiting(&room);
            entered
        };
        match entered {
            Entered::Waits(gave_way) => gave_way.into_iter().for_each(|w| self.refuse(w.p, Full::GaveWay)),
            Entered::Refused(w) => self.refuse(w.p, Full::Queue),
        }
    }

    /// A question not taken (or not kept): a retryable error, then the ack (not redelivered for
    /// ever). The refusal is made now and the question's payload let go: what waits to be sent
    /// is the small refusal only.
    fn refuse(self: &Arc<Self>, p: Box<Publish>, why: Full) {
        let out = self.questions.when_full(&p, why);
        let ack = delivery::ack_only(&p);
        drop(p);
        let h = self.clone();
        tokio::spawn(async move { h.gate.deliver(&ack, Some(out), None::<Seat>).await });
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
            let Some((permit, client, Waiting { p, received })) = next else { return };
            self.spawn(p, received, permit, client);
        }
    }
}

/// A question in the waiting room.
struct Waiting {
    p: Box<Publish>,
    received: Instant,
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
    let (client, eventloop) =
        AsyncClient::new(connection::options(&config, &status_topic, Encoding::Json.encode(&will.to_value()))?, 256);
    let (current, counters) = (Arc::new(Current::new(serving)), Arc::new(Counters::default()));
    let flow = Arc::new(Flow::new(config.limits.queue));
    let telemetry_encoding = config.mqtt.telemetry_encoding.encoding();
    let reporter = Reporter {
        current: current.clone(),
        counters: counters.clone(),
        interval: interval.clone(),
        flow: flow.clone(),
        birth,
        device: device.clone(),
        started,
        encoding: telemetry_encoding,
        last_reload: Mutex::new(None),
    };
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
        },
        gate: Gate::new(client.clone(), counters.clone(), flow.clone()),
        places: Arc::new(Semaphore::new(config.limits.queue)),
        flow: flow.clone(),
        room: Mutex::new(Room::new(config.limits.waiting_bytes, config.limits.queue)),
    });

    // What the loop publishes for itself goes through the outbox: the loop never waits on the
    // client (whose connection task may be waiting for the loop).
    let outbox = Arc::new(Outbox::default());
    tokio::spawn({
        let (outbox, client) = (outbox.clone(), client.clone());
        async move { outbox.run(client, topics).await }
    });
    let publish_event = |event: &EngineEvent| outbox.push(Item::Event(Encoding::Json.encode(&event.to_value())));
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
    // A settled reload: its event naming what serves now, the store's record, and the status,
    // which names it.
    let reload_outcome = |event: &EngineEvent| {
        let event = &EngineEvent { serving: Some(reporter.served_model()), ..event.clone() };
        publish_event(event);
        if let Some(m) = &mark {
            m.reload_outcome(&event.to_value());
        }
        reporter.reload_settled(event);
        outbox.push(Item::Status(reporter.status(true)));
    };

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
    let stall_bound = Duration::from_secs(config.limits.loop_stall_s);
    let link_turn = link.longest_turn(connect_timeout);
    if config.limits.loop_stall_s > 0 {
        let bounds = liveness::Bounds { service_loop: stall_bound, link: stall_bound + link_turn };
        if let Err(e) = liveness::watch(alive.clone(), bounds, Duration::from_secs(1), liveness::exit_on_stall) {
            tracing::warn!(error = %e, "cannot start the liveness watch");
        }
    }
    let (poller, mut net_rx) = poller::spawn(eventloop, link, alive.clone(), connect_timeout);

    let notifier = Notifier::from_env();
    let mut watchdog = tokio::time::interval(notifier.watchdog_interval().unwrap_or(Duration::from_secs(3600)));
    let mut telemetry = tokio::time::interval(Duration::from_secs(config.mqtt.telemetry_interval_s.max(1)));
    telemetry.tick().await;
    let mut heartbeat = tokio::time::interval(Duration::from_secs(1));
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ready = false;
    let (mut notices, mut probe_runs, mut backend_state) = {
        let engine = &current.get().engine;
        (engine.notices(), engine.probe_runs(), engine.backend_state())
    };
    // Reloads as transactions: at most one candidate, health-checked beside the serving engine.
    let (verdict_tx, mut verdicts) = mpsc::unbounded_channel();
    let mut transactions = Reloads::new(verdict_tx);
    tokio::pin!(shutdown);
    // Whether the broker connection is up now (the shutdown says goodbye only over one).
    let mut connected = false;
    loop {
        alive.beat(Part::Loop);
        tokio::select! {
            _ = &mut shutdown => break,
            msg = net_rx.recv() => match msg {
                Some(Net::Connected { session_present, keep_alive }) => {
                    connected = true;
                    let keep_alive_s = keep_alive.as_secs();
                    tracing::info!(broker = %config.mqtt.broker, session_present, keep_alive_s, "connected to the broker");
                    if !session_present {
                        handler.questions.new_session();
                        outbox.push(Item::Subscribe(ask_topic.clone()));
                        if let Some(f) = &fleet_filter {
                            outbox.push(Item::Subscribe(f.clone()));
                        }
                    }
                    outbox.push(Item::Status(reporter.status(true)));
                    if !ready {
                        ready = true;
                        // READY once connected with the engine supervised; a failing backend does
                        // not hold it back (the status says `backend_state`).
                        notifier.ready(&format!("serving as {device}"));
                    }
                }
                Some(Net::TakenOver { named }) => {
                    publish_event(&takeover_event(named, counters.taken_over(), &config.client_id()));
                    outbox.push(Item::Status(reporter.status(true)));
                }
                // Not acknowledged while stopping: the broker delivers it again later.
                Some(Net::Question(p)) if !flow.stopping() => handler.arrived(p, Instant::now()),
                Some(Net::Question(_)) => {}
                Some(Net::Lost) => connected = false,
                Some(Net::Closed) | None => break,
            },
            // After a burst, once nothing is in progress: freed heap back to the kernel.
            _ = heartbeat.tick() => if flow.trim_now(handler.places.available_permits()) {
                crate::platform::heap::release_freed();
            },
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
                Ok(n) => notice_events(&n).for_each(|e| publish_event(&e)),
                Err(RecvError::Lagged(missed)) => tracing::warn!(missed, "backend events were not published (too many at once)"),
                Err(RecvError::Closed) => {}
            },
            // A failed probe is an event of its own, with the figures (a passed one is in telemetry).
            run = probe_runs.recv() => match run {
                Ok(run) if !run.passed() => publish_event(&probe_event(&run)),
                Ok(_) | Err(RecvError::Closed) => {}
                Err(RecvError::Lagged(missed)) => tracing::warn!(missed, "probe results were not published (too many at once)"),
            },
            Ok(()) = backend_state.changed() => outbox.push(Item::Status(reporter.status(true))),
            Some(reload) = reloads.recv() => transactions.request(reload, &config).iter().for_each(&reload_outcome),
            Some(verdict) = verdicts.recv() => match transactions.settle(verdict) {
                Settled::TakeOver(request, taken) => {
                    let candidate = taken.serving;
                    let message = format!(
                        "now serving {} on the {} backend (the new engine passed its health call)",
                        candidate.bundle.dir.display(),
                        candidate.backend
                    );
                    tracing::info!(%message, "reload: taking over");
                    notices = candidate.engine.notices();
                    probe_runs = candidate.engine.probe_runs();
                    backend_state = candidate.engine.backend_state();
                    if let Ok(mut i) = interval.lock() {
                        i.engine_changed(candidate.engine.busy_time());
                    }
                    if let Some(m) = &mark {
                        m.serving(&candidate.bundle.dir);
                    }
                    current.replace(candidate);
                    config = *taken.config;
                    let _ = taken.taken.send(());
                    reload_outcome(&reload_event(EventKind::Reloaded, request, message));
                }
                // Dropping the candidate stopped its worker; the serving engine never paused.
                Settled::Rejected(event) => reload_outcome(&event),
                Settled::Stale => {}
            },
            _ = telemetry.tick(), if config.mqtt.telemetry_interval_s > 0 => {
                outbox.push(Item::Telemetry(reporter.telemetry(), reporter.telemetry_properties()));
                notifier.status(&reporter.systemd_status());
            }
        }
    }

    // Stop taking questions, let those in flight finish, say goodbye. Every wait below has its
    // own bound, so the liveness watch ends here.
    alive.stop();
    notifier.stopping();
    let in_progress = config.limits.queue.saturating_sub(handler.places.available_permits());
    tracing::info!(in_progress, connected, "stopping");
    let outbox_done = outbox.close();
    flow.stop();
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
        // Nothing can be sent: the broker's Last Will says `offline` for us.
        tracing::info!("not connected to the broker: stopped without a goodbye (the Last Will says offline)");
        poller.abort();
        return Ok(());
    }
    // What the outbox was sending goes before `offline`.
    let _ = tokio::time::timeout(Duration::from_secs(5), outbox_done).await;
    // `offline`, then DISCONNECT with reason 0 (normal): the broker discards the Last Will.
    let _ = client.publish(status_topic, QoS::AtLeastOnce, true, reporter.status(false)).await;
    let _ = client.disconnect().await;
    let _ = tokio::time::timeout(Duration::from_secs(5), poller).await;
    Ok(())
}
