//! Flow control, without I/O: where an arriving question goes, and what is sent when it cannot
//! be taken.
//!
//! A question takes one of `limits.queue` places. One arriving beyond them waits, unacknowledged,
//! in the waiting room ([`Room`]), as its raw payload, while the room has bytes left
//! (`limits.waiting_bytes`); past that it is refused `overloaded` (or whatever admission would
//! refuse it for anyway) and acknowledged, so it is not redelivered for ever. Before it is
//! decoded, a request also waits for its part of the memory [`Budget`] of decoded requests and
//! their rows (`limits.decoded_bytes`).
//!
//! Clients are served fairly (issue #40; admission's [`ClientKey`] tells them apart). A broker
//! delivers a session's questions in the order they came, and holds the rest once the agent has
//! its Receive Maximum unacknowledged: had the agent announced only `limits.queue`, a client with
//! thousands of questions outstanding would keep every other client's question at the broker,
//! behind its own, where no order can be changed (measured: 0.7 s for each question of another
//! client, BENCHMARKS.md). So the agent announces the most MQTT allows (`mqtt.receive_maximum`)
//! and the wait happens here, where it is fair: the waiting room hands each free place to its
//! clients in turn ([`Turns`]), the engine's call queue takes their calls in turn, and the
//! service thread's own work on them is done in turn (`workshop`). When the room is full, a
//! question of a client that holds less of it than another does not find it full: the newest
//! waiting question of the client holding the most gives way, refused `overloaded`
//! ([`Full::GaveWay`]; the room's fair share, as a fair-queueing router drops from its longest
//! queue). The flood's client alone is refused.
//!
//! The places themselves are a semaphore the service holds (its tasks wait on it), the budget
//! one of its own; this module decides, counts and is unit-tested without a broker.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use laya_topics::wire::{Encoding, ErrorCode, ErrorReply, Undeliverable};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use super::admission::ClientKey;
use super::admission::{Admission, Decision, Incoming, ReplyCache, ReplyTo};
use crate::engine::Asker;

/// JSON requests up to this size are tokenized on the runtime's thread (half a millisecond at
/// most on this machine: ~450 tokens); larger ones in the blocking pool. CBOR is denser than the
/// text it becomes (a 3-byte half float prints as up to 17 characters), so its limit is an
/// eighth of this.
pub const INLINE_TOKENIZE_BYTES: usize = 2048;

/// The largest request tokenized on the runtime's thread, by encoding (see
/// [`INLINE_TOKENIZE_BYTES`]).
pub fn inline_limit(encoding: Encoding) -> usize {
    match encoding {
        Encoding::Json => INLINE_TOKENIZE_BYTES,
        Encoding::Cbor => INLINE_TOKENIZE_BYTES / 8,
    }
}

/// Whether a request of `payload_len` bytes is prepared in the blocking pool rather than in
/// place.
pub fn prepared_aside(encoding: Encoding, payload_len: usize) -> bool {
    payload_len > inline_limit(encoding)
}

/// What decoding and laying out a request costs at most, per payload byte (its document, the
/// state's serialized text, the tokenizer's encoding of all of it before the cut to `max_len`,
/// and the allocator's rounding), by encoding: measured at the peak of the heap on the shapes
/// that cost the most (an object of many short keys, a list of small integers), with a margin
/// (BENCHMARKS.md, "The memory bound").
pub fn preparing_factor(encoding: Encoding) -> usize {
    match encoding {
        Encoding::Json => JSON_PREPARING_FACTOR,
        Encoding::Cbor => CBOR_PREPARING_FACTOR,
    }
}

const JSON_PREPARING_FACTOR: usize = 256;
const CBOR_PREPARING_FACTOR: usize = 320;

/// Bytes every request is reckoned at, however small: its document's and its rows' fixed costs.
pub const REQUEST_FLOOR_BYTES: usize = 64 << 10;

/// What a request of `payload_len` bytes is reckoned to cost while it is decoded and laid out.
pub fn preparing_cost(encoding: Encoding, payload_len: usize) -> usize {
    payload_len.saturating_mul(preparing_factor(encoding)).max(REQUEST_FLOOR_BYTES)
}

/// What a request's laid-out rows are reckoned to cost until it is answered: `tokens` token ids
/// and markers of `rows` rows (each a few vectors and a layout), and the request's floor.
pub fn rows_cost(rows: usize, tokens: usize) -> usize {
    tokens.saturating_mul(16).saturating_add(rows.saturating_mul(512)).max(REQUEST_FLOOR_BYTES)
}

/// The memory budget of requests being decoded and laid out and of their rows until answered
/// (`limits.decoded_bytes`), in KiB units of a fair semaphore: a request takes its
/// [`preparing_cost`] before it is decoded, waits in arrival order while the budget lacks it,
/// keeps only its [`rows_cost`] once laid out ([`Share::keep`]) and gives that back when
/// answered. A request reckoned at more than the whole budget takes the whole budget: it
/// proceeds alone, once every other has given its share back, rather than waiting for ever
/// (`limits.max_payload` bounds how large it can be).
#[derive(Debug)]
pub struct Budget {
    units: Arc<Semaphore>,
    total: u32,
}

