//! The supervisor's scenarios, run in [`Sim`]: a supervisor fed events on a simulated clock
//! that fires its timers in order, so every policy is checked without processes or waiting.

use super::*;
use crate::backend::LoadFailure;

struct Sim {
    sup: Supervisor,
    now: Instant,
    timers: BTreeMap<u8, (Instant, Timer)>,
    log: Vec<Action>,
}

impl Sim {
    fn new(policy: Policy) -> Sim {
        let mut s = Sim { sup: Supervisor::new(policy), now: Instant::now(), timers: BTreeMap::new(), log: Vec::new() };
        s.feed(Event::Start);
        s
    }

    fn feed(&mut self, e: Event) -> Vec<Action> {
        let actions = self.sup.handle(self.now, e);
        for a in &actions {
            if let Action::SetTimer(t, after) = a {
                self.timers.insert(timer_slot(t.kind), (self.now + *after, *t));
            }
        }
        self.log.extend(actions.clone());
        actions
    }

    /// Advances the clock, firing due timers in order.
    fn advance(&mut self, by: Duration) -> Vec<Action> {
        let until = self.now + by;
        let mut out = Vec::new();
        loop {
            let next = self.timers.iter().map(|(k, (at, t))| (*at, *k, *t)).min_by_key(|x| x.0);
            match next {
                Some((at, k, t)) if at <= until => {
                    self.timers.remove(&k);
                    self.now = self.now.max(at);
                    out.extend(self.feed(Event::Timer(t)));
                }
                _ => break,
            }
        }
        self.now = until;
        out
    }

    /// The most recently spawned worker.
    fn worker(&self) -> WorkerId {
        self.log.iter().rev().find_map(|a| if let Action::Spawn(w, _) = a { Some(*w) } else { None }).unwrap()
    }

    fn submit(&mut self, call: CallId, rows: usize) -> Vec<Action> {
        self.submit_as(Asker::default(), call, rows)
    }

    fn submit_as(&mut self, asker: Asker, call: CallId, rows: usize) -> Vec<Action> {
        self.feed(Event::Submit { call, rows, units: rows as f64, deadline: None, probe: false, asker })
    }

    /// A one-row call whose caller waits until `deadline`.
    fn submit_until(&mut self, call: CallId, deadline: Option<Instant>) -> Vec<Action> {
        self.feed(Event::Submit { call, rows: 1, units: 1.0, deadline, probe: false, asker: Asker::default() })
    }

    /// The periodic probe's call of `rows` one-unit rows.
    fn submit_probe(&mut self, call: CallId, rows: usize) -> Vec<Action> {
        let units = rows as f64;
        self.feed(Event::Submit { call, rows, units, deadline: None, probe: true, asker: Asker::default() })
    }

    /// One-row calls `calls` on worker `w`, each answered `took` after it was submitted.
    fn one_row_calls(&mut self, w: WorkerId, calls: std::ops::RangeInclusive<CallId>, took: Duration) {
        for call in calls {
            self.submit(call, 1);
            self.now += took;
            self.feed(Event::Done(w, call));
        }
    }

    /// The latest worker reports ready and passes its health call `health_ms` later.
    fn ready_and_healthy(&mut self, health_ms: u64) -> Vec<Action> {
        let w = self.worker();
        let a = self.feed(Event::Ready(w));
        assert!(a.contains(&Action::Health(w)), "{a:?}");
        self.now += Duration::from_millis(health_ms);
        self.feed(Event::Done(w, HEALTH_CALL))
    }

