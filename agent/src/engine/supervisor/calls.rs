//! The calls the supervisor holds: queued in order, or running on the serving worker.
//!
//! Calls queued together run together: when the serving primary is idle and several calls wait,
//! they go to the worker as one batch (their rows concatenated in queue order, up to a row cap),
//! so concurrent one-question requests fill the NPU's contexts or pipeline as a multi-question
//! request does. A failure of a merged batch is nobody's in particular: its calls run again
//! *alone*, their attempts unchanged ([`CallQueue::split_running`]). Apart from the lifecycle so
//! merging, expiry and the gathering window can be read without it.
//!
//! The queue is fair between askers ([`Asker`]: the service names one per client). A call is
//! queued at its turn, not at the back: self-clocked fair queueing, rows as the cost. Each asker's
//! turns run on from its last call's (`finish`), or from the turn the worker was last given
//! (`clock`) if that is later, each call adding its rows; calls stand in the queue in turn order,
//! arrival order among equal turns. So a client holding sixty calls and one that asks once take
//! turns: the newcomer's call goes before the flood's second, whatever the flood queued first, and
//! waits for at most the batch running and its own (issue #40). A merged batch takes at most an
//! equal part of its rows from each asker queued, no more than the asker with the fewest rows
//! queued has, so that own batch is as short as the newcomer's call, not one the flood fills.
//! With one asker, or none named, every new turn is the latest and the queue is first come, first
//! served as before. Calls that go back to the front (a failed batch's, a retry) keep their place
//! there.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::deadline::Size;
use super::events::{Asker, CallId};

/// One call the supervisor holds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Call {
    pub(super) rows: usize,
    /// What the rows cost ([`Size::units`]).
    pub(super) units: f64,
    /// When it was submitted.
    pub(super) since: Instant,
    pub(super) deadline: Option<Instant>,
    /// 0 the first time, 1 on the re-run after a fatal failure of this call alone.
    pub(super) attempt: u8,
    /// Runs alone, never merged: a probe call, or a call whose merged batch failed (so a failure
    /// is its own, and never a neighbour's).
    pub(super) alone: bool,
    /// Who asked: whose turns it takes.
    pub(super) asker: Asker,
    /// Its turn in the queue (given by [`CallQueue::submit`]).
    pub(super) turn: u64,
}

impl Call {
    fn size(&self) -> Size {
        Size { rows: self.rows, units: self.units }
    }

    fn expired(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| d <= now)
    }
}

/// Whether the idle primary waits for more calls before sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gather {
    /// Not waiting.
    Off,
    /// Waiting, until the round is full or the `Gather` timer fires.
    Waiting,
    /// The timer fired: send what is there.
    Due,
}

/// What became of a failed call offered another attempt ([`CallQueue::retry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retry {
    /// Its first failure: it is back at the front of the queue, to run alone.
    Again,
    /// Its second failure: it has left the queue.
    Spent,
    /// It was not held any more.
    Gone,
}

/// The queue, the calls in it and the batch the serving worker runs.
#[derive(Debug, Default)]
pub(super) struct CallQueue {
    /// In turn order (module doc), but for calls put back at the front.
    queue: VecDeque<CallId>,
    calls: BTreeMap<CallId, Call>,
    /// The calls the serving worker runs now, in row order (empty unless it is `Busy`).
    running: Vec<CallId>,
    /// The latest turn given to a worker: a new call's turn is never earlier.
    clock: u64,
    /// Each asker's last turn given, while later than `clock` (older ones are forgotten: they
    /// would count as `clock`).
    finish: HashMap<Asker, u64>,
}

impl CallQueue {
    /// Calls waiting for a worker.
    pub(super) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Calls queued or running.
    pub(super) fn held(&self) -> usize {
        self.calls.len()
    }