/// A request's part of the [`Budget`]; given back when dropped.
#[derive(Debug)]
pub struct Share {
    permit: OwnedSemaphorePermit,
}

impl Budget {
    /// A budget of `bytes` (at least 1 KiB).
    pub fn new(bytes: usize) -> Budget {
        let total = u32::try_from((bytes / 1024).clamp(1, Semaphore::MAX_PERMITS)).unwrap_or(u32::MAX);
        Budget { units: Arc::new(Semaphore::new(total as usize)), total }
    }

    /// The units `bytes` take: at least one, at most the whole budget.
    fn units_for(&self, bytes: usize) -> u32 {
        u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX).clamp(1, self.total)
    }

    /// Takes `bytes` of the budget, waiting behind those who asked before while it lacks them.
    pub async fn take(&self, bytes: usize) -> Share {
        let units = self.units_for(bytes);
        match self.units.clone().acquire_many_owned(units).await {
            Ok(permit) => Share { permit },
            // The semaphore is never closed.
            Err(_) => unreachable!("the budget's semaphore is never closed"),
        }
    }

    /// Takes `bytes` of the budget if it has them now and no one waits before.
    pub fn try_take(&self, bytes: usize) -> Option<Share> {
        self.units.clone().try_acquire_many_owned(self.units_for(bytes)).ok().map(|permit| Share { permit })
    }

    /// Bytes of the budget free now.
    pub fn free(&self) -> usize {
        self.units.available_permits() * 1024
    }
}

impl Share {
    /// Keeps `bytes` of this share (never more than it has) and gives the rest back.
    pub fn keep(&mut self, bytes: usize) {
        let keep = bytes.div_ceil(1024).max(1);
        let surplus = self.permit.num_permits().saturating_sub(keep);
        if surplus > 0 {
            drop(self.permit.split(surplus));
        }
    }

    /// Bytes this share holds.
    pub fn bytes(&self) -> usize {
        self.permit.num_permits() * 1024
    }
}

/// Why a question was not taken, or not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The places and the waiting room are full, and no other client holds more of the room.
    Queue,
    /// It was waiting, and gave way to another client's question ([`Room::enter`]).
    GaveWay,
}

/// Bytes a waiting question is reckoned at beyond its payload: its publish, topic and properties.
/// At least this much each, a full room of `limits.waiting_bytes` holds fewer questions than the
/// Receive Maximum lets the broker send, so questions keep arriving (and others' keep getting in)
/// while a flood fills the room.
pub const WAITING_OVERHEAD_BYTES: usize = 512;

/// What a waiting question of `payload_len` bytes takes of the room.
pub fn waiting_charge(payload_len: usize) -> usize {
    payload_len.saturating_add(WAITING_OVERHEAD_BYTES)
}

/// What [`Room::enter`] did with a question.
#[derive(Debug, PartialEq, Eq)]
pub enum Entered<T> {
    /// It waits; these questions (of the client that held the most of the room) gave way to it,
    /// newest first, and are to be refused ([`Full::GaveWay`]).
    Waits(Vec<T>),
    /// It does not fit: refuse it ([`Full::Queue`]).
    Refused(T),
}

/// The waiting room: questions waiting for a place, by client, served in turn ([`Turns`]),
/// bounded in bytes ([`waiting_charge`]). A question that does not fit makes room when another
/// client holds more of the room than its own client would with it: that client's newest
/// questions give way, until it fits or that client no longer holds more. So a client alone may
/// fill the room, and as others arrive it is cut back towards an equal share; a client never
/// makes another give way by holding more itself.
///
/// The room also counts the places each client holds: at most half the queue ([`place_share`]),
/// so that one client's questions never fill the engine's queue by themselves (with merged
/// batches, the flood's next batch would always be ready before another client's call could
/// join it). A client at its share waits, in the room, while places stay free for others.
#[derive(Debug)]
pub struct Room<T> {
    limit: usize,
    bytes: usize,
    turns: Turns<(T, usize)>,
    /// Bytes each client has waiting (clients with none are not kept).
    by_client: HashMap<ClientKey, usize>,
    /// The most places one client may hold.
    share: usize,
    /// Places each client holds (clients with none are not kept).
    placed: HashMap<ClientKey, usize>,
}

/// The most places of `queue` one client may hold: half (at least one).
pub fn place_share(queue: usize) -> usize {
    queue.div_ceil(2).max(1)
}

impl<T> Room<T> {
    /// An empty room of `limit` bytes, in front of `queue` places.
    pub fn new(limit: usize, queue: usize) -> Room<T> {
        Room {
            limit,
            bytes: 0,
            turns: Turns::default(),
            by_client: HashMap::new(),
            share: place_share(queue),
            placed: HashMap::new(),
        }
    }

    /// Whether `client` may take a place now (it holds less than its share); if so, it is
    /// counted as holding one more.
    pub fn seat(&mut self, client: &ClientKey) -> bool {
        let placed = self.placed.entry(client.clone()).or_default();
        let may = *placed < self.share;
        if may {
            *placed += 1;
        } else if *placed == 0 {
            self.placed.remove(client);
        }
        may
    }