    fn spawns(&self) -> usize {
        self.log.iter().filter(|a| matches!(a, Action::Spawn(..))).count()
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn healthy_policy() -> Policy {
    Policy { health_rows: 2, ..Policy::default() }
}

#[test]
fn a_call_waits_for_the_health_call_then_is_sent_and_delivered() {
    let mut s = Sim::new(healthy_policy());
    // Nothing is sent; only the timer of how long it may wait for the worker is armed.
    assert!(only_the_wait_timer(&s.submit(1, 1)));
    let w = s.worker();
    assert_eq!(s.feed(Event::Ready(w))[0], Action::Health(w));
    assert_eq!(s.sup.backend_state(), BackendState::Starting);
    let a = s.feed(Event::Done(w, HEALTH_CALL));
    assert_eq!(a[0], Action::Send(w, vec![1]));
    assert_eq!(s.sup.backend_state(), BackendState::Ready);
    assert_eq!(s.feed(Event::Done(w, 1)), [Action::Deliver(1)]);
    assert_eq!(s.sup.state(), WorkerState::Idle);
}

#[test]
fn a_hung_call_is_killed_at_its_deadline_rerun_once_then_quarantined() {
    let mut s = Sim::new(Policy { fixed_deadline: Some(secs(2)), ..healthy_policy() });
    s.ready_and_healthy(1);
    s.submit(7, 1);
    let w = s.worker();
    let a = s.advance(ms(2001));
    assert_eq!(a[0], Action::Kill(w));
    assert_eq!(a[1], Action::Restarted(Role::Primary, RestartReason::Deadline(secs(2))));
    // Backoff, a new worker, its health call, and the same call again.
    s.advance(ms(100));
    assert_eq!(s.spawns(), 2);
    let a = s.ready_and_healthy(1);
    assert_eq!(a[0], Action::Send(s.worker(), vec![7]));
    let a = s.advance(secs(3));
    let quarantined = a.iter().any(
        |x| matches!(x, Action::Reject(7, EngineError::Quarantined(m)) if m.contains("missed its deadline (2000 ms)")),
    );
    assert!(quarantined, "{a:?}");
    assert_eq!(s.sup.restart_counts()["deadline"], 2);
}

#[test]
fn a_crash_mid_call_restarts_and_the_call_succeeds_on_the_new_worker() {
    let mut s = Sim::new(healthy_policy());
    s.ready_and_healthy(1);
    s.submit(3, 1);
    let w = s.worker();
    let a = s.feed(Event::Exited(w, "signal 6".into()));
    assert!(!a.contains(&Action::Kill(w)), "a dead worker is reaped, not killed: {a:?}");
    assert_eq!(s.sup.state(), WorkerState::Backoff);
    s.advance(ms(100));
    let w2 = s.worker();
    assert_ne!(w, w2);
    // The health call comes first, the re-run right after it passes.
    assert_eq!(s.feed(Event::Ready(w2))[0], Action::Health(w2));
    let a = s.feed(Event::Done(w2, HEALTH_CALL));
    assert!(matches!(a.as_slice(), [Action::Send(x, c), Action::SetTimer(..)] if *x == w2 && *c == [3]), "{a:?}");
    assert_eq!(s.feed(Event::Done(w2, 3)), [Action::Deliver(3)]);
}

#[test]
fn backoff_doubles_up_to_its_ceiling() {
    let mut s = Sim::new(Policy { max_restarts: 100, ..Policy::default() });
    let mut waits = Vec::new();
    for _ in 0..12 {
        let w = s.worker();
        for x in s.feed(Event::Exited(w, "exit 3".into())) {
            if let Action::SetTimer(Timer { kind: TimerKind::Backoff, .. }, d) = x {
                waits.push(d);
            }
        }
        s.advance(secs(31));
    }
    assert_eq!(waits[0], ms(100));
    assert_eq!(waits[1], ms(200));
    assert_eq!(*waits.last().unwrap(), secs(30));
}

#[test]
fn a_transient_error_is_retried_once_and_an_input_error_is_the_callers() {
    let mut s = Sim::new(healthy_policy());
    s.ready_and_healthy(1);
    let w = s.worker();
    s.submit(1, 1);
    assert_eq!(s.feed(Event::Failed(w, 1, BackendError::Transient("ssr".into())))[0], Action::Send(w, vec![1]));
    assert_eq!(
        s.feed(Event::Failed(w, 1, BackendError::Transient("ssr".into())))[0],
        Action::Reject(1, EngineError::Unavailable("ssr".into()))
    );
    s.submit(2, 1);
    assert_eq!(
        s.feed(Event::Failed(w, 2, BackendError::Input("bad".into())))[0],
        Action::Reject(2, EngineError::Input("bad".into()))
    );
    assert!(s.sup.restart_counts().is_empty());
}

#[test]
fn without_a_fallback_six_crashes_refuse_with_the_cause_then_the_retry_recovers_with_no_restart() {
    let mut s = Sim::new(Policy { primary_retry: secs(20), ..healthy_policy() });
    s.ready_and_healthy(1);
    for i in 0..6 {
        let w = s.worker();
        let a = s.feed(Event::Exited(w, "signal 9".into()));
        if i < 5 {
            assert!(!s.sup.degraded(), "{a:?}");
            s.advance(secs(1));
            s.ready_and_healthy(1);
        } else {
            let degraded = a.iter().any(|x| matches!(x, Action::Notify(n) if n.kind == NoticeKind::BackendDegraded));
            assert!(degraded, "{a:?}");
        }
    }
    assert_eq!(s.sup.backend_state(), BackendState::Degraded);
    s.advance(secs(5));
    // Refused at once, with the root cause and the time of the next try.
    match s.submit(1, 1).as_slice() {
        [Action::Reject(1, EngineError::Unavailable(m))] => {
            assert!(m.contains("signal 9") && m.contains("6 restarts") && m.contains("next try in 15 s"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    // The retry: a fresh worker gets the health call before any question.
    let a = s.advance(secs(15));
    assert!(a.iter().any(|x| matches!(x, Action::Spawn(_, Role::Primary))), "{a:?}");
    match s.submit(2, 1).as_slice() {
        [Action::Reject(2, EngineError::Unavailable(m))] => assert!(m.contains("health-checked now"), "{m}"),
        other => panic!("{other:?}"),
    }
    let a = s.ready_and_healthy(1);
    assert!(a.iter().any(|x| matches!(x, Action::Notify(n) if n.kind == NoticeKind::BackendRecovered)), "{a:?}");
    assert_eq!(s.sup.backend_state(), BackendState::Ready);
    s.submit(3, 1);
    assert_eq!(s.feed(Event::Done(s.worker(), 3)), [Action::Deliver(3)]);
}

#[test]
fn a_degraded_primary_is_retried_for_ever_through_every_kind_of_failed_try() {
    let mut s = Sim::new(Policy { max_restarts: 0, primary_retry: secs(10), ..healthy_policy() });
    let w = s.worker();
    s.feed(Event::LoadFailed(w, "no DSP".into()));
    assert!(s.sup.degraded());
    // Tries that fail in each way: load failure, never ready, hung health call, crash, fatal.
    for i in 0..5 {
        let a = s.advance(secs(10));
        let w = s.worker();
        assert!(a.contains(&Action::Spawn(w, Role::Primary)), "try {i}: {a:?}");
        match i {
            0 => drop(s.feed(Event::LoadFailed(w, "no DSP".into()))),
            1 => drop(s.advance(secs(120))),
            2 => {
                s.feed(Event::Ready(w));
                s.advance(secs(60));
            }
            3 => drop(s.feed(Event::Exited(w, "signal 11".into()))),
            _ => {
                s.feed(Event::Ready(w));
                s.feed(Event::Failed(w, HEALTH_CALL, BackendError::Fatal { code: Some(3), message: "x".into() }));
            }
        }
        assert!(s.sup.degraded(), "try {i}");
    }
    s.advance(secs(10));
    s.ready_and_healthy(1);
    assert!(!s.sup.degraded());
}

#[test]
fn a_candidate_primary_starts_beside_the_serving_fallback_and_takes_over_only_after_its_health_call() {
    let mut s = Sim::new(Policy { fallback: true, max_restarts: 2, primary_retry: secs(60), ..healthy_policy() });
    for _ in 0..3 {
        let w = s.worker();
        s.feed(Event::Exited(w, "signal 11".into()));
        s.advance(secs(1));
    }
    assert!(s.sup.degraded());
    assert_eq!(s.sup.role(), Role::Fallback);
    let fallback = s.worker();
    assert!(s.log.contains(&Action::Spawn(fallback, Role::Fallback)));
    s.ready_and_healthy(1);
    s.submit(5, 1);
    assert_eq!(s.feed(Event::Done(fallback, 5)), [Action::Deliver(5)]);
    // The retry: a candidate primary starts, the fallback is not touched.
    let a = s.advance(secs(60));
    let candidate = s.worker();
    assert_eq!(a.iter().filter(|x| matches!(x, Action::Spawn(..))).count(), 1);
    assert!(a.contains(&Action::Spawn(candidate, Role::Primary)) && !a.contains(&Action::Kill(fallback)));
    // It hangs while loading: the fallback keeps answering meanwhile.
    s.submit(6, 1);
    assert_eq!(s.feed(Event::Done(fallback, 6)), [Action::Deliver(6)]);
    let a = s.advance(secs(120));
    assert!(a.contains(&Action::Kill(candidate)) && !a.contains(&Action::Kill(fallback)), "{a:?}");
    // The next candidate passes its health call while the fallback is busy: it takes over
    // and runs the interrupted call.
    s.advance(secs(60));
    let candidate = s.worker();
    s.submit(7, 1);
    s.feed(Event::Ready(candidate));
    let a = s.feed(Event::Done(candidate, HEALTH_CALL));
    assert!(a.contains(&Action::Kill(fallback)) && a.contains(&Action::Send(candidate, vec![7])), "{a:?}");
    assert_eq!(s.sup.role(), Role::Primary);
    assert!(!s.sup.degraded());
}

#[test]
fn a_crash_looping_fallback_is_restarted_for_ever_and_questions_are_refused_while_it_is_down() {
    let mut s = Sim::new(Policy { fallback: true, max_restarts: 0, primary_retry: secs(3600), ..healthy_policy() });
    let w = s.worker();
    s.feed(Event::Exited(w, "signal 11".into()));
    for _ in 0..20 {
        let f = s.worker();
        s.feed(Event::Exited(f, "signal 6".into()));
        assert!(matches!(s.submit(9, 1)[0], Action::Reject(9, EngineError::Unavailable(_))));
        s.advance(secs(31));
    }
    let f = s.worker();
    assert!(s.log.contains(&Action::Spawn(f, Role::Fallback)));
    s.ready_and_healthy(1);
    s.submit(10, 1);
    assert_eq!(s.feed(Event::Done(f, 10)), [Action::Deliver(10)]);
}

#[test]
fn after_the_health_call_a_hang_is_detected_within_max_1s_4x_expected_and_big_calls_scale_by_rows() {
    let mut s = Sim::new(healthy_policy());
    // Nothing known yet: the health call gets the load allowance.
    let w = s.worker();
    s.feed(Event::Ready(w));
    assert_eq!(s.sup.health_deadline(), secs(60));
    s.now += ms(2);
    s.feed(Event::Done(w, HEALTH_CALL));
    assert_eq!(s.sup.deadline(1), secs(1));
    // Six one-question calls at 200 ms, then an 8-question call at 200 ms per row: not killed.
    s.one_row_calls(w, 1..=6, ms(200));
    assert_eq!(s.sup.deadline(1), ms(800).max(secs(1)));
    s.submit(7, 8);
    let a = s.advance(ms(1600));
    assert!(!a.iter().any(|x| matches!(x, Action::Kill(_))), "{a:?}");
    assert_eq!(s.feed(Event::Done(w, 7)), [Action::Deliver(7)]);
    // A hang on a one-question call is detected at max(1 s, 4 x 200 ms).
    s.submit(8, 1);
    let a = s.advance(ms(999));
    assert!(a.is_empty(), "{a:?}");
    assert!(s.advance(ms(2)).contains(&Action::Kill(w)));
    // expected_ms seeds the estimate before samples exist.
    let s = Sim::new(Policy { expected_per_row: Some(ms(500)), ..healthy_policy() });
    assert_eq!(s.sup.deadline(3), secs(6));
    // The health call's first row is the worker's first inference: the load allowance; the
    // second row gets a row's deadline (issue #31: the allowance is a row's, not the call's).
    assert_eq!(s.sup.health_deadline(), secs(60) + secs(2));
}

#[test]
fn an_expired_call_never_reaches_the_worker_and_the_queue_is_bounded() {
    let mut s = Sim::new(Policy { queue_limit: 3, ..healthy_policy() });
    s.ready_and_healthy(1);
    let w = s.worker();
    s.submit(1, 1);
    let soon = Some(s.now + ms(100));
    s.submit_until(2, soon);
    s.submit_until(3, soon);
    assert_eq!(s.sup.in_flight(), 3);
    assert!(matches!(s.submit(4, 1)[0], Action::Reject(4, EngineError::Overloaded(_))));
    s.now += ms(200);
    // The tick drops the expired calls from the queue; the running one is not affected.
    let a = s.feed(Event::Tick);
    assert_eq!(a, [Action::Reject(2, EngineError::Expired), Action::Reject(3, EngineError::Expired)]);
    assert_eq!(s.sup.in_flight(), 1);
    s.submit_until(5, Some(s.now + ms(10)));
    s.submit(6, 1);
    s.now += ms(50);
    // Call 5 expired while call 1 ran: it is refused, call 6 goes to the worker.
    let a = s.feed(Event::Done(w, 1));
    assert_eq!(a[..3], [Action::Deliver(1), Action::Reject(5, EngineError::Expired), Action::Send(w, vec![6])]);
    // A caller that went away: its queued call is dropped too.
    s.submit(7, 1);
    s.feed(Event::Cancelled(7));
    assert_eq!(s.sup.in_flight(), 1);
    let now = Some(s.now);
    assert!(matches!(s.submit_until(8, now)[0], Action::Reject(8, EngineError::Expired)));
}

#[test]
fn requests_that_kill_the_worker_twice_are_quarantined_and_count_once() {
    let mut s = Sim::new(Policy { max_restarts: 5, ..healthy_policy() });
    s.ready_and_healthy(1);
    // Three poisonous requests: each crashes its worker twice.
    for call in 1..=3 {
        s.submit(call, 1);
        for attempt in 0..2 {
            let w = s.worker();
            let a = s.feed(Event::Exited(w, "signal 9".into()));
            if attempt == 1 {
                assert!(a.iter().any(|x| matches!(x, Action::Reject(c, EngineError::Quarantined(_)) if *c == call)));
            }
            // Past the backoff, well inside `ready_wait` (the question waits for the worker).
            s.advance(secs(1));
            s.ready_and_healthy(1);
        }
    }
    assert!(!s.sup.degraded(), "3 quarantined requests count 3 restarts, not 6");
    assert_eq!(s.sup.restart_counts()["crash"], 6);
    s.submit(4, 1);
    assert_eq!(s.feed(Event::Done(s.worker(), 4)), [Action::Deliver(4)]);
}

#[test]
fn a_fatal_errors_code_name_and_message_travel_to_the_restart_and_the_refusal() {
    let mut s = Sim::new(Policy { max_restarts: 0, ..healthy_policy() });
    s.ready_and_healthy(1);
    s.submit(1, 1);
    let message = "rknn_run: RKNN_ERR_TIMEOUT (-7): the NPU timed out".to_owned();
    let a = s.feed(Event::Failed(s.worker(), 1, BackendError::Fatal { code: Some(-7), message: message.clone() }));
    let reason = RestartReason::Fatal { code: Some(-7), message: message.clone() };
    assert!(a.contains(&Action::Restarted(Role::Primary, reason.clone())), "{a:?}");
    assert_eq!(reason.name().as_deref(), Some("RKNN_ERR_TIMEOUT"));
    assert_eq!(RestartReason::Fatal { code: Some(3), message: "x (3)".into() }.name(), None);
    let degraded = a.iter().find_map(|x| match x {
        Action::Notify(n) if n.kind == NoticeKind::BackendDegraded => Some(n.clone()),
        _ => None,
    });
    assert_eq!(degraded.and_then(|n| n.reason), Some(reason));
    match s.submit(2, 1).as_slice() {
        [Action::Reject(2, EngineError::Unavailable(m))] => assert!(m.contains("the NPU timed out"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_worker_that_never_becomes_ready_is_restarted() {
    let mut s = Sim::new(Policy { startup_timeout: secs(10), ..Policy::default() });
    let w = s.worker();
    let a = s.advance(secs(11));
    assert!(a.contains(&Action::Kill(w)), "{a:?}");
    assert!(matches!(s.sup.restart_counts().get("load_failed"), Some(1)));
}

#[test]
fn the_deadline_follows_recent_calls_within_its_bounds() {
    let mut s = Sim::new(Policy::default());
    let w = s.worker();
    s.feed(Event::Ready(w));
    assert_eq!(s.sup.deadline(1), secs(30));
    s.one_row_calls(w, 1..=20, ms(500));
    assert_eq!(s.sup.deadline(1), secs(2));
    s.one_row_calls(w, 21..=30, ms(10));
    // 4 x p99 is still the 500 ms rows' 2 s; fast calls alone would clamp at 1 s.
    assert_eq!(s.sup.deadline(1), secs(2));
    assert_eq!(s.sup.deadline(4), secs(8));
}

#[test]
fn a_primary_running_three_rows_side_by_side_is_timed_per_round_so_a_one_row_call_keeps_a_jobs_deadline() {
    // An NPU job takes 600 ms; three contexts run three rows in one job's time.
    let mut s = Sim::new(Policy { primary_parallel: 3, ..healthy_policy() });
    let w = s.worker();
    s.ready_and_healthy(600); // the two health rows ran side by side: one job
    for call in 1..=10 {
        s.submit(call, 3);
        s.now += ms(600);
        s.feed(Event::Done(w, call));
    }
    // Per-row times of 200 ms would give a one-row call 800 ms, less than two jobs'
    // margin; per round, it gets 4 x 600 ms.
    assert_eq!(s.sup.deadline(1), ms(2400));
    assert!(s.sup.deadline(3) >= ms(2400));
}

#[test]
fn a_row_on_a_graph_twice_as_long_counts_twice_in_the_deadline_and_in_the_estimate_but_a_fixed_deadline_stays_per_row()
{
    // The health call's two short rows take 100 ms each; a row on the bundle's 256-token graph
    // costs two on its 128-token one. The probe's call: 32 short rows and 32 long ones, 9.6 s.
    let mut s = Sim::new(healthy_policy());
    let w = s.worker();
    s.ready_and_healthy(200);
    assert_eq!(s.sup.deadline_of(Size { rows: 32, units: 32.0 }), ms(12_800));
    // Counted as 64 short rows it would get 25.6 s, not 4 x its own time.
    assert_eq!(s.sup.deadline_of(Size { rows: 64, units: 96.0 }), ms(38_400));
    for call in 1..=5 {
        s.feed(Event::Submit { call, rows: 64, units: 96.0, deadline: None, probe: false, asker: Asker::default() });
        s.now += ms(9_600);
        let a = s.feed(Event::Done(w, call));
        assert!(a.contains(&Action::Deliver(call)), "{a:?}");
    }
    // Measured per unit, the mixed calls say 100 ms a short row, as the health call did.
    assert_eq!(s.sup.deadline(10), secs(4));
    assert_eq!(s.sup.deadline_of(Size { rows: 10, units: 20.0 }), secs(8));

    let fixed = Sim::new(Policy { fixed_deadline: Some(secs(2)), ..healthy_policy() });
    assert_eq!(fixed.sup.deadline_of(Size { rows: 2, units: 4.0 }), secs(4), "deadline_ms is per question");
}

fn policy_of(s: &Sim) -> Policy {
    s.sup.policy.clone()
}

fn merging_policy() -> Policy {
    Policy { merge_rows: 4, fixed_deadline: Some(secs(2)), ..healthy_policy() }
}

/// The calls of the batches sent, in order.
fn sends(actions: &[Action]) -> Vec<Vec<CallId>> {
    actions.iter().filter_map(|a| if let Action::Send(_, c) = a { Some(c.clone()) } else { None }).collect()
}

/// Answers every batch the worker `w` gets until none is left; returns the batches.
fn answer_all(s: &mut Sim, w: WorkerId, first: Vec<Action>) -> Vec<Vec<CallId>> {
    let mut batches = sends(&first);
    let mut i = 0;
    while i < batches.len() {
        let a = s.feed(Event::Done(w, batches[i][0]));
        batches.extend(sends(&a));
        i += 1;
    }
    batches
}

#[test]
fn calls_queued_behind_a_busy_worker_go_together_in_queue_order_up_to_the_row_cap() {
    let mut s = Sim::new(merging_policy());
    s.ready_and_healthy(1);
    let w = s.worker();
    assert_eq!(sends(&s.submit(1, 1)), [vec![1]]);
    for (call, rows) in [(2, 1), (3, 2), (4, 1), (5, 1)] {
        assert_eq!(sends(&s.submit(call, rows)), Vec::<Vec<CallId>>::new());
    }
    assert_eq!((s.sup.in_flight(), s.sup.queued()), (5, 4));
    // Call 1 answered: calls 2, 3 and 4 (four rows, the cap) go as one batch, under the
    // deadline of four rows; call 5 waits.
    let a = s.feed(Event::Done(w, 1));
    assert_eq!(a[..2], [Action::Deliver(1), Action::Send(w, vec![2, 3, 4])]);
    assert!(a.iter().any(|x| matches!(x, Action::SetTimer(t, d) if t.kind == TimerKind::Deadline && *d == secs(8))));
    assert_eq!((s.sup.in_flight(), s.sup.queued(), s.sup.state()), (4, 1, WorkerState::Busy(2)));
    // The batch's answer is each call's, in order; then call 5.
    s.now += ms(300);
    let a = s.feed(Event::Done(w, 2));
    assert_eq!(a[..4], [Action::Deliver(2), Action::Deliver(3), Action::Deliver(4), Action::Send(w, vec![5])]);
    assert_eq!(s.sup.in_flight(), 1);
    // One call's answer for another call's id is not the batch's.
    assert_eq!(s.feed(Event::Done(w, 3)), []);
    assert_eq!(s.feed(Event::Done(w, 5)), [Action::Deliver(5)]);
    // A call larger than the cap still runs (alone, as any call may).
    s.submit(6, 1);
    s.submit(7, 9);
    s.submit(8, 1);
    assert_eq!(answer_all(&mut s, w, Vec::new()), Vec::<Vec<CallId>>::new());
    let a = s.feed(Event::Done(w, 6));
    assert_eq!(sends(&a), [vec![7]]);
    assert_eq!(answer_all(&mut s, w, a), [vec![7], vec![8]]);
}

#[test]
fn a_newcomers_call_takes_its_turn_before_a_flood_queued_earlier_and_runs_in_a_short_merged_batch() {
    let (flood, newcomer, third) = (Asker(1), Asker(2), Asker(3));
    // One call at a time (the CPU): the flood's calls 2..=6 wait behind call 1; the newcomer's
    // call 7 runs after the flood's first queued call, not after all five.
    let mut s = Sim::new(Policy { merge_rows: 1, ..merging_policy() });
    s.ready_and_healthy(1);
    let w = s.worker();
    let first = s.submit_as(flood, 1, 1);
    for call in 2..=6 {
        s.submit_as(flood, call, 1);
    }
    s.submit_as(newcomer, 7, 1);
    let order: Vec<CallId> = answer_all(&mut s, w, first).into_iter().flatten().collect();
    assert_eq!(order, [1, 2, 7, 3, 4, 5, 6]);
    // Two newcomers later on and a two-row flood: turns count rows, and go round.
    let first = s.submit_as(flood, 10, 2);
    for call in 11..=13 {
        s.submit_as(flood, call, 2);
    }
    s.submit_as(newcomer, 14, 1);
    s.submit_as(third, 15, 1);
    s.submit_as(newcomer, 16, 1);
    let order: Vec<CallId> = answer_all(&mut s, w, first).into_iter().flatten().collect();
    assert_eq!(order, [10, 14, 15, 11, 16, 12, 13]);

    // Merged batches (an NPU) of up to four rows: the newcomer's call is in the next batch, with
    // as many of the flood's rows as its own, so that batch is short; the flood alone fills the
    // next ones again.
    let mut s = Sim::new(merging_policy());
    s.ready_and_healthy(1);
    let w = s.worker();
    let first = s.submit_as(flood, 1, 1);
    for call in 2..=9 {
        s.submit_as(flood, call, 1);
    }
    s.submit_as(newcomer, 10, 1);
    let batches = answer_all(&mut s, w, first);
    assert_eq!(batches, [vec![1], vec![2, 10], vec![3, 4, 5, 6], vec![7, 8, 9]]);
    // Two floods: half of each batch each.
    let mut s = Sim::new(merging_policy());
    s.ready_and_healthy(1);
    let w = s.worker();
    let first = s.submit_as(flood, 1, 1);
    for call in 2..=5 {
        s.submit_as(flood, call, 1);
    }
    for call in 6..=9 {
        s.submit_as(third, call, 1);
    }
    let batches = answer_all(&mut s, w, first);
    assert_eq!(batches, [vec![1], vec![2, 6, 3, 7], vec![4, 8, 5, 9]]);
}

#[test]
fn the_fallback_and_a_policy_without_merging_run_one_call_at_a_time() {
    for policy in [Policy { merge_rows: 1, ..merging_policy() }, Policy { fallback: true, ..merging_policy() }] {
        let fallback = policy.fallback;
        let mut s = Sim::new(policy);
        if fallback {
            s.sup.degraded = Some(Degraded { cause: "test".into(), next_try: s.now + secs(300) });
            let w = s.worker();
            s.feed(Event::Exited(w, "signal 9".into()));
            s.advance(secs(1));
            assert_eq!(s.sup.role(), Role::Fallback);
        }
        s.ready_and_healthy(1);
        let w = s.worker();
        let first = s.submit(1, 1);
        s.submit(2, 1);
        s.submit(3, 1);
        assert_eq!(answer_all(&mut s, w, first), [vec![1], vec![2], vec![3]], "fallback {fallback}");
    }
}

#[test]
fn a_poison_call_merged_with_two_good_ones_is_isolated_through_a_hang_and_a_crash_during_recovery() {
    let mut s = Sim::new(Policy { max_restarts: 4, ..merging_policy() });
    s.ready_and_healthy(1);
    let w = s.worker();
    s.submit(1, 1);
    // Poison 2 queued with the good calls 3 and 4: they go as one batch, which hangs.
    for call in 2..=4 {
        s.submit(call, 1);
    }
    assert_eq!(sends(&s.feed(Event::Done(w, 1))), [vec![2, 3, 4]]);
    let a = s.advance(secs(6) + ms(1));
    assert!(a.contains(&Action::Kill(w)), "{a:?}");
    assert!(!a.iter().any(|x| matches!(x, Action::Reject(..))), "nobody is refused for a merged failure: {a:?}");
    assert_eq!((s.sup.in_flight(), s.sup.queued()), (3, 3));
    // A crash during recovery: the new worker dies before it is ready. Nobody is blamed.
    s.advance(ms(100));
    let a = s.feed(Event::Exited(s.worker(), "signal 11".into()));
    assert!(!a.iter().any(|x| matches!(x, Action::Reject(..) | Action::Send(..))), "{a:?}");
    s.advance(ms(200));
    // The next worker runs the calls alone, in their order: the poison hangs again, alone.
    let a = s.ready_and_healthy(1);
    assert_eq!(sends(&a), [vec![2]]);
    let a = s.advance(secs(2) + ms(1));
    assert!(a.iter().any(|x| matches!(x, Action::Kill(_))), "{a:?}");
    s.advance(secs(1));
    // Its second failure alone quarantines it (a crash this time); the others are answered.
    assert_eq!(sends(&s.ready_and_healthy(1)), [vec![2]]);
    let a = s.feed(Event::Exited(s.worker(), "signal 9".into()));
    assert!(a.iter().any(|x| matches!(x, Action::Reject(2, EngineError::Quarantined(_)))), "{a:?}");
    // A crash of call 3 alone (the runtime's, say) is its first failure, not its second: the
    // merged hang was not counted against it.
    s.advance(secs(2));
    assert_eq!(sends(&s.ready_and_healthy(1)), [vec![3]]);
    let a = s.feed(Event::Exited(s.worker(), "signal 11".into()));
    assert!(!a.iter().any(|x| matches!(x, Action::Reject(..))), "{a:?}");
    s.advance(secs(2));
    let w = s.worker();
    let first = s.ready_and_healthy(1);
    assert_eq!(answer_all(&mut s, w, first), [vec![3], vec![4]]);
    assert!(s.log.contains(&Action::Deliver(3)) && s.log.contains(&Action::Deliver(4)));
    // Four restarts counted (the merged hang, the crash while starting, the poison's first
    // hang alone, call 3's crash); the poison's second failure is its own. Not degraded.
    assert!(!s.sup.degraded());
    assert_eq!(s.sup.in_flight(), 0);
    assert!(!s.log.iter().any(|x| matches!(x, Action::Reject(3 | 4, _))), "{:?}", s.log);
}

#[test]
fn a_row_the_model_refuses_fails_only_its_own_call_of_a_merged_batch() {
    let mut s = Sim::new(merging_policy());
    s.ready_and_healthy(1);
    let w = s.worker();
    s.submit(1, 1);
    for call in 2..=4 {
        s.submit(call, 1);
    }
    assert_eq!(sends(&s.feed(Event::Done(w, 1))), [vec![2, 3, 4]]);
    // The worker reports one error for the whole batch: each call runs again alone.
    let a = s.feed(Event::Failed(w, 2, BackendError::Input("token 99999 out of range".into())));
    assert_eq!(sends(&a), [vec![2]]);
    assert!(!a.iter().any(|x| matches!(x, Action::Reject(..))), "{a:?}");
    assert_eq!(s.feed(Event::Done(w, 2))[..2], [Action::Deliver(2), Action::Send(w, vec![3])]);
    let a = s.feed(Event::Failed(w, 3, BackendError::Input("token 99999 out of range".into())));
    assert_eq!(
        a[..2],
        [Action::Reject(3, EngineError::Input("token 99999 out of range".into())), Action::Send(w, vec![4])]
    );
    assert_eq!(s.feed(Event::Done(w, 4)), [Action::Deliver(4)]);
    // A transient error of a merged batch: the same, and no call loses its retry to it.
    for call in 5..=7 {
        s.submit(call, 1);
    }
    s.submit(8, 1);
    assert_eq!(sends(&s.feed(Event::Done(w, 5))), [vec![6, 7, 8]]);
    assert_eq!(sends(&s.feed(Event::Failed(w, 6, BackendError::Transient("ssr".into())))), [vec![6]]);
    assert_eq!(sends(&s.feed(Event::Failed(w, 6, BackendError::Transient("ssr".into())))), [vec![6]]);
    assert_eq!(sends(&s.feed(Event::Done(w, 6))), [vec![7]]);
    assert!(s.sup.restart_counts().is_empty());
    assert_eq!(s.sup.state(), WorkerState::Busy(7));
}

#[test]
fn cancelled_expired_and_probe_calls_are_never_merged() {
    let mut s = Sim::new(merging_policy());
    s.ready_and_healthy(1);
    let w = s.worker();
    s.submit(1, 1);
    s.submit(2, 1);
    s.submit(3, 1);
    s.submit_until(4, Some(s.now + ms(50)));
    s.submit(5, 1);
    s.submit_probe(6, 1); // the probe
    s.submit(7, 1);
    // The caller of call 3 went away; call 4's deadline passes while call 1 runs.
    s.feed(Event::Cancelled(3));
    s.now += ms(100);
    let a = s.feed(Event::Done(w, 1));
    assert_eq!(a[..3], [Action::Deliver(1), Action::Reject(4, EngineError::Expired), Action::Send(w, vec![2, 5])]);
    // The probe runs alone, and what follows it after it.
    let a = s.feed(Event::Done(w, 2));
    assert_eq!(answer_all(&mut s, w, a), [vec![6], vec![7]]);
    // The driver finds a caller gone as it is about to send a batch: the batch is sent
    // again without it, and the worker is not left waiting for a frame never sent.
    s.submit(8, 1);
    s.submit(9, 1);
    s.submit(10, 1);
    s.submit(11, 1);
    assert_eq!(sends(&s.feed(Event::Done(w, 8))), [vec![9, 10, 11]]);
    let a = s.feed(Event::Cancelled(10));
    assert_eq!(sends(&a), [vec![9, 11]]);
    assert_eq!(s.sup.in_flight(), 2);
    assert_eq!(s.feed(Event::Done(w, 9)), [Action::Deliver(9), Action::Deliver(11)]);
}

#[test]
fn a_merged_batch_on_three_contexts_is_timed_per_round() {
    let mut s = Sim::new(Policy { primary_parallel: 3, merge_rows: 64, ..healthy_policy() });
    let w = s.worker();
    s.ready_and_healthy(600);
    // Six one-row calls at a time, answered together in two rounds of 600 ms.
    let mut call = 0;
    for _ in 0..5 {
        let first = call + 1;
        for _ in 0..7 {
            call += 1;
            s.submit(call, 1);
        }
        s.now += ms(600);
        s.feed(Event::Done(w, first));
        s.now += ms(1200);
        let a = s.feed(Event::Done(w, first + 1));
        assert!(a.starts_with(&[Action::Deliver(first + 1)]) && a.len() == 6, "{a:?}");
    }
    assert_eq!(s.sup.deadline(1), ms(2400));
}

#[test]
fn with_concurrent_callers_an_idle_primary_waits_briefly_to_fill_a_round_of_its_contexts() {
    let policy = Policy { primary_parallel: 3, merge_rows: 64, gather: ms(50), ..healthy_policy() };
    let mut s = Sim::new(policy);
    let w = s.worker();
    s.ready_and_healthy(600);
    // One caller at a time: sent at once, never held back.
    assert_eq!(sends(&s.submit(1, 1)), [vec![1]]);
    s.feed(Event::Done(w, 1));
    assert_eq!(sends(&s.submit(2, 1)), [vec![2]]);
    // Calls queue behind a busy worker: callers are concurrent. When it is free with two
    // rows queued (a round is three), it waits for a third...
    s.submit(3, 1);
    s.submit(4, 1);
    let a = s.feed(Event::Done(w, 2));
    assert!(
        sends(&a).is_empty() && a.iter().any(|x| matches!(x, Action::SetTimer(t, _) if t.kind == TimerKind::Gather))
    );
    assert_eq!(s.sup.state(), WorkerState::Idle);
    // ... which comes: the round is full and goes at once.
    assert_eq!(sends(&s.submit(5, 1)), [vec![3, 4, 5]]);
    s.now += ms(600);
    s.feed(Event::Done(w, 3));
    // Next time nobody comes within the window: what is there goes, and a lone caller is
    // not held back again.
    assert!(sends(&s.submit(6, 1)).is_empty());
    assert_eq!(sends(&s.advance(ms(49))), Vec::<Vec<CallId>>::new());
    assert_eq!(sends(&s.advance(ms(1))), [vec![6]]);
    s.feed(Event::Done(w, 6));
    assert_eq!(sends(&s.submit(7, 1)), [vec![7]]);
    // A probe (alone) waiting ends the wait: nothing is held back behind it.
    s.submit(8, 1);
    assert!(sends(&s.feed(Event::Done(w, 7))).is_empty());
    let a = s.submit_probe(9, 1);
    assert_eq!(sends(&a), [vec![8]]);
    assert_eq!(sends(&s.feed(Event::Done(w, 8))), [vec![9]]);
    // The window is at most a tenth of the per-row estimate.
    let mut s = Sim::new(Policy { gather: ms(50), expected_per_row: Some(ms(100)), ..policy_of(&s) });
    let w = s.worker();
    s.ready_and_healthy(100);
    s.submit(1, 1);
    s.submit(2, 1);
    s.feed(Event::Done(w, 1));
    assert_eq!(sends(&s.advance(ms(10))), [vec![2]]);
}

fn only_the_wait_timer(actions: &[Action]) -> bool {
    matches!(actions, [Action::SetTimer(t, _)] if t.kind == TimerKind::Wait)
}

fn notices(actions: &[Action], kind: NoticeKind) -> Vec<Notice> {
    actions
        .iter()
        .filter_map(|a| if let Action::Notify(n) = a { Some(n.clone()) } else { None })
        .filter(|n| n.kind == kind)
        .collect()
}

/// The latest worker reports ready and gets its health call, which then hangs.
fn ready_and_hanging(s: &mut Sim) -> WorkerId {
    let w = s.worker();
    let a = s.feed(Event::Ready(w));
    assert!(a.contains(&Action::Health(w)), "{a:?}");
    w
}

#[test]
fn a_primary_hanging_in_every_health_call_without_a_fallback_refuses_within_ready_wait_and_degrades_after_three() {
    // The agent's defaults: a 60 s load allowance, 5 restarts in 300 s, 3 failed health
    // calls in a row, questions wait 20 s for a backend that is not serving.
    let mut s = Sim::new(healthy_policy());
    ready_and_hanging(&mut s);
    assert!(only_the_wait_timer(&s.submit(1, 1)));
    // The question is not left in silence: refused after 20 s, with what is going on.
    let a = s.advance(secs(20));
    match a.as_slice() {
        [Action::Reject(1, EngineError::Unavailable(m))] => {
            assert!(m.contains("not ready after 20 s") && m.contains("health call has been running for 20 s"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    let mut kills = 0;
    let mut degraded = Vec::new();
    // Each worker's first row has the 60 s allowance; the third failure in a row degrades,
    // far inside a window where five restarts would never fit.
    for i in 0..3 {
        let a = s.advance(secs(40 + u64::from(i > 0) * 20));
        kills += a.iter().filter(|x| matches!(x, Action::Kill(_))).count();
        degraded.extend(notices(&a, NoticeKind::BackendDegraded));
        if i < 2 {
            s.advance(secs(1));
            ready_and_hanging(&mut s);
        }
    }
    assert_eq!(kills, 3);
    assert_eq!(degraded.len(), 1, "{:?}", s.log);
    assert!(s.sup.degraded());
    match s.submit(2, 1).as_slice() {
        [Action::Reject(2, EngineError::Unavailable(m))] => {
            assert!(m.contains("3 failed health calls in a row") && m.contains("missed its deadline (60000 ms)"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    // The retry's candidate passes: recovered, and its health call reset the count.
    s.advance(secs(300));
    s.ready_and_healthy(5);
    assert!(!s.sup.degraded());
    assert_eq!(s.sup.failed_health, 0);
}

#[test]
fn a_primary_hanging_in_its_health_calls_hands_questions_to_the_fallback_and_recovers_once_a_candidate_passes() {
    let mut s = Sim::new(Policy { fallback: true, primary_retry: secs(60), ..healthy_policy() });
    let first = ready_and_hanging(&mut s);
    s.submit(1, 1);
    // After 20 s of waiting the fallback is started; the primary goes on as the candidate.
    let a = s.advance(secs(20));
    let fallback = s.worker();
    assert!(a.contains(&Action::Spawn(fallback, Role::Fallback)) && !a.contains(&Action::Kill(first)), "{a:?}");
    assert_eq!(notices(&a, NoticeKind::BackendDegraded).len(), 1);
    assert_eq!(s.sup.backend_state(), BackendState::Degraded);
    let a = s.ready_and_healthy(5);
    assert_eq!(sends(&a), [vec![1]]);
    assert_eq!(s.feed(Event::Done(fallback, 1)), [Action::Deliver(1)]);
    // The candidate's allowance runs out 60 s after its health call started: it alone is
    // killed, the fallback serves on.
    let a = s.advance(secs(40));
    assert!(a.contains(&Action::Kill(first)) && !a.contains(&Action::Kill(fallback)), "{a:?}");
    s.submit(2, 1);
    assert_eq!(s.feed(Event::Done(fallback, 2)), [Action::Deliver(2)]);
    // The retry's candidate hangs too: still degraded, the fallback still serves.
    let a = s.advance(secs(60));
    let candidate = s.worker();
    assert!(a.contains(&Action::Spawn(candidate, Role::Primary)), "{a:?}");
    ready_and_hanging(&mut s);
    let a = s.advance(secs(60));
    assert!(a.contains(&Action::Kill(candidate)) && !a.contains(&Action::Kill(fallback)), "{a:?}");
    assert!(s.sup.degraded());
    s.submit(3, 1);
    assert_eq!(s.feed(Event::Done(fallback, 3)), [Action::Deliver(3)]);
    // The next one passes: it takes over.
    s.advance(secs(60));
    let a = s.ready_and_healthy(5);
    assert_eq!(notices(&a, NoticeKind::BackendRecovered).len(), 1, "{a:?}");
    assert!(a.contains(&Action::Kill(fallback)));
    assert_eq!((s.sup.role(), s.sup.backend_state()), (Role::Primary, BackendState::Ready));
}

#[test]
fn a_health_call_that_makes_progress_outlasts_its_load_allowance_and_a_hang_after_progress_is_still_caught() {
    // A CPU fallback's health call with a bundle's probe: 36 rows of 1 s, a 3 s allowance.
    let policy = Policy { health_rows: 36, load_allowance: secs(3), ..Policy::default() };
    let mut s = Sim::new(policy.clone());
    let w = ready_and_hanging(&mut s);
    for done in 1..36 {
        let a = s.advance(secs(1));
        assert!(!a.iter().any(|x| matches!(x, Action::Kill(_))), "row {done}: {a:?}");
        s.feed(Event::Progress(w, HEALTH_CALL, done, 36));
    }
    s.now += secs(1);
    s.feed(Event::Done(w, HEALTH_CALL));
    assert_eq!(s.sup.backend_state(), BackendState::Ready);
    assert!(s.sup.restart_counts().is_empty());
    // Its rows seeded the estimate: 1 s a row, a one-row call gets 4 s.
    assert_eq!(s.sup.deadline(1), secs(4));
    // A worker that stops after ten rows is killed at 4 x its rate x the rows left (26 x
    // 4 s), not left to run; without progress at all, at the allowance.
    let mut s = Sim::new(policy);
    let w = ready_and_hanging(&mut s);
    for done in 1..=10 {
        s.advance(secs(1));
        s.feed(Event::Progress(w, HEALTH_CALL, done, 36));
    }
    assert!(s.advance(secs(26 * 4) - ms(1)).is_empty());
    let a = s.advance(ms(2));
    assert!(a.contains(&Action::Kill(w)), "{a:?}");
    // Frames that do not move forward are no progress.
    let before = s.sup.restart_counts()["deadline"];
    s.advance(secs(1));
    let w = ready_and_hanging(&mut s);
    s.advance(secs(2));
    s.feed(Event::Progress(w, HEALTH_CALL, 0, 36));
    s.feed(Event::Progress(w, HEALTH_CALL, 40, 36));
    s.feed(Event::Progress(w, 99, 5, 36));
    assert!(s.advance(ms(1001)).contains(&Action::Kill(w)));
    assert_eq!(s.sup.restart_counts()["deadline"], before + 1);
}

#[test]
fn a_worker_slowed_by_contention_that_shows_progress_is_not_killed_and_a_real_hang_is_caught_within_a_second() {
    let mut s = Sim::new(healthy_policy());
    let w = s.worker();
    s.ready_and_healthy(20);
    s.one_row_calls(w, 1..=10, ms(100));
    assert_eq!(s.sup.deadline(1), secs(1));
    // Contention: one-row calls take 2.2 s (22 layers of 100 ms), twice their deadline,
    // with a sign after each layer.
    for call in 11..=16 {
        s.submit(call, 1);
        for layer in 1..22 {
            assert!(s.advance(ms(100)).is_empty(), "call {call}, layer {layer}");
            s.feed(Event::Progress(w, call, layer, 22));
        }
        s.now += ms(100);
        assert_eq!(s.feed(Event::Done(w, call)), [Action::Deliver(call)]);
    }
    assert!(s.sup.restart_counts().is_empty() && !s.sup.degraded());
    // A real hang (no sign at all) of a fresh worker is still caught at 1 s.
    let mut s = Sim::new(healthy_policy());
    let w = s.worker();
    s.ready_and_healthy(20);
    s.one_row_calls(w, 1..=10, ms(100));
    s.submit(11, 1);
    assert!(s.advance(ms(999)).is_empty());
    assert!(s.advance(ms(2)).contains(&Action::Kill(w)));
}

#[test]
fn the_fallback_is_timed_by_its_own_rows_not_by_the_primarys() {
    let mut s = Sim::new(Policy { fallback: true, max_restarts: 0, ..healthy_policy() });
    let w = s.worker();
    s.ready_and_healthy(20);
    s.one_row_calls(w, 1..=10, ms(10));
    assert_eq!(s.sup.deadline(1), secs(1));
    s.feed(Event::Exited(w, "signal 11".into()));
    assert_eq!(s.sup.role(), Role::Fallback);
    // The CPU's health call: two rows of 2 s each; its calls get 4 x 2 s, not the NPU's 1 s.
    s.ready_and_healthy(4000);
    assert_eq!(s.sup.deadline(1), secs(8));
}

#[test]
fn stale_timers_are_ignored() {
    let mut s = Sim::new(Policy { fixed_deadline: Some(secs(1)), ..healthy_policy() });
    s.ready_and_healthy(1);
    let w = s.worker();
    s.submit(1, 1);
    s.feed(Event::Done(w, 1));
    s.submit(2, 1);
    // An old deadline timer fires while call 2 runs fine: nothing happens.
    let old = Timer { kind: TimerKind::Deadline, generation: 1 };
    assert_eq!(s.feed(Event::Timer(old)), []);
}

#[test]
fn the_probe_is_asked_for_every_interval_on_a_serving_worker_one_at_a_time_and_never_on_a_starting_one() {
    let every = secs(60);
    let policy = Policy { fixed_deadline: Some(secs(100)), probe_every: Some(every), ..healthy_policy() };
    let mut s = Sim::new(policy);
    let probes = |a: &[Action]| a.iter().filter(|x| **x == Action::Probe).count();
    // The first worker is still loading when the first interval ends: its health call probes it.
    assert_eq!(probes(&s.advance(every)), 0);
    s.ready_and_healthy(1);
    let a = s.advance(every);
    assert_eq!(probes(&a), 1, "{a:?}");
    let w = s.worker();
    let a = s.submit_probe(1, 4);
    assert_eq!(a[0], Action::Send(w, vec![1]));
    // Still running when the next interval ends: no second probe beside it.
    assert_eq!(probes(&s.advance(every)), 0);
    assert_eq!(s.feed(Event::Done(w, 1)), [Action::Deliver(1)]);
    // Answered: the cadence goes on, one probe an interval.
    assert_eq!(probes(&s.advance(every)), 1);
    assert_eq!(probes(&s.advance(every * 3)), 3);
}

#[test]
fn without_an_interval_the_probe_is_never_asked_for() {
    let mut s = Sim::new(healthy_policy());
    s.ready_and_healthy(1);
    assert!(!s.advance(secs(3600)).contains(&Action::Probe));
}

#[test]
fn a_refused_runtime_travels_typed_to_the_restart_notice_and_reads_as_before() {
    let mut s = Sim::new(healthy_policy());
    let w = s.worker();
    let a = s.feed(Event::LoadFailed(w, LoadError::runtime_rejected("refusing RKNN runtime \"2.4.2\"")));
    let restart = notices(&a, NoticeKind::WorkerRestart);
    let reason = restart[0].reason.as_ref().expect("a reason");
    assert!(
        matches!(reason, RestartReason::LoadFailed(LoadError { kind: LoadFailure::RuntimeRejected, message })
            if message == "refusing RKNN runtime \"2.4.2\""),
        "{reason:?}"
    );
    assert_eq!(
        restart[0].message,
        "the backend could not be loaded: runtime rejected: refusing RKNN runtime \"2.4.2\""
    );
    assert_eq!(reason.label(), "load_failed");
}
