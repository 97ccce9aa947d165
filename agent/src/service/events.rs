//! What goes on the events topic: the engine's notices and probe runs, reloads and session
//! takeovers, mapped to wire [`EngineEvent`]s.
//!
//! The engine speaks in its own types (`Notice`, `ProbeRun`, `RestartReason`) and never sees
//! the wire; this file is the one place that turns them into documents, so "what does the
//! operator see when a worker restarts" has one answer. Pure: the service loop publishes what
//! these functions return.

use crate::backend::{LoadError, LoadFailure};
use laya_topics::wire::{self, EngineEvent, EventKind, ProbeFigures, ProbeGraph, ProbeHistory};

use crate::engine::probe::GraphReport;
use crate::engine::{Notice, NoticeKind, RestartReason};
use crate::engine::{ProbeRun, ProbeRuns};

impl From<&NoticeKind> for EventKind {
    fn from(kind: &NoticeKind) -> EventKind {
        match kind {
            NoticeKind::WorkerRestart => EventKind::WorkerRestart,
            NoticeKind::BackendDegraded => EventKind::BackendDegraded,
            NoticeKind::BackendRecovered => EventKind::BackendRecovered,
        }
    }
}

/// An event with only a kind, a message and a role (the rest null).
fn plain(event: EventKind, message: String, role: Option<wire::Role>) -> EngineEvent {
    EngineEvent {
        event,
        reason: None,
        code: None,
        name: None,
        message,
        deadline_ms: None,
        role,
        probe: None,
        reload: None,
        serving: None,
    }
}

/// A reload request's one outcome: `reloaded`, `reload_rejected` or `reload_superseded`, naming
/// the request, with what happened.
pub fn reload_event(kind: EventKind, request: wire::ReloadRef, message: String) -> EngineEvent {
    let n = request.request;
    match kind {
        EventKind::Reloaded => tracing::info!(request = n, %message, "reloaded"),
        EventKind::ReloadSuperseded => tracing::info!(request = n, %message, "reload superseded"),
        _ => tracing::warn!(request = n, %message, "reload rejected: the serving engine goes on"),
    }
    EngineEvent { reload: Some(request), ..plain(kind, message, None) }
}

/// `session_taken_over`: another client connected with this agent's client id; `named` when the
/// broker said so (DISCONNECT 0x8E), else inferred from closes soon after connecting. `times`
/// counts the takeovers of this run.
pub fn takeover_event(named: bool, times: u64, client_id: &str) -> EngineEvent {
    let how = if named {
        "the broker said another client connected with this agent's client id and took its session (DISCONNECT 0x8E)"
    } else {
        "the broker closed this agent's connection again soon after accepting it, as it does when another client connects with the same client id"
    };
    EngineEvent {
        event: EventKind::SessionTakenOver,
        reason: Some(if named { "disconnect_0x8e" } else { "closed_after_connect" }.into()),
        code: named.then_some(0x8E),
        name: named.then(|| "SessionTakenOver".to_owned()),
        message: format!(
            "{how}, client id {client_id:?} ({times} times in this run): two devices share one client id \
             (a cloned image?); give each its own mqtt.device or mqtt.client_id"
        ),
        deadline_ms: None,
        role: None,
        probe: None,
        reload: None,
        serving: None,
    }
}

/// The wire figures of a probe run.
pub fn probe_figures(run: &ProbeRun) -> ProbeFigures {
    let r = run.report.as_ref().map(|r| &r.figures);
    ProbeFigures {
        role: run.role,
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
        graphs: run.report.as_ref().map(|r| r.graphs.iter().map(probe_graph).collect()).unwrap_or_default(),
    }
}

