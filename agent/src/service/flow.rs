//! Flow control, without I/O: where an arriving question goes, and what is sent when it cannot
//! be taken.
//!
//! A question takes one of `limits.queue` places (the Receive Maximum the agent announced, so a
//! well-behaved broker never sends more). One arriving beyond them (a broker that ignores the
//! Receive Maximum, or a redelivery burst after a reconnect) waits, unacknowledged, in the
//! waiting room, as its raw payload, while the room has bytes left (`limits.waiting_bytes`);
//! past that it is refused `overloaded` (or whatever admission would refuse it for anyway) and
//! acknowledged, so it is not redelivered for ever. A large request also waits for one of
//! [`PREPARING_AT_ONCE`] slots before it is decoded and laid out.
//!
//! Clients are served fairly (issue #40; [`ClientKey`] tells them apart). Each may hold at most
//! its share of questions (`limits.queue_per_client`, half the queue by default), in places and
//! waiting together; beyond it *that* client's questions are refused `overloaded` at once, and
//! acknowledged, while the others' are still taken. That is what keeps one client's flood from
//! setting everyone's latency on a broker that honours the Receive Maximum: the broker delivers a
//! session's questions in the order they came, and holds the rest while the agent has the
//! Receive Maximum unacknowledged, so a flood that filled the places would keep every later
//! question at the broker, behind it, until the flood was answered. A client at its share leaves
//! the rest of the window to the others, and its surplus is refused as fast as it arrives. The
//! waiting room hands free places to its clients in turn ([`Turns`]), not in arrival order; the
//! engine's call queue takes their calls in turn too (`engine::supervisor`'s `calls.rs`).
//!
//! The places themselves are a semaphore the service holds (its tasks wait on it); this module
//! decides, counts and is unit-tested without a broker or a runtime.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use laya_topics::wire::{Encoding, ErrorCode, ErrorReply, Undeliverable};

pub use super::admission::ClientKey;
use super::admission::{Admission, Decision, Incoming, ReplyCache, ReplyTo};
use crate::engine::Asker;

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

/// The largest request tokenized on the runtime's thread, by encoding (see
/// [`INLINE_TOKENIZE_BYTES`]).
pub fn inline_limit(encoding: Encoding) -> usize {
    match encoding {
        Encoding::Json => INLINE_TOKENIZE_BYTES,
        Encoding::Cbor => INLINE_TOKENIZE_BYTES / 8,
    }
}

/// Whether a request of `payload_len` bytes must wait for a preparation slot (and is prepared
/// in the blocking pool) rather than being prepared in place.
pub fn needs_preparing_slot(encoding: Encoding, payload_len: usize) -> bool {
    payload_len > inline_limit(encoding)
}

/// Where an arriving question goes. `P` is the queue place the caller tried to take. A question
/// taken ([`Place::Queue`], [`Place::Wait`]) counts against its client's share for as long as its
/// [`Hold`] lives: until it is answered (or left for the broker at shutdown).
#[derive(Debug, PartialEq, Eq)]
pub enum Place<P> {
    /// It took a place: handle it now.
    Queue(P, Hold),
    /// No place, but room to wait for one: hand it to the waiting room with this ticket.
    Wait(Ticket, Hold),
    /// Neither: refuse it ([`refusal_when_full`]) and acknowledge it.
    Refuse(Full),
}

/// Why a question was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The queue and the waiting room are full.
    Everything,
    /// Its client already holds its share of the queue (`limits.queue_per_client`).
    Share(usize),
}

/// A question's share of the waiting room; given back with [`Flow::leave`] when it gets its
/// place.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a ticket's bytes stay taken until it is given back with Flow::leave"]
pub struct Ticket {
    bytes: usize,
}

/// A question's count against its client's share; given back when dropped.
#[must_use = "dropping a hold gives the client's share back at once"]
pub struct Hold {
    flow: Arc<Flow>,
    client: ClientKey,
}