    pub(super) fn is_queue_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Queues a new call at its asker's next turn (module doc): behind every call of an earlier
    /// or equal turn, before the later ones.
    pub(super) fn submit(&mut self, id: CallId, mut call: Call) {
        let clock = self.clock;
        self.finish.retain(|_, last| *last > clock);
        let start = self.finish.get(&call.asker).copied().unwrap_or(clock).max(clock);
        call.turn = start.saturating_add(call.rows.max(1) as u64);
        self.finish.insert(call.asker, call.turn);
        let at = self
            .queue
            .iter()
            .rposition(|c| self.calls.get(c).is_none_or(|queued| queued.turn <= call.turn))
            .map_or(0, |i| i + 1);
        self.calls.insert(id, call);
        self.queue.insert(at, id);
    }

    /// Forgets `call` wherever it is; whether it was held.
    pub(super) fn remove(&mut self, call: CallId) -> bool {
        let held = self.calls.remove(&call).is_some();
        if held {
            self.queue.retain(|c| *c != call);
        }
        held
    }

    /// Whether `call` is queued or running.
    pub(super) fn holds(&self, call: CallId) -> bool {
        self.calls.contains_key(&call)
    }

    /// Whether `call` is part of the running batch.
    pub(super) fn is_running(&self, call: CallId) -> bool {
        self.running.contains(&call)
    }

    /// How many calls the running batch has.
    pub(super) fn running_len(&self) -> usize {
        self.running.len()
    }

    /// The next batch for an idle worker, from the front of the queue: the calls that fit in
    /// `cap` rows (the first always does) while none of them must run alone, each asker's up to
    /// an equal part when several are queued: an equal part of `cap`, and no more than the asker
    /// with the fewest rows queued has (their later calls wait for the next batch). So a
    /// newcomer's one-row call runs in a batch of its row and one of the flood's, not one the
    /// flood fills: it waits for the batch running and its own short one, never two long ones;
    /// and the calls whose deadline passed on the way, which left the queue (to be
    /// answered `Expired`). Returns the batch (in row order), its size, and the expired calls.
    pub(super) fn next_batch(&mut self, now: Instant, cap: usize) -> (Vec<CallId>, Size, Vec<CallId>) {
        let mut batch = Vec::new();
        let mut expired = Vec::new();
        let mut rows = 0;
        let mut size = Size::default();
        let mut queued: HashMap<Asker, usize> = HashMap::new();
        for c in self.queue.iter().filter_map(|c| self.calls.get(c)).filter(|c| !c.expired(now)) {
            *queued.entry(c.asker).or_default() += c.rows;
        }
        let part = match queued.values().min() {
            Some(&least) if queued.len() > 1 => (cap / queued.len()).min(least).max(1),
            _ => cap,
        };
        let mut taken: HashMap<Asker, usize> = HashMap::new();
        let mut at = 0;
        while let Some(&call) = self.queue.get(at) {
            let Some(c) = self.calls.get(&call).copied() else {
                self.queue.remove(at);
                continue;
            };
            if c.expired(now) {
                self.queue.remove(at);
                self.calls.remove(&call);
                expired.push(call);
                continue;
            }
            if !batch.is_empty() && (c.alone || rows + c.rows > cap) {
                break;
            }
            let mine = taken.entry(c.asker).or_default();
            if !batch.is_empty() && *mine + c.rows > part {
                at += 1;
                continue;
            }
            *mine += c.rows;
            self.queue.remove(at);
            self.clock = self.clock.max(c.turn);
            batch.push(call);
            rows += c.rows;
            size = size.add(c.size());
            if c.alone {
                break;
            }
        }
        (batch, size, expired)
    }

    /// The serving worker now runs `batch`.
    pub(super) fn start(&mut self, batch: Vec<CallId>) {
        self.running = batch;
    }

    /// The running batch was answered: it leaves, with the size it had.
    pub(super) fn finish_running(&mut self) -> (Vec<CallId>, Size) {
        let batch = std::mem::take(&mut self.running);
        let size = batch.iter().filter_map(|c| self.calls.remove(c)).fold(Size::default(), |s, c| s.add(c.size()));
        (batch, size)
    }