/// The wire figures of one graph of a probe run.
fn probe_graph(g: &GraphReport) -> ProbeGraph {
    ProbeGraph {
        seq_len: g.seq_len.map(|l| l as u64),
        rows: g.figures.rows as u64,
        agree: g.figures.agree as u64,
        clear: g.figures.clear as u64,
        clear_agree: g.figures.clear_agree as u64,
        mean_dp: g.figures.mean_dp,
        max_dp: g.figures.max_dp,
        mean_cosine: g.figures.mean_cosine,
        collapse: g.figures.collapse.clone(),
        passed: g.passed,
        verdict: g.verdict.clone(),
    }
}

/// Telemetry's `probes`: each role's last probe run and its last failed one.
pub fn probe_histories(runs: &[ProbeRuns]) -> Vec<ProbeHistory> {
    runs.iter()
        .map(|r| ProbeHistory {
            last: probe_figures(&r.last),
            last_failure: r.last_failure.as_ref().map(probe_figures),
        })
        .collect()
}

/// The `probe_failed` event of a failed probe run.
pub fn probe_event(run: &ProbeRun) -> EngineEvent {
    EngineEvent {
        probe: Some(probe_figures(run)),
        reload: None,
        serving: None,
        ..plain(
            EventKind::ProbeFailed,
            format!("the {} backend does not answer like the float model: {}", run.backend, run.verdict()),
            Some(run.role),
        )
    }
}

/// `runtime_rejected`, for a restart whose worker refused its vendor runtime (a version the
/// bundle does not allow): the operator must change the board, not wait for a restart to help.
pub fn runtime_rejected_event(n: &Notice) -> Option<EngineEvent> {
    let Some(RestartReason::LoadFailed(LoadError { kind: LoadFailure::RuntimeRejected, message })) = &n.reason else {
        return None;
    };
    if n.kind != NoticeKind::WorkerRestart {
        return None;
    }
    Some(EngineEvent {
        event: EventKind::RuntimeRejected,
        reason: Some("load_failed".into()),
        code: None,
        name: None,
        message: message.clone(),
        deadline_ms: None,
        role: Some(n.role),
        probe: None,
        reload: None,
        serving: None,
    })
}

/// The events-topic document for an engine notice.
pub fn engine_event(n: &Notice) -> EngineEvent {
    let reason = n.reason.as_ref();
    EngineEvent {
        event: EventKind::from(&n.kind),
        reason: reason.map(|r| r.label().into()),
        code: reason.and_then(RestartReason::code),
        name: reason.and_then(RestartReason::name),
        message: n.message.clone(),
        deadline_ms: match reason {
            Some(RestartReason::Deadline(d)) => Some(d.as_millis() as u64),
            _ => None,
        },
        role: Some(n.role),
        probe: None,
        reload: None,
        serving: None,
    }
}

