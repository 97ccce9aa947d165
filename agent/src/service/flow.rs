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
//! The places themselves are a semaphore the service holds (its tasks wait on it); this module
//! decides, counts and is unit-tested without a broker or a runtime.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use laya_topics::wire::{Encoding, ErrorCode, ErrorReply, Undeliverable};

use super::admission::{Admission, Decision, Incoming, ReplyCache, ReplyTo};

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

/// Where an arriving question goes. `P` is the queue place the caller tried to take.
#[derive(Debug, PartialEq, Eq)]
pub enum Place<P> {
    /// It took a place: handle it now.
    Queue(P),
    /// No place, but room to wait for one: hand it to the waiting room with this ticket.
    Wait(Ticket),
    /// Neither: refuse it ([`refusal_when_full`]) and acknowledge it.
    Refuse,
}

/// A question's share of the waiting room; given back with [`Flow::leave`] when it gets its
/// place.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a ticket's bytes stay taken until it is given back with Flow::leave"]
pub struct Ticket {
    bytes: usize,
}

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
}

impl Flow {
    pub fn new(queue: usize, waiting_limit: usize) -> Flow {
        Flow {
            queue,
            waiting_limit,
            waiting_bytes: AtomicUsize::new(0),
            waiting_questions: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            trim_due: AtomicBool::new(false),
        }
    }

    /// The number of places (`limits.queue`).
    pub fn queue(&self) -> usize {
        self.queue
    }

    /// Where a question of `payload_len` bytes goes, given the place the caller could take
    /// (`None`: all taken).
    pub fn arrive<P>(&self, place: Option<P>, payload_len: usize) -> Place<P> {
        match place {
            Some(p) => Place::Queue(p),
            None => match self.enter(payload_len) {
                Some(ticket) => Place::Wait(ticket),
                None => Place::Refuse,
            },
        }
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

/// What a question that finds the queue and the waiting room full is sent.
#[derive(Debug, Clone, PartialEq)]
pub enum WhenFull {
    /// An error reply to where its client listens.
    Refuse { reply_to: ReplyTo, error: ErrorReply },
    /// It has nowhere to be answered: a report on the errors topic (counted as dropped).
    Report(Undeliverable),
}

/// The reply to a question that arrives with the queue full: what admission would refuse it
/// for anyway (too large, malformed, ...), else `overloaded`. The reply cache is not consulted:
/// a resend would still take a place.
pub fn refusal_when_full(admission: &Admission, incoming: &Incoming<'_>, now: Instant) -> WhenFull {
    let overloaded =
        |id| ErrorReply { id, code: ErrorCode::Overloaded, message: "the question queue is full; retry later".into() };
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

    #[test]
    fn a_question_that_finds_a_place_is_handled_now_and_takes_nothing_of_the_waiting_room() {
        let flow = Flow::new(2, 100);
        assert_eq!(flow.arrive(Some("place"), 60), Place::Queue("place"));
        assert_eq!((flow.waiting_questions(), flow.waiting_bytes()), (0, 0));
    }

    #[test]
    fn without_a_place_a_question_waits_while_the_room_has_bytes_for_it() {
        let flow = Flow::new(2, 100);
        let first = flow.arrive(None::<()>, 60);
        assert_eq!(first, Place::Wait(Ticket { bytes: 60 }));
        assert_eq!(flow.arrive(None::<()>, 40), Place::Wait(Ticket { bytes: 40 }));
        assert_eq!((flow.waiting_questions(), flow.waiting_bytes()), (2, 100));
        // Full to the byte: the next one, however small, is refused and counted nowhere.
        assert_eq!(flow.arrive(None::<()>, 1), Place::Refuse);
        assert_eq!((flow.waiting_questions(), flow.waiting_bytes()), (2, 100));
    }

    #[test]
    fn a_question_larger_than_the_whole_waiting_room_is_refused_at_once() {
        let flow = Flow::new(1, 100);
        assert_eq!(flow.arrive(None::<()>, 101), Place::Refuse);
        assert_eq!(flow.waiting_bytes(), 0);
    }

    #[test]
    fn an_empty_question_still_takes_a_byte_of_the_waiting_room() {
        let flow = Flow::new(1, 1);
        assert_eq!(flow.arrive(None::<()>, 0), Place::Wait(Ticket { bytes: 1 }));
        assert_eq!(flow.arrive(None::<()>, 0), Place::Refuse);
    }

    #[test]
    fn a_waiting_question_that_leaves_frees_its_bytes_for_the_next() {
        let flow = Flow::new(1, 100);
        let Place::Wait(ticket) = flow.arrive(None::<()>, 100) else { panic!("should wait") };
        assert_eq!(flow.arrive(None::<()>, 50), Place::Refuse);
        flow.leave(ticket);
        assert_eq!((flow.waiting_questions(), flow.waiting_bytes()), (0, 0));
        assert!(matches!(flow.arrive(None::<()>, 50), Place::Wait(_)));
    }

    #[test]
    fn freed_heap_is_trimmed_once_after_replies_and_only_when_nothing_is_in_progress() {
        let flow = Flow::new(4, 100);
        assert!(!flow.trim_now(4), "no reply went out yet");
        flow.replied();
        assert!(!flow.trim_now(3), "a question is still in progress");
        let Place::Wait(ticket) = flow.arrive(None::<()>, 10) else { panic!("should wait") };
        assert!(!flow.trim_now(4), "a question is waiting");
        flow.leave(ticket);
        assert!(flow.trim_now(4));
        assert!(!flow.trim_now(4), "once per burst");
    }

    #[test]
    fn stopping_is_remembered() {
        let flow = Flow::new(1, 1);
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
        match refusal_when_full(&a, &m, Instant::now()) {
            WhenFull::Refuse { reply_to, error } => {
                assert_eq!(reply_to.topic, "laya/v1/dev1/reply/r1");
                assert_eq!((error.code, error.id), (ErrorCode::Overloaded, Some("r1".into())));
                assert!(error.code.retryable());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_question_admission_refuses_anyway_gets_that_refusal_not_overloaded() {
        let a = admission();
        let many: String = (0..65).map(|i| format!(r#""q{i}": {{}}"#)).collect::<Vec<_>>().join(",");
        let too_many = format!(r#"{{"id": "r2", "state": "s", "questions": {{{many}}}}}"#);
        match refusal_when_full(&a, &msg(too_many.as_bytes()), Instant::now()) {
            WhenFull::Refuse { error, .. } => assert_eq!(error.code, ErrorCode::TooLarge),
            other => panic!("{other:?}"),
        }
        let malformed = Incoming { response_topic: Some("laya/v1/reply/c/1"), ..msg(b"{not json") };
        match refusal_when_full(&a, &malformed, Instant::now()) {
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
        assert!(matches!(refusal_when_full(&a, &m, Instant::now()), WhenFull::Report(_)));
    }
}
