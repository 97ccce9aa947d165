//! The service thread's own work on questions (laying a request out, deciding and encoding its
//! reply), done one job at a time, their clients in turn.
//!
//! Why: the service runs on one thread, whose tasks take their turns in the order they were
//! woken. A flood's questions are woken many at once (a batch answered, places given back), and
//! when each did its work in its own task, another client's question waited behind all of
//! them at each step (measured: 3 ms at the median before its task first ran, beside a flood
//! of 32 questions in progress; BENCHMARKS.md). Here a question's task hands its work to the
//! workshop and waits: the tasks themselves take moments each, and the workshop does one job
//! and then lets the others run, picking the next job from the clients in turn
//! ([`Turns`], the waiting room's order): another client's job waits for at most one of
//! each other client's.
//!
//! Large requests are laid out in the blocking pool instead (`question`), and the jobs
//! here are the small ones, so a job holds the thread for moments.

use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, oneshot};

use super::flow::{ClientKey, Turns};

type Job = Box<dyn FnOnce() + Send>;

/// Jobs waiting, by client, and the signal that one arrived.
#[derive(Default)]
pub struct Workshop {
    jobs: Mutex<Turns<Job>>,
    arrived: Notify,
}

/// The workshop stopped (its task ended with the runtime) before it did a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the service is stopping")]
pub struct Closed;

impl Workshop {
    fn jobs(&self) -> std::sync::MutexGuard<'_, Turns<Job>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Does `job` for `client` in `client`'s turn, in the caller's span: its result.
    pub async fn run<R: Send + 'static>(
        &self,
        client: ClientKey,
        job: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, Closed> {
        let (done, result) = oneshot::channel();
        // The job is the caller's work: its log lines are in the caller's span (the question's).
        let span = tracing::Span::current();
        self.jobs().push(
            client,
            Box::new(move || {
                let _entered = span.enter();
                let _ = done.send(job());
            }),
        );
        self.arrived.notify_one();
        result.await.map_err(|_| Closed)
    }

    /// Does the jobs as they come, one per turn of the thread; runs until its task is dropped.
    pub async fn serve(self: Arc<Self>) {
        loop {
            let next = self.jobs().pop();
            match next {
                Some(job) => {
                    job();
                    // The thread's other tasks run before the next job (tokio runs a yielded
                    // task again once the run queue is empty or it polls for I/O): the tasks
                    // handing jobs in are among them, so a client that just asked has its job
                    // in the round before the next one is picked.
                    tokio::task::yield_now().await;
                }
                // A job pushed since `pop` left a permit: this returns at once.
                None => self.arrived.notified().await,
            }
        }
    }

    /// Jobs waiting.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.jobs().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn another_clients_job_is_done_second_not_behind_a_flood_handed_in_before_it() {
        let workshop = Arc::new(Workshop::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let job = |client: &'static str, n: usize| {
            let (workshop, order) = (workshop.clone(), order.clone());
            tokio::spawn(async move {
                workshop.run(ClientKey::named(client), move || order.lock().unwrap().push(format!("{client}{n}"))).await
            })
        };
        // The flood's jobs, then the other client's, all handed in before the workshop runs.
        let mut tasks: Vec<_> = (0..10).map(|n| job("flood", n)).collect();
        tasks.push(job("other", 0));
        while workshop.waiting() != 11 {
            tokio::task::yield_now().await;
        }
        let serving = tokio::spawn(workshop.clone().serve());
        for t in tasks {
            assert_eq!(t.await.expect("the task"), Ok(()));
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(order.len(), 11, "{order:?}");
        assert_eq!(order[..2], ["flood0".to_owned(), "other0".to_owned()], "{order:?}");
        serving.abort();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_job_handed_in_while_the_workshop_idles_is_done_and_its_result_returned() {
        let workshop = Arc::new(Workshop::default());
        let serving = tokio::spawn(workshop.clone().serve());
        // The workshop is waiting for work.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        for n in 0..3 {
            assert_eq!(workshop.run(ClientKey::named("a"), move || n * 2).await, Ok(n * 2));
        }
        serving.abort();
    }
}