/// The events the service publishes for one engine notice: the notice's own, then
/// `runtime_rejected` when a restart's worker refused its runtime.
pub fn notice_events(n: &Notice) -> impl Iterator<Item = EngineEvent> {
    std::iter::once(engine_event(n)).chain(runtime_rejected_event(n))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use laya_topics::json;

    use super::*;

    fn restart(reason: RestartReason) -> Notice {
        Notice {
            kind: NoticeKind::WorkerRestart,
            role: wire::Role::Primary,
            reason: Some(reason),
            message: "restarted".into(),
        }
    }

    fn text(e: &EngineEvent) -> String {
        json::to_string(&e.to_value(), json::Style::COMPACT)
    }

    #[test]
    fn a_restart_for_a_missed_deadline_names_the_deadline() {
        let e = engine_event(&restart(RestartReason::Deadline(Duration::from_millis(250))));
        assert_eq!(
            text(&e),
            r#"{"event":"worker_restart","reason":"deadline","code":null,"name":null,"message":"restarted","deadline_ms":250,"role":"primary"}"#
        );
    }

    #[test]
    fn a_fatal_restart_carries_the_runtimes_code_and_name() {
        let e = engine_event(&restart(RestartReason::Fatal {
            code: Some(-7),
            message: "rknn_run: RKNN_ERR_TIMEOUT (-7)".into(),
        }));
        assert_eq!(
            (e.reason.as_deref(), e.code, e.name.as_deref()),
            (Some("fatal"), Some(-7), Some("RKNN_ERR_TIMEOUT"))
        );
    }

    #[test]
    fn a_recovery_has_no_reason_and_names_its_role() {
        let n = Notice {
            kind: NoticeKind::BackendRecovered,
            role: wire::Role::Fallback,
            reason: None,
            message: "back".into(),
        };
        let e = engine_event(&n);
        assert_eq!((e.event, e.reason, e.role), (EventKind::BackendRecovered, None, Some(wire::Role::Fallback)));
    }

    #[test]
    fn a_restart_whose_worker_refused_its_runtime_is_also_a_runtime_rejected_event() {
        let why = LoadError::runtime_rejected("librknnrt 1.5.0 is older than the 2.0 the bundle needs");
        let n = restart(RestartReason::LoadFailed(why));
        let events: Vec<EngineEvent> = notice_events(&n).collect();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].event, EventKind::WorkerRestart);
        assert_eq!(
            text(&events[1]),
            r#"{"event":"runtime_rejected","reason":"load_failed","code":null,"name":null,"message":"librknnrt 1.5.0 is older than the 2.0 the bundle needs","deadline_ms":null,"role":"primary"}"#
        );
    }

    #[test]
    fn a_load_failure_of_another_kind_is_only_a_restart() {
        let n = restart(RestartReason::LoadFailed(LoadError::other("the model file is missing")));
        assert_eq!(runtime_rejected_event(&n), None);
        assert_eq!(notice_events(&n).count(), 1);
        let degraded = Notice {
            kind: NoticeKind::BackendDegraded,
            ..restart(RestartReason::LoadFailed(LoadError::runtime_rejected("old")))
        };
        assert_eq!(runtime_rejected_event(&degraded), None, "only a restart says runtime_rejected");
    }

    #[test]
    fn a_probe_run_the_backend_failed_on_has_null_figures_and_says_why() {
        let run = ProbeRun {
            role: wire::Role::Primary,
            backend: "qnn".into(),
            rows: 36,
            report: None,
            error: Some("HTP out of memory".into()),
        };
        let e = probe_event(&run);
        assert_eq!(e.event, EventKind::ProbeFailed);
        assert_eq!(
            e.message,
            "the qnn backend does not answer like the float model: the backend failed on the probe rows: HTP out of memory"
        );
        let figures = e.probe.expect("figures");
        assert_eq!((figures.role, figures.rows, figures.agree, figures.passed), (wire::Role::Primary, 36, None, false));
    }

    #[test]
    fn reload_events_concern_the_whole_agent() {
        let e = reload_event(EventKind::ReloadRejected, wire::ReloadRef { request: 2, model: None }, "no".into());
        assert_eq!(
            text(&e),
            r#"{"event":"reload_rejected","reason":null,"code":null,"name":null,"message":"no","deadline_ms":null,"role":"","reload":{"request":2,"model":null}}"#
        );
    }

    #[test]
    fn a_takeover_the_broker_named_carries_its_reason_code() {
        let e = takeover_event(true, 2, "dev1");
        assert_eq!(
            (e.event, e.code, e.name.as_deref()),
            (EventKind::SessionTakenOver, Some(0x8E), Some("SessionTakenOver"))
        );
        assert_eq!(e.reason.as_deref(), Some("disconnect_0x8e"));
        assert!(e.message.contains(r#"client id "dev1" (2 times in this run)"#), "{}", e.message);
        let inferred = takeover_event(false, 1, "dev1");
        assert_eq!(
            (inferred.reason.as_deref(), inferred.code, inferred.name),
            (Some("closed_after_connect"), None, None)
        );
    }

    #[test]
    fn every_engine_notice_has_the_same_name_on_the_wire() {
        for kind in [NoticeKind::WorkerRestart, NoticeKind::BackendDegraded, NoticeKind::BackendRecovered] {
            assert_eq!(EventKind::from(&kind).as_str(), kind.as_str());
        }
    }
}