impl Hold {
    /// Whose share it counts against.
    pub fn client(&self) -> &ClientKey {
        &self.client
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut held = self.flow.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.client);
            }
        }
    }
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Hold").field(&self.client).finish()
    }
}

impl PartialEq for Hold {
    fn eq(&self, other: &Hold) -> bool {
        self.client == other.client
    }
}

impl Eq for Hold {}

/// The service's flow state: the waiting room's bytes and questions, whether it is stopping,
/// and whether freed heap is due back to the kernel. Shared by the service loop, the waiting
/// room's task, the delivery gate and telemetry, hence atomics.
#[derive(Debug)]
pub struct Flow {
    /// `limits.queue`: how many questions are handled at once.
    queue: usize,
    /// `limits.waiting_bytes`: payload bytes the waiting room holds at most.
    waiting_limit: usize,
    /// Payload bytes of the questions waiting for a place.
    waiting_bytes: AtomicUsize,
    /// Questions waiting for a place (telemetry's `queue_depth` counts them).
    waiting_questions: AtomicUsize,
    /// Set at shutdown: no question is taken any more (they are left unacknowledged).
    stopping: AtomicBool,
    /// Set when a reply went out; the 1 s heartbeat hands freed heap back to the kernel once
    /// nothing is in progress (after a burst, not per question).
    trim_due: AtomicBool,
    /// The most questions one client may hold, in places and waiting together.
    share: usize,
    /// Questions each client holds now (clients holding none are not kept).
    held: Mutex<HashMap<ClientKey, usize>>,
    /// Names a client's calls to the engine (a keyed hash: no client can choose a name that
    /// shares another's turns).
    askers: std::collections::hash_map::RandomState,
}

impl Flow {
    /// Flow control over `queue` places, a waiting room of `waiting_limit` bytes, and `share`
    /// questions at most per client (0: half the queue, at least one).
    pub fn new(queue: usize, waiting_limit: usize, share: usize) -> Flow {
        Flow {
            queue,
            waiting_limit,
            waiting_bytes: AtomicUsize::new(0),
            waiting_questions: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            trim_due: AtomicBool::new(false),
            share: share_of(queue, share),
            held: Mutex::default(),
            askers: Default::default(),
        }
    }

    /// The most questions one client may hold.
    pub fn share(&self) -> usize {
        self.share
    }

    /// How many questions `client` holds now.
    pub fn held_by(&self, client: &ClientKey) -> usize {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).get(client).copied().unwrap_or(0)
    }

    /// How the engine knows `client`'s calls apart from other clients' (its turns there).
    pub fn asker(&self, client: &ClientKey) -> Asker {
        Asker(self.askers.hash_one(client))
    }

    /// The number of places (`limits.queue`).
    pub fn queue(&self) -> usize {
        self.queue
    }

    /// Where a question of `payload_len` bytes from `client` goes, given the place the caller
    /// could take (`None`: all taken). A client at its share is refused whatever is free.
    pub fn arrive<P>(self: &Arc<Self>, client: &ClientKey, place: Option<P>, payload_len: usize) -> Place<P> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let holds = held.get(client).copied().unwrap_or(0);
        if holds >= self.share {
            return Place::Refuse(Full::Share(self.share));
        }
        let taken = match place {
            Some(p) => Place::Queue(p, self.hold(client)),
            None => match self.enter(payload_len) {
                Some(ticket) => Place::Wait(ticket, self.hold(client)),
                None => return Place::Refuse(Full::Everything),
            },
        };
        held.insert(client.clone(), holds + 1);
        taken
    }

    /// The hold of a question of `client` just counted (by the caller, under the lock).
    fn hold(self: &Arc<Self>, client: &ClientKey) -> Hold {
        Hold { flow: self.clone(), client: client.clone() }
    }

    /// Takes `payload_len` bytes of the waiting room (at least one: an empty question still
    /// waits), if they fit.
    fn enter(&self, payload_len: usize) -> Option<Ticket> {
        let bytes = payload_len.max(1);
        self.waiting_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                w.checked_add(bytes).filter(|total| *total <= self.waiting_limit)
            })
            .ok()?;
        self.waiting_questions.fetch_add(1, Ordering::Relaxed);
        Some(Ticket { bytes })
    }

    /// A waiting question got its place (or the places closed): its bytes are free again.
    pub fn leave(&self, ticket: Ticket) {
        self.waiting_bytes.fetch_sub(ticket.bytes, Ordering::Relaxed);
        self.waiting_questions.fetch_sub(1, Ordering::Relaxed);
    }

    /// Questions waiting for a place now.
    pub fn waiting_questions(&self) -> usize {
        self.waiting_questions.load(Ordering::Relaxed)
    }

    /// Payload bytes waiting for a place now.
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