    /// `client` gave a place back.
    pub fn unseat(&mut self, client: &ClientKey) {
        if let Some(n) = self.placed.get_mut(client) {
            *n -= 1;
            if *n == 0 {
                self.placed.remove(client);
            }
        }
    }

    /// Places `client` holds.
    pub fn seated(&self, client: &ClientKey) -> usize {
        self.placed.get(client).copied().unwrap_or(0)
    }

    /// `item` of `client`, reckoned at `charge` bytes, waits if it fits (module and type docs).
    pub fn enter(&mut self, client: ClientKey, charge: usize, item: T) -> Entered<T> {
        if charge > self.limit {
            return Entered::Refused(item);
        }
        let mine = self.by_client.get(&client).copied().unwrap_or(0).saturating_add(charge);
        // Which questions would give way, decided before any does: all of them, or none.
        let mut taken: HashMap<&ClientKey, (usize, usize)> = HashMap::new(); // bytes, how many
        let mut plan = Vec::new();
        let mut freed = 0;
        while (self.bytes - freed).saturating_add(charge) > self.limit {
            let heaviest = self
                .by_client
                .iter()
                .filter(|(c, _)| **c != client)
                .map(|(c, held)| (c, held - taken.get(c).map_or(0, |t| t.0)))
                .filter(|(_, left)| *left > mine)
                // The most held; between equals, the first client by name (any rule would do, as
                // long as it is one).
                .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(a.0)));
            let Some((c, _)) = heaviest else { return Entered::Refused(item) };
            let t = taken.entry(c).or_default();
            let Some(&(_, bytes)) = self.turns.newest(c).nth(t.1) else { return Entered::Refused(item) };
            (t.0, t.1) = (t.0 + bytes, t.1 + 1);
            freed += bytes;
            plan.push(c.clone());
        }
        let mut gave_way = Vec::with_capacity(plan.len());
        for c in plan {
            if let Some((newest, bytes)) = self.turns.pop_newest(&c) {
                self.forget(&c, bytes);
                gave_way.push(newest);
            }
        }
        self.bytes += charge;
        *self.by_client.entry(client.clone()).or_default() += charge;
        self.turns.push(client, (item, charge));
        Entered::Waits(gave_way)
    }

    /// The next question whose client's turn it is, of the clients below their share of places;
    /// its bytes are free again, and its client holds one place more.
    pub fn take(&mut self) -> Option<(ClientKey, T)> {
        let (placed, share) = (&self.placed, self.share);
        let (client, (item, bytes)) = self.turns.pop_first(|c| placed.get(c).copied().unwrap_or(0) < share)?;
        self.forget(&client, bytes);
        *self.placed.entry(client.clone()).or_default() += 1;
        Some((client, item))
    }

    /// Every waiting question, clients in turn; the room is empty after (the places held are
    /// still counted until given back).
    pub fn drain(&mut self) -> Vec<T> {
        let mut all = Vec::with_capacity(self.turns.len());
        while let Some((_, (item, _))) = self.turns.pop_with_client() {
            all.push(item);
        }
        self.bytes = 0;
        self.by_client.clear();
        all
    }

    fn forget(&mut self, client: &ClientKey, bytes: usize) {
        self.bytes -= bytes;
        if let Some(held) = self.by_client.get_mut(client) {
            *held -= bytes;
            if *held == 0 {
                self.by_client.remove(client);
            }
        }
    }

    /// Questions waiting.
    pub fn len(&self) -> usize {
        self.turns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }

    /// Bytes taken.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes `client` has waiting.
    pub fn held_by(&self, client: &ClientKey) -> usize {
        self.by_client.get(client).copied().unwrap_or(0)
    }
}

/// The service's flow state: how many wait (mirrored from the waiting room for telemetry),
/// whether it is stopping, and whether freed heap is due back to the kernel. Shared by the
/// service loop, the waiting room's task, the delivery gate and telemetry, hence atomics.
#[derive(Debug)]
pub struct Flow {
    /// `limits.queue`: how many questions are handled at once.
    queue: usize,
    /// Payload bytes of the questions waiting for a place.
    waiting_bytes: AtomicUsize,
    /// Questions waiting for a place (telemetry's `queue_depth` counts them).
    waiting_questions: AtomicUsize,
    /// Set at shutdown: no question is taken any more (they are left unacknowledged).
    stopping: AtomicBool,
    /// Set when a reply went out; the 1 s heartbeat hands freed heap back to the kernel once
    /// nothing is in progress (after a burst, not per question).
    trim_due: AtomicBool,
    /// Names a client's calls to the engine (a keyed hash: no client can choose a name that
    /// shares another's turns).
    askers: std::collections::hash_map::RandomState,
}

impl Flow {
    /// Flow control over `queue` places.
    pub fn new(queue: usize) -> Flow {
        Flow {
            queue,
            waiting_bytes: AtomicUsize::new(0),
            waiting_questions: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            trim_due: AtomicBool::new(false),
            askers: Default::default(),
        }
    }

    /// The number of places (`limits.queue`).
    pub fn queue(&self) -> usize {
        self.queue
    }