    /// The running batch is no one's any more (the worker failed, or was replaced): forgotten,
    /// its calls left as they are.
    pub(super) fn clear_running(&mut self) {
        self.running.clear();
    }

    /// The last call of the running batch leaves it (a batch of one, whose worker failed).
    pub(super) fn pop_running(&mut self) -> Option<CallId> {
        self.running.pop()
    }

    /// The running batch, which failed as a whole, goes back to the front of the queue in its
    /// order, each call to run alone with its attempts unchanged: the failure is not yet any
    /// one call's.
    pub(super) fn split_running(&mut self) {
        let batch = std::mem::take(&mut self.running);
        for call in batch.into_iter().rev() {
            if let Some(c) = self.calls.get_mut(&call) {
                c.alone = true;
                self.queue.push_front(call);
            }
        }
    }

    /// The running batch goes back to the front of the queue as it was (not the calls' fault:
    /// same attempt, same order), without `except` (a call whose caller left).
    pub(super) fn requeue_running(&mut self, except: Option<CallId>) {
        for call in std::mem::take(&mut self.running).into_iter().rev().filter(|c| Some(*c) != except) {
            self.queue.push_front(call);
        }
    }

    /// A failure of `call` alone: its first goes back to the front of the queue to run alone,
    /// its second makes it leave.
    pub(super) fn retry(&mut self, call: CallId) -> Retry {
        match self.calls.get_mut(&call) {
            Some(c) if c.attempt == 0 => {
                c.attempt = 1;
                c.alone = true;
                self.queue.push_front(call);
                Retry::Again
            }
            Some(_) => {
                self.calls.remove(&call);
                Retry::Spent
            }
            None => Retry::Gone,
        }
    }

    /// Every queued call leaves the queue (to be refused), in order.
    pub(super) fn drain_queue(&mut self) -> Vec<CallId> {
        let drained: Vec<CallId> = self.queue.drain(..).collect();
        for call in &drained {
            self.calls.remove(call);
        }
        drained
    }

    /// The queued calls whose deadline has passed leave the queue (to be answered `Expired`).
    pub(super) fn expire(&mut self, now: Instant) -> Vec<CallId> {
        let expired: Vec<CallId> =
            self.queue.iter().copied().filter(|c| self.calls.get(c).is_some_and(|i| i.expired(now))).collect();
        for call in &expired {
            self.queue.retain(|c| c != call);
            self.calls.remove(call);
        }
        expired
    }

    /// The queued calls that have waited `wait` for a worker (counted from `since`, when no
    /// worker served any more, at the earliest) leave the queue (to be refused).
    pub(super) fn waited(&mut self, now: Instant, since: Instant, wait: Duration) -> Vec<CallId> {
        let mut gone = Vec::new();
        let mut kept = VecDeque::new();
        for call in std::mem::take(&mut self.queue) {
            match self.calls.get(&call) {
                Some(c) if c.since.max(since) + wait <= now => {
                    self.calls.remove(&call);
                    gone.push(call);
                }
                Some(_) => kept.push_back(call),
                None => {}
            }
        }
        self.queue = kept;
        gone
    }

    /// When the oldest queued call was submitted.
    pub(super) fn oldest(&self) -> Option<Instant> {
        self.queue.iter().find_map(|c| self.calls.get(c)).map(|c| c.since)
    }

    /// Whether the queue holds too few rows for a round of `parallel` contexts and nothing that
    /// must run alone: what an idle primary may wait for company for (the gathering window).
    pub(super) fn short_of_a_round(&self, now: Instant, parallel: usize) -> bool {
        let mut rows = 0;
        for call in &self.queue {
            match self.calls.get(call) {
                Some(c) if c.alone => return false,
                Some(c) if !c.expired(now) => rows += c.rows,
                _ => {}
            }
            if rows >= parallel {
                return false;
            }
        }
        rows > 0
    }
}