/// A client's share: `configured`, or half the queue (at least one) for 0.
pub fn share_of(queue: usize, configured: usize) -> usize {
    match configured {
        0 => queue.div_ceil(2).max(1),
        n => n,
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
        let client = self.order.pop_front()?;
        let queue = self.waiting.get_mut(&client)?;
        let item = queue.pop_front();
        if queue.is_empty() {
            self.waiting.remove(&client);
        } else {
            self.order.push_back(client);
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
        Full::Everything => "the question queue is full; retry later".to_owned(),
        Full::Share(share) => format!(
            "this client already has {share} questions queued or in progress, its share of the queue; retry later"
        ),
    };
    let overloaded = |id| ErrorReply { id, code: ErrorCode::Overloaded, message: message.clone() };
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
        Incoming { payload, content_type: None, response_topic: None, correlation: None, message_expiry_s: None }
    }

    fn client(name: &str) -> ClientKey {
        ClientKey::Named(name.into())
    }

    /// A flow whose clients may each hold the whole queue and more (the share is not tested).
    fn flow(queue: usize, waiting: usize) -> Arc<Flow> {
        Arc::new(Flow::new(queue, waiting, usize::MAX))
    }

    /// Where a question of `a` goes, with a place or without.
    fn arrive<P>(flow: &Arc<Flow>, place: Option<P>, bytes: usize) -> Place<P> {
        flow.arrive(&client("a"), place, bytes)
    }

    fn waits<P: std::fmt::Debug>(place: Place<P>) -> (Ticket, Hold) {
        match place {
            Place::Wait(ticket, hold) => (ticket, hold),
            other => panic!("should wait: {other:?}"),
        }
    }

    #[test]
    fn a_question_that_finds_a_place_is_handled_now_and_takes_nothing_of_the_waiting_room() {
        let flow = flow(2, 100);
        assert!(matches!(arrive(&flow, Some("place"), 60), Place::Queue("place", _)));
        assert_eq!((flow.waiting_questions(), flow.waiting_bytes()), (0, 0));
    }

    #[test]
    fn without_a_place_a_question_waits_while_the_room_has_bytes_for_it() {
        let flow = flow(2, 100);
        let first = waits(arrive(&flow, None::<()>, 60));
        assert_eq!(first.0, Ticket { bytes: 60 });
        let second = waits(arrive(&flow, None::<()>, 40));
        assert_eq!(second.0, Ticket { bytes: 40 });
        assert_eq!((flow.waiting_questions(), flow.waiting_bytes()), (2, 100));
        // Full to the byte: the next one, however small, is refused and counted nowhere.
        assert_eq!(arrive(&flow, None::<()>, 1), Place::Refuse(Full::Everything));
        assert_eq!((flow.waiting_questions(), flow.waiting_bytes(), flow.held_by(&client("a"))), (2, 100, 2));
    }

    #[test]
    fn a_question_larger_than_the_whole_waiting_room_is_refused_at_once() {
        let flow = flow(1, 100);
        assert_eq!(arrive(&flow, None::<()>, 101), Place::Refuse(Full::Everything));
        assert_eq!(flow.waiting_bytes(), 0);
    }

    #[test]
    fn an_empty_question_still_takes_a_byte_of_the_waiting_room() {
        let flow = flow(1, 1);
        let (ticket, _hold) = waits(arrive(&flow, None::<()>, 0));
        assert_eq!(ticket, Ticket { bytes: 1 });
        assert_eq!(arrive(&flow, None::<()>, 0), Place::Refuse(Full::Everything));
    }

    #[test]
    fn a_waiting_question_that_leaves_frees_its_bytes_for_the_next() {
        let flow = flow(1, 100);
        let (ticket, _hold) = waits(arrive(&flow, None::<()>, 100));
        assert_eq!(arrive(&flow, None::<()>, 50), Place::Refuse(Full::Everything));
        flow.leave(ticket);
        assert_eq!((flow.waiting_questions(), flow.waiting_bytes()), (0, 0));
        assert!(matches!(arrive(&flow, None::<()>, 50), Place::Wait(..)));
    }

    #[test]
    fn a_client_at_its_share_alone_is_refused_and_gets_its_share_back_as_its_questions_end() {
        let flow = Arc::new(Flow::new(4, 1000, 2));
        let (flood, other) = (client("flood"), client("other"));
        let first = flow.arrive(&flood, Some(1), 10);
        let second = flow.arrive(&flood, None::<u8>, 10);
        assert!(matches!((&first, &second), (Place::Queue(1, _), Place::Wait(..))));
        // At its share: refused, with a place free or not, and the refusal counts nowhere.
        assert_eq!(flow.arrive(&flood, Some(2), 10), Place::Refuse(Full::Share(2)));
        assert_eq!(flow.arrive(&flood, None::<u8>, 10), Place::Refuse(Full::Share(2)));
        assert_eq!((flow.held_by(&flood), flow.waiting_questions()), (2, 1));
        // Another client is taken as before.
        let theirs = flow.arrive(&other, Some(3), 10);
        assert!(matches!(theirs, Place::Queue(3, ref h) if h.client() == &other));
        assert_eq!(flow.held_by(&other), 1);
        // The flood's first question is answered: its hold goes, and its next is taken.
        drop(first);
        assert_eq!(flow.held_by(&flood), 1);
        let fourth = flow.arrive(&flood, Some(4), 10);
        assert!(matches!(fourth, Place::Queue(4, _)));
        drop(theirs);
        assert_eq!(flow.held_by(&other), 0);
        assert!(flow.held.lock().unwrap().get(&other).is_none(), "a client holding nothing is forgotten");
        // A waiting question's hold lasts while it waits and then holds its place: leaving the
        // room gives back bytes, not the share.
        let Place::Wait(ticket, hold) = second else { panic!("waits") };
        flow.leave(ticket);
        assert_eq!(flow.held_by(&flood), 2);
        drop(hold);
        assert_eq!(flow.held_by(&flood), 1);
        drop(fourth);
        assert_eq!(flow.held_by(&flood), 0);
    }

    #[test]
    fn the_share_is_half_the_queue_unless_configured_and_at_least_one() {
        assert_eq!([share_of(64, 0), share_of(5, 0), share_of(1, 0)], [32, 3, 1]);
        assert_eq!(share_of(64, 100), 100);
        assert_eq!(Flow::new(64, 0, 0).share(), 32);
    }

    #[test]
    fn clients_take_turns_in_the_waiting_room_whatever_order_their_questions_came_in() {
        let mut turns = Turns::default();
        for i in 1..=4 {
            turns.push(client("flood"), format!("f{i}"));
        }
        turns.push(client("b"), "b1".into());
        turns.push(ClientKey::Unnamed, "u1".into());
        turns.push(client("b"), "b2".into());
        assert_eq!(turns.len(), 7);
        let mut order = Vec::new();
        order.extend(turns.pop());
        order.extend(turns.pop());
        // A client that comes back after its queue emptied joins at the back of the round.
        turns.push(client("c"), "c1".into());
        while let Some(next) = turns.pop() {
            order.push(next);
        }
        assert_eq!(order, ["f1", "b1", "u1", "f2", "b2", "c1", "f3", "f4"]);
        assert!(turns.is_empty() && turns.len() == 0);
    }

    #[test]
    fn each_client_is_its_own_asker_to_the_engine() {
        let flow = flow(1, 1);
        assert_eq!(flow.asker(&client("a")), flow.asker(&client("a")));
        assert_ne!(flow.asker(&client("a")), flow.asker(&client("b")));
        assert_ne!(flow.asker(&ClientKey::Unnamed), flow.asker(&client("")));
    }

    #[test]
    fn freed_heap_is_trimmed_once_after_replies_and_only_when_nothing_is_in_progress() {
        let flow = flow(4, 100);
        assert!(!flow.trim_now(4), "no reply went out yet");
        flow.replied();
        assert!(!flow.trim_now(3), "a question is still in progress");
        let (ticket, _hold) = waits(arrive(&flow, None::<()>, 10));
        assert!(!flow.trim_now(4), "a question is waiting");
        flow.leave(ticket);
        assert!(flow.trim_now(4));
        assert!(!flow.trim_now(4), "once per burst");
    }

    #[test]
    fn stopping_is_remembered() {
        let flow = flow(1, 1);
        assert!(!flow.stopping());
        flow.stop();
        assert!(flow.stopping());
    }

    #[test]
    fn a_large_request_waits_for_a_preparation_slot_and_cbor_is_large_sooner() {
        assert!(!needs_preparing_slot(Encoding::Json, INLINE_TOKENIZE_BYTES));
        assert!(needs_preparing_slot(Encoding::Json, INLINE_TOKENIZE_BYTES + 1));
        assert!(!needs_preparing_slot(Encoding::Cbor, INLINE_TOKENIZE_BYTES / 8));
        assert!(needs_preparing_slot(Encoding::Cbor, INLINE_TOKENIZE_BYTES / 8 + 1));
    }

    #[test]
    fn a_good_question_that_finds_the_queue_full_is_refused_overloaded_with_its_id() {
        let a = admission();
        let m = msg(br#"{"id": "r1", "state": "s", "questions": {}}"#);
        match refusal_when_full(&a, &m, Instant::now(), Full::Everything) {
            WhenFull::Refuse { reply_to, error } => {
                assert_eq!(reply_to.topic, "laya/v1/dev1/reply/r1");
                assert_eq!((error.code, error.id), (ErrorCode::Overloaded, Some("r1".into())));
                assert!(error.code.retryable());
                assert!(error.message.contains("queue is full"), "{}", error.message);
            }
            other => panic!("{other:?}"),
        }
        match refusal_when_full(&a, &m, Instant::now(), Full::Share(32)) {
            WhenFull::Refuse { error, .. } => {
                assert_eq!(error.code, ErrorCode::Overloaded);
                assert!(error.message.contains("this client already has 32 questions"), "{}", error.message);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_question_admission_refuses_anyway_gets_that_refusal_not_overloaded() {
        let a = admission();
        let many: String = (0..65).map(|i| format!(r#""q{i}": {{}}"#)).collect::<Vec<_>>().join(",");
        let too_many = format!(r#"{{"id": "r2", "state": "s", "questions": {{{many}}}}}"#);
        match refusal_when_full(&a, &msg(too_many.as_bytes()), Instant::now(), Full::Everything) {
            WhenFull::Refuse { error, .. } => assert_eq!(error.code, ErrorCode::TooLarge),
            other => panic!("{other:?}"),
        }
        let malformed = Incoming { response_topic: Some("laya/v1/reply/c/1"), ..msg(b"{not json") };
        match refusal_when_full(&a, &malformed, Instant::now(), Full::Share(1)) {
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
        assert!(matches!(refusal_when_full(&a, &m, Instant::now(), Full::Everything), WhenFull::Report(_)));
    }
}