    /// How the engine knows `client`'s calls apart from other clients' (its turns there).
    pub fn asker(&self, client: &ClientKey) -> Asker {
        Asker(self.askers.hash_one(client))
    }

    /// The waiting room now holds `questions` of `bytes` (told after each change, under the
    /// room's lock).
    pub fn waiting<T>(&self, room: &Room<T>) {
        self.waiting_questions.store(room.len(), Ordering::Relaxed);
        self.waiting_bytes.store(room.bytes(), Ordering::Relaxed);
    }

    /// Questions waiting for a place now.
    pub fn waiting_questions(&self) -> usize {
        self.waiting_questions.load(Ordering::Relaxed)
    }

    /// Bytes waiting for a place now.
    pub fn waiting_bytes(&self) -> usize {
        self.waiting_bytes.load(Ordering::Relaxed)
    }

    /// Stops taking questions (shutdown).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// Whether the service is stopping: a question arriving or getting its place now is left
    /// unacknowledged, for the broker to deliver again later.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// A reply went out: freed heap is due back once the service is idle.
    pub fn replied(&self) {
        self.trim_due.store(true, Ordering::Relaxed);
    }

    /// Whether to hand freed heap back now, with `free_places` of the queue free: only once
    /// nothing is in progress or waiting, and only once per burst of replies.
    pub fn trim_now(&self, free_places: usize) -> bool {
        free_places == self.queue && self.waiting_questions() == 0 && self.trim_due.swap(false, Ordering::Relaxed)
    }
}

/// The waiting room's order: each client's questions in arrival order, the clients in turn, one
/// question each per round (deficit round robin with a quantum of one question: a place is a
/// place, whatever the question's size). A client that had nothing waiting joins at the back.
#[derive(Debug)]
pub struct Turns<T> {
    waiting: HashMap<ClientKey, VecDeque<T>>,
    /// Clients with questions waiting, the next to be served first.
    order: VecDeque<ClientKey>,
}

impl<T> Default for Turns<T> {
    fn default() -> Self {
        Turns { waiting: HashMap::new(), order: VecDeque::new() }
    }
}

impl<T> Turns<T> {
    /// `item` of `client` waits for its turn.
    pub fn push(&mut self, client: ClientKey, item: T) {
        let queue = self.waiting.entry(client.clone()).or_default();
        if queue.is_empty() {
            self.order.push_back(client);
        }
        queue.push_back(item);
    }

    /// The next question to serve: the oldest of the client whose turn it is, who then goes to
    /// the back of the round if it has more.
    pub fn pop(&mut self) -> Option<T> {
        self.pop_with_client().map(|(_, item)| item)
    }

    /// [`Turns::pop`], with whose question it is.
    pub fn pop_with_client(&mut self) -> Option<(ClientKey, T)> {
        self.pop_first(|_| true)
    }

    /// [`Turns::pop_with_client`] among the clients `may` allows: the others keep their place in
    /// the round.
    pub fn pop_first(&mut self, may: impl Fn(&ClientKey) -> bool) -> Option<(ClientKey, T)> {
        let at = self.order.iter().position(&may)?;
        let client = self.order.remove(at)?;
        let queue = self.waiting.get_mut(&client)?;
        let item = queue.pop_front()?;
        if queue.is_empty() {
            self.waiting.remove(&client);
        } else {
            self.order.push_back(client.clone());
        }
        Some((client, item))
    }

    /// `client`'s questions, newest first.
    pub fn newest(&self, client: &ClientKey) -> impl Iterator<Item = &T> {
        self.waiting.get(client).into_iter().flat_map(|q| q.iter().rev())
    }

    /// The newest question of `client` leaves (its turn in the round stays while it has more).
    pub fn pop_newest(&mut self, client: &ClientKey) -> Option<T> {
        let queue = self.waiting.get_mut(client)?;
        let item = queue.pop_back();
        if queue.is_empty() {
            self.waiting.remove(client);
            self.order.retain(|c| c != client);
        }
        item
    }

