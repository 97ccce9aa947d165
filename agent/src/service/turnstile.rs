//! Turns by client at something of the service that only so many tasks may use at once: the
//! async side of [`flow::Outlet`](super::flow::Outlet) (which decides, without I/O, who goes
//! next).
//!
//! A task passes the turnstile before it uses the thing; past the limit it waits, its client's
//! tasks in arrival order, the clients in turn: another client's task waits for at most one of
//! each other client's, and those already going. The delivery gate's way out (replies and
//! acknowledgements handed to the connection) is one.

use std::sync::Mutex;

use tokio::sync::oneshot;

use super::flow::{ClientKey, Outlet};

/// Lets `limit` go at once, the rest in their clients' turns.
#[derive(Debug)]
pub struct Turnstile {
    outlet: Mutex<Outlet<oneshot::Sender<()>>>,
}

/// A turn: the next in turn gets it when this is dropped.
#[must_use = "the turn is given on when dropped"]
#[derive(Debug)]
pub struct Pass<'a> {
    turnstile: &'a Turnstile,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.turnstile.pass_on();
    }
}

/// A task waiting for its [`Pass`]. Dropped before it was used (its task ended), a pass it was
/// already given goes on to the next.
struct Waiting<'a> {
    turnstile: &'a Turnstile,
    turn: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(mut turn) = self.turn.take() {
            // Closed first: from here no pass can be given to it, and one given before is seen.
            turn.close();
            if turn.try_recv().is_ok() {
                self.turnstile.pass_on();
            }
        }
    }
}

impl Turnstile {
    /// A turnstile that lets `limit` (at least one) through at once.
    pub fn new(limit: usize) -> Turnstile {
        Turnstile { outlet: Mutex::new(Outlet::new(limit)) }
    }

    fn outlet(&self) -> std::sync::MutexGuard<'_, Outlet<oneshot::Sender<()>>> {
        self.outlet.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for `client`'s turn.
    pub async fn pass(&self, client: ClientKey) -> Pass<'_> {
        let (give, turn) = oneshot::channel();
        if self.outlet().ready(client, give).is_some() {
            return Pass { turnstile: self };
        }
        let mut waiting = Waiting { turnstile: self, turn: Some(turn) };
        if let Some(turn) = waiting.turn.as_mut() {
            // Never dropped unanswered: the outlet keeps the sender until it passes it on.
            let _ = turn.await;
        }
        waiting.turn = None;
        Pass { turnstile: self }
    }

    /// A pass is free: to the next in turn that still waits.
    fn pass_on(&self) {
        loop {
            let Some(next) = self.outlet().gone() else { return };
            if next.send(()).is_ok() {
                return;
            }
            // That task ended while it waited: the pass goes on.
        }
    }

    /// How many hold a pass now, and how many wait.
    pub fn counts(&self) -> (usize, usize) {
        self.outlet().counts()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn another_clients_task_passes_second_not_behind_a_flood_woken_before_it() {
        let gate = Arc::new(Turnstile::new(1));
        let order = Arc::new(Mutex::new(Vec::new()));
        let held = gate.pass(ClientKey::named("flood")).await;
        let step = |client: &'static str, n: usize| {
            let (gate, order) = (gate.clone(), order.clone());
            tokio::spawn(async move {
                let _pass = gate.pass(ClientKey::named(client)).await;
                order.lock().unwrap().push(format!("{client}{n}"));
            })
        };
        let mut tasks: Vec<_> = (0..10).map(|n| step("flood", n)).collect();
        tasks.push(step("other", 0));
        // Every task is waiting for its turn.
        while gate.counts() != (1, 11) {
            tokio::task::yield_now().await;
        }
        drop(held);
        for t in tasks {
            t.await.expect("passed");
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(order.len(), 11, "{order:?}");
        assert_eq!(order[..2], ["flood0".to_owned(), "other0".to_owned()], "{order:?}");
        assert_eq!(gate.counts(), (0, 0), "every pass given back");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_task_that_ends_while_it_waits_hands_its_turn_on() {
        let gate = Arc::new(Turnstile::new(1));
        let held = gate.pass(ClientKey::named("a")).await;
        let gone = tokio::spawn({
            let gate = gate.clone();
            async move {
                let _pass = gate.pass(ClientKey::named("b")).await;
            }
        });
        let next = tokio::spawn({
            let gate = gate.clone();
            async move {
                let _pass = gate.pass(ClientKey::named("c")).await;
            }
        });
        while gate.counts() != (1, 2) {
            tokio::task::yield_now().await;
        }
        // The pass goes to `b` as `b`'s task is aborted: it must reach `c` all the same.
        gone.abort();
        drop(held);
        tokio::time::timeout(std::time::Duration::from_secs(20), next).await.expect("c passed").expect("c");
        assert_eq!(gate.counts(), (0, 0));
    }
}