    /// Questions waiting.
    pub fn len(&self) -> usize {
        self.waiting.values().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// Deliveries handed to the connection at once ([`Outlet`]): enough to keep the connection's
/// request channel fed, few enough that a reply never queues behind more than this many others
/// beyond the channel's own.
pub const OUTLET_PASSES: usize = 4;

/// The way out, in turns: a reply (and its question's acknowledgement) is handed to the
/// connection while fewer than `limit` others are being handed over; past that it waits, its
/// client's replies in arrival order, the clients in turn ([`Turns`]).
///
/// Why: replies leave through one connection, whose outgoing QoS 1 publishes the broker lets
/// through only so many at a time (its Receive Maximum: mosquitto's 20). A flood's tasks, each
/// waiting to hand its reply over, formed one line in arrival order, and another client's reply
/// queued behind all of them (measured: 30 ms at p99 of what another client's round trip spent
/// outside the agent's own timing, BENCHMARKS.md). Here its reply waits for at most one of each
/// other client's in the round, and what is already handed over.
#[derive(Debug)]
pub struct Outlet<T> {
    waiting: Turns<T>,
    going: usize,
    limit: usize,
}

impl<T> Outlet<T> {
    /// An outlet that lets `limit` (at least one) go at once.
    pub fn new(limit: usize) -> Outlet<T> {
        Outlet { waiting: Turns::default(), going: 0, limit: limit.max(1) }
    }

    /// `item` of `client` is ready to go: given back if it may go now (it is then going), else
    /// kept until its turn ([`Outlet::gone`] hands it out).
    pub fn ready(&mut self, client: ClientKey, item: T) -> Option<T> {
        if self.going < self.limit && self.waiting.is_empty() {
            self.going += 1;
            Some(item)
        } else {
            self.waiting.push(client, item);
            None
        }
    }

    /// One that was going has gone: the next in turn, which goes in its stead, if any waits.
    pub fn gone(&mut self) -> Option<T> {
        let next = self.waiting.pop();
        if next.is_none() {
            self.going = self.going.saturating_sub(1);
        }
        next
    }

    /// How many are going now, and how many wait.
    pub fn counts(&self) -> (usize, usize) {
        (self.going, self.waiting.len())
    }
}

/// What a question that finds the queue and the waiting room full is sent.
#[derive(Debug, Clone, PartialEq)]
pub enum WhenFull {
    /// An error reply to where its client listens.
    Refuse { reply_to: ReplyTo, error: ErrorReply },
    /// It has nowhere to be answered: a report on the errors topic (counted as dropped).
    Report(Undeliverable),
}

/// The reply to a question that is not taken (`why`): what admission would refuse it for anyway
/// (too large, malformed, ...), else `overloaded`. The reply cache is not consulted: a resend
/// would still take a place.
pub fn refusal_when_full(admission: &Admission, incoming: &Incoming<'_>, now: Instant, why: Full) -> WhenFull {
    let message = match why {
        Full::Queue => "the question queue is full; retry later",
        Full::GaveWay => {
            "the question queue is full and this client held the most of its waiting room: its newest question gave way to another client's; retry later"
        }
    };
    let overloaded = |id| ErrorReply { id, code: ErrorCode::Overloaded, message: message.to_owned() };
    match admission.decide(incoming, now, &ReplyCache::new(0)) {
        Decision::Answer { request, reply_to, .. } => WhenFull::Refuse { reply_to, error: overloaded(request.id) },
        Decision::Refuse { error, reply_to } => WhenFull::Refuse { reply_to, error },
        Decision::Resend { reply_to, .. } => WhenFull::Refuse { reply_to, error: overloaded(None) },
        Decision::Drop { report } => WhenFull::Report(report),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use laya_topics::topic::Schema;

    fn admission() -> Admission {
        Admission::new(Schema::default(), "dev1".into(), &config::Config::default())
    }

    fn msg(payload: &[u8]) -> Incoming<'_> {
        Incoming {
            payload,
            content_type: None,
            response_topic: None,
            correlation: None,
            message_expiry_s: None,
            retained: false,
        }
    }

    fn waits(e: Entered<&'static str>) -> Vec<&'static str> {
        match e {
            Entered::Waits(gave_way) => gave_way,
            Entered::Refused(item) => panic!("{item} should wait"),
        }
    }

    #[test]
    fn a_question_waits_while_the_room_has_bytes_for_it_and_a_client_alone_may_fill_it() {
        let mut room = Room::new(100, 1000);
        assert_eq!(waits(room.enter(ClientKey::named("a"), 60, "a1")), Vec::<&str>::new());
        assert_eq!(waits(room.enter(ClientKey::named("a"), 40, "a2")), Vec::<&str>::new());
        assert_eq!((room.len(), room.bytes(), room.held_by(&ClientKey::named("a"))), (2, 100, 100));
        // Full to the byte: the next one of the same client, however small, is refused.
        assert_eq!(room.enter(ClientKey::named("a"), 1, "a3"), Entered::Refused("a3"));
        assert_eq!((room.len(), room.bytes()), (2, 100));
    }

    #[test]
    fn a_question_larger_than_the_whole_room_is_refused_at_once_and_makes_no_one_give_way() {
        let mut room = Room::new(100, 1000);
        waits(room.enter(ClientKey::named("a"), 50, "a1"));
        assert_eq!(room.enter(ClientKey::named("b"), 101, "b1"), Entered::Refused("b1"));
        assert_eq!((room.len(), room.bytes()), (1, 50));
        // A room of no bytes takes nothing.
        assert_eq!(Room::new(0, 1000).enter(ClientKey::named("a"), waiting_charge(0), "x"), Entered::Refused("x"));
    }

    #[test]
    fn every_waiting_question_is_reckoned_at_its_payload_and_its_publish() {
        assert_eq!(waiting_charge(0), WAITING_OVERHEAD_BYTES);
        assert_eq!(waiting_charge(1000), 1000 + WAITING_OVERHEAD_BYTES);
        assert_eq!(waiting_charge(usize::MAX), usize::MAX);
    }

    #[test]
    fn a_question_that_gets_its_place_frees_its_bytes_and_clients_are_served_in_turn() {
        let mut room = Room::new(100, 1000);
        for (c, item) in [("f", "f1"), ("f", "f2"), ("f", "f3"), ("o", "o1"), ("o", "o2")] {
            waits(room.enter(ClientKey::named(c), 10, item));
        }
        let mut order = Vec::new();
        while let Some((c, item)) = room.take() {
            order.push(item);
            assert_eq!(room.bytes(), room.len() * 10, "{c:?}");
        }
        assert_eq!(order, ["f1", "o1", "f2", "o2", "f3"]);
        assert_eq!(
            (room.bytes(), room.held_by(&ClientKey::named("f")), room.held_by(&ClientKey::named("o"))),
            (0, 0, 0)
        );
        assert!(room.is_empty());
    }

    #[test]
    fn a_client_holds_at_most_half_the_places_and_waits_beside_free_ones_for_the_rest() {
        let mut room = Room::new(1000, 4);
        let (flood, other) = (ClientKey::named("flood"), ClientKey::named("other"));
        assert!(room.seat(&flood) && room.seat(&flood), "two places of four");
        assert!(!room.seat(&flood), "a third is beyond its share");
        assert_eq!(room.seated(&flood), 2);
        for item in ["f1", "f2"] {
            waits(room.enter(flood.clone(), 10, item));
        }
        // Its questions wait, not taken while it holds its share...
        assert_eq!(room.take(), None);
        // ... but another client's go by them.
        waits(room.enter(other.clone(), 10, "o1"));
        assert_eq!(room.take(), Some((other.clone(), "o1")));
        assert_eq!(room.seated(&other), 1);
        // A place given back lets the flood's next in.
        room.unseat(&flood);
        assert_eq!(room.take(), Some((flood.clone(), "f1")));
        assert_eq!((room.take(), room.seated(&flood)), (None, 2));
        room.unseat(&other);
        assert_eq!(room.seated(&other), 0);
        assert_eq!([place_share(64), place_share(5), place_share(1)], [32, 3, 1]);
    }

    #[test]
    fn in_a_full_room_the_newest_questions_of_the_client_holding_the_most_give_way_to_anothers() {
        let mut room = Room::new(100, 1000);
        for item in ["f1", "f2", "f3", "f4"] {
            waits(room.enter(ClientKey::named("flood"), 25, item));
        }
        // The flood's own next question finds the room full: refused.
        assert_eq!(room.enter(ClientKey::named("flood"), 25, "f5"), Entered::Refused("f5"));
        // Another client's does not: the flood's newest give way, as many as it takes.
        assert_eq!(waits(room.enter(ClientKey::named("other"), 40, "o1")), ["f4", "f3"]);
        assert_eq!(waits(room.enter(ClientKey::named("other"), 10, "o2")), Vec::<&str>::new(), "it fits");
        assert_eq!((room.held_by(&ClientKey::named("flood")), room.held_by(&ClientKey::named("other"))), (50, 50));
        // Equal shares: no one holds more than the newcomer would, so nothing gives way.
        assert_eq!(room.enter(ClientKey::named("other"), 25, "o3"), Entered::Refused("o3"));
        assert_eq!(room.enter(ClientKey::named("flood"), 25, "f6"), Entered::Refused("f6"));
        // A third client: the heaviest give way (between equals, the first by name).
        assert_eq!(waits(room.enter(ClientKey::named("third"), 20, "t1")), ["f2"]);
        let order: Vec<&str> = std::iter::from_fn(|| room.take().map(|(_, item)| item)).collect();
        assert_eq!(order, ["f1", "o1", "t1", "o2"], "the flood kept its turn with its oldest");
    }

    #[test]
    fn nothing_gives_way_unless_enough_does() {
        let mut room = Room::new(100, 1000);
        waits(room.enter(ClientKey::named("a"), 40, "a1"));
        waits(room.enter(ClientKey::named("a"), 20, "a2"));
        waits(room.enter(ClientKey::named("b"), 40, "b1"));
        // c's 50 bytes: a (60) holds more than c would and could give a2 (20), but then holds
        // 40, no more than c would, and 20 is not enough: all of it or none of it.
        assert_eq!(room.enter(ClientKey::named("c"), 50, "c1"), Entered::Refused("c1"));
        assert_eq!((room.len(), room.bytes(), room.held_by(&ClientKey::named("a"))), (3, 100, 60));
    }

    #[test]
    fn a_client_whose_last_question_gave_way_leaves_the_round_and_one_with_more_keeps_its_turn() {
        let mut turns = Turns::default();
        turns.push(ClientKey::named("a"), "a1");
        turns.push(ClientKey::named("b"), "b1");
        turns.push(ClientKey::named("a"), "a2");
        assert_eq!(turns.pop_newest(&ClientKey::named("a")), Some("a2"));
        assert_eq!(turns.newest(&ClientKey::named("a")).collect::<Vec<_>>(), [&"a1"]);
        assert_eq!(turns.pop_newest(&ClientKey::named("b")), Some("b1"));
        assert_eq!(turns.pop_newest(&ClientKey::named("b")), None);
        assert_eq!((turns.pop(), turns.pop(), turns.len()), (Some("a1"), None, 0));
    }

    #[test]
    fn each_client_is_its_own_asker_to_the_engine() {
        let flow = Flow::new(1);
        assert_eq!(flow.asker(&ClientKey::named("a")), flow.asker(&ClientKey::named("a")));
        assert_ne!(flow.asker(&ClientKey::named("a")), flow.asker(&ClientKey::named("b")));
        assert_ne!(flow.asker(&ClientKey::Unnamed), flow.asker(&ClientKey::named("")));
    }

    #[test]
    fn freed_heap_is_trimmed_once_after_replies_and_only_when_nothing_is_in_progress() {
        let flow = Flow::new(4);
        assert!(!flow.trim_now(4), "no reply went out yet");
        flow.replied();
        assert!(!flow.trim_now(3), "a question is still in progress");
        let mut room = Room::new(100, 1000);
        waits(room.enter(ClientKey::named("a"), 10, "a1"));
        flow.waiting(&room);
        assert_eq!((flow.waiting_questions(), flow.waiting_bytes()), (1, 10));
        assert!(!flow.trim_now(4), "a question is waiting");
        room.take();
        flow.waiting(&room);
        assert!(flow.trim_now(4));
        assert!(!flow.trim_now(4), "once per burst");
    }

    #[test]
    fn stopping_is_remembered() {
        let flow = Flow::new(1);
        assert!(!flow.stopping());
        flow.stop();
        assert!(flow.stopping());
    }

    #[test]
    fn a_good_question_that_finds_the_queue_full_is_refused_overloaded_with_its_id() {
        let a = admission();
        let m = msg(br#"{"id": "r1", "state": "s", "questions": {}}"#);
        match refusal_when_full(&a, &m, Instant::now(), Full::Queue) {
            WhenFull::Refuse { reply_to, error } => {
                assert_eq!(reply_to.topic, "laya/v1/dev1/reply/r1");
                assert_eq!((error.code, error.id), (ErrorCode::Overloaded, Some("r1".into())));
                assert!(error.code.retryable());
                assert_eq!(error.message, "the question queue is full; retry later");
            }
            other => panic!("{other:?}"),
        }
        match refusal_when_full(&a, &m, Instant::now(), Full::GaveWay) {
            WhenFull::Refuse { error, .. } => {
                assert_eq!(error.code, ErrorCode::Overloaded);
                assert!(error.message.contains("gave way to another client's"), "{}", error.message);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn clients_take_turns_in_the_waiting_room_whatever_order_their_questions_came_in() {
        let mut turns = Turns::default();
        for i in 1..=4 {
            turns.push(ClientKey::named("flood"), format!("f{i}"));
        }
        turns.push(ClientKey::named("b"), "b1".into());
        turns.push(ClientKey::Unnamed, "u1".into());
        turns.push(ClientKey::named("b"), "b2".into());
        assert_eq!(turns.len(), 7);
        let mut order = Vec::new();
        order.extend(turns.pop());
        order.extend(turns.pop());
        // A client that comes back after its queue emptied joins at the back of the round.
        turns.push(ClientKey::named("c"), "c1".into());
        while let Some(next) = turns.pop() {
            order.push(next);
        }
        assert_eq!(order, ["f1", "b1", "u1", "f2", "b2", "c1", "f3", "f4"]);
        assert!(turns.is_empty());
        assert_eq!(turns.len(), 0);
    }

    #[test]
    fn replies_go_a_few_at_a_time_and_past_that_their_clients_take_turns() {
        let (flood, other) = (ClientKey::named("flood"), ClientKey::named("other"));
        let mut out = Outlet::new(2);
        assert_eq!(out.ready(flood.clone(), 1), Some(1));
        assert_eq!(out.ready(flood.clone(), 2), Some(2));
        for n in 3..=6 {
            assert_eq!(out.ready(flood.clone(), n), None, "two are going: {n} waits");
        }
        assert_eq!(out.ready(other.clone(), 100), None);
        assert_eq!(out.counts(), (2, 5));
        // Each reply gone lets one more go: the flood's oldest, then the other client's, whose
        // turn comes before the rest of the flood's however late it came.
        assert_eq!(out.gone(), Some(3));
        assert_eq!(out.gone(), Some(100));
        assert_eq!((out.gone(), out.gone(), out.gone()), (Some(4), Some(5), Some(6)));
        assert_eq!(out.counts(), (2, 0));
        // Nothing waits: the places to go empty, and a new reply goes at once.
        assert_eq!((out.gone(), out.gone(), out.gone()), (None, None, None));
        assert_eq!(out.counts(), (0, 0));
        assert_eq!(out.ready(other, 7), Some(7));
    }

    #[test]
    fn a_large_request_is_prepared_aside_and_cbor_is_large_sooner() {
        assert!(!prepared_aside(Encoding::Json, INLINE_TOKENIZE_BYTES));
        assert!(prepared_aside(Encoding::Json, INLINE_TOKENIZE_BYTES + 1));
        assert!(!prepared_aside(Encoding::Cbor, INLINE_TOKENIZE_BYTES / 8));
        assert!(prepared_aside(Encoding::Cbor, INLINE_TOKENIZE_BYTES / 8 + 1));
    }

    const MIB: usize = 1 << 20;

    #[test]
    fn a_request_is_reckoned_by_its_bytes_and_encoding_at_least_at_the_floor() {
        assert_eq!(preparing_cost(Encoding::Json, 10), REQUEST_FLOOR_BYTES);
        assert_eq!(preparing_cost(Encoding::Json, 220_000), 220_000 * JSON_PREPARING_FACTOR);
        assert_eq!(preparing_cost(Encoding::Cbor, 220_000), 220_000 * CBOR_PREPARING_FACTOR);
        assert_eq!(preparing_cost(Encoding::Json, usize::MAX), usize::MAX, "saturates");
        assert_eq!(rows_cost(1, 10), REQUEST_FLOOR_BYTES);
        assert_eq!(rows_cost(64, 16_384), 16_384 * 16 + 64 * 512);
    }

    #[tokio::test]
    async fn the_budget_admits_while_it_has_the_bytes_and_then_makes_requests_wait_in_turn() {
        let budget = Budget::new(100 * MIB);
        let first = budget.take(60 * MIB).await;
        let second = budget.take(40 * MIB).await;
        assert_eq!((budget.free(), first.bytes(), second.bytes()), (0, 60 * MIB, 40 * MIB));
        // Over: the next waits, however small.
        assert!(budget.try_take(1).is_none());
        let waiting = budget.take(50 * MIB);
        tokio::pin!(waiting);
        assert!(poll_once(waiting.as_mut()).await.is_none(), "waits while the budget lacks 50 MiB");
        drop(second);
        assert!(poll_once(waiting.as_mut()).await.is_none(), "40 MiB free is not 50");
        assert!(budget.try_take(1).is_none(), "a later request does not pass the one waiting");
        drop(first);
        let third = poll_once(waiting.as_mut()).await.expect("admitted once 50 MiB are free");
        assert_eq!((third.bytes(), budget.free()), (50 * MIB, 50 * MIB));
        assert!(budget.try_take(50 * MIB).is_some());
    }

    #[tokio::test]
    async fn a_laid_out_request_keeps_only_its_rows_share_and_gives_it_back_when_answered() {
        let budget = Budget::new(100 * MIB);
        let mut share = budget.take(90 * MIB).await;
        share.keep(MIB);
        assert_eq!((share.bytes(), budget.free()), (MIB, 99 * MIB));
        share.keep(50 * MIB);
        assert_eq!(share.bytes(), MIB, "keeping never grows a share");
        share.keep(0);
        assert_eq!(share.bytes(), 1024, "a share keeps a unit while its request lives");
        drop(share);
        assert_eq!(budget.free(), 100 * MIB);
    }

    #[tokio::test]
    async fn a_request_larger_than_the_whole_budget_proceeds_alone_rather_than_waiting_for_ever() {
        let budget = Budget::new(100 * MIB);
        let small = budget.take(MIB).await;
        let huge = budget.take(500 * MIB);
        tokio::pin!(huge);
        assert!(poll_once(huge.as_mut()).await.is_none(), "it waits for the others to finish");
        drop(small);
        let huge = poll_once(huge.as_mut()).await.expect("admitted once it is alone");
        assert_eq!((huge.bytes(), budget.free()), (100 * MIB, 0), "the whole budget, and no more");
        assert!(budget.try_take(1).is_none(), "alone");
        drop(huge);
        assert_eq!(budget.free(), 100 * MIB);
        // A budget smaller than a unit is one unit, not none.
        assert_eq!(Budget::new(0).free(), 1024);
    }

    /// Polls `f` once: its output if it is ready at once.
    async fn poll_once<F: std::future::Future + Unpin>(f: F) -> Option<F::Output> {
        let mut f = f;
        std::future::poll_fn(|cx| match std::pin::Pin::new(&mut f).poll(cx) {
            std::task::Poll::Ready(v) => std::task::Poll::Ready(Some(v)),
            std::task::Poll::Pending => std::task::Poll::Ready(None),
        })
        .await
    }

    #[test]
    fn a_question_admission_refuses_anyway_gets_that_refusal_not_overloaded() {
        let a = admission();
        let many: String = (0..65).map(|i| format!(r#""q{i}": {{}}"#)).collect::<Vec<_>>().join(",");
        let too_many = format!(r#"{{"id": "r2", "state": "s", "questions": {{{many}}}}}"#);
        match refusal_when_full(&a, &msg(too_many.as_bytes()), Instant::now(), Full::Queue) {
            WhenFull::Refuse { error, .. } => assert_eq!(error.code, ErrorCode::TooLarge),
            other => panic!("{other:?}"),
        }
        let malformed = Incoming { response_topic: Some("laya/v1/reply/c/1"), ..msg(b"{not json") };
        match refusal_when_full(&a, &malformed, Instant::now(), Full::GaveWay) {
            WhenFull::Refuse { error, reply_to } => {
                assert_eq!((error.code, reply_to.topic.as_str()), (ErrorCode::BadRequest, "laya/v1/reply/c/1"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_question_with_nowhere_to_reply_to_that_finds_the_queue_full_is_reported() {
        let a = admission();
        let m = msg(br#"{"state": "s", "questions": {}}"#);
        assert!(matches!(refusal_when_full(&a, &m, Instant::now(), Full::Queue), WhenFull::Report(_)));
    }
}
