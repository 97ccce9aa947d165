//! The `null` backend: deterministic logits derived from the input at almost no cost, and faults
//! on demand. It exercises everything around a model (protocol, supervision, the MQTT service)
//! without one, in tests and benchmarks.
//!
//! Faults are given as a spec, e.g. `sleep=200`, `row-sleep=200` (per row of the call, with a
//! progress frame after each row), `step-sleep=100x10` (each row is 10 steps of 100 ms, with a
//! progress frame after each step: a CPU slowed by contention, getting on layer by layer), `hang@3`,
//! `abort@2`, `exit@2`, `error=fatal@1`, `error=transient@1`, `error=input`, `constant` (every
//! row gets the same logits, like a broken runtime), `abort-rows=3` (abort on calls of 3 rows or
//! more: an input that kills the runtime), `abort-token=N`, `hang-token=N`, `input-token=N`
//! (abort, hang or refuse the input on a call with a row holding token id N: a poison question
//! among others), `load-fail`, `load-sleep=5000` (a slow load), `record=PATH` (not a fault: each
//! call appends a line to PATH as it arrives, the worker's pid, a tab and its rows' token ids, a
//! row's ids joined by `,` and rows by ` `: what the worker was given, for tests that must know
//! which rows ran together, or never ran); several are joined with commas. `@N` applies the fault to the N-th call only (counting
//! from 1 in this process), `@N+` to the N-th call and every one after it, no `@` to every call. `once=PATH` makes the faults apply in one process only: the
//! first worker that loads creates PATH, later workers (after a restart) find it and run clean;
//! `workers=N:PATH` in the first N processes (PATH counts them); a `record` goes on in every
//! process.

use std::time::Duration;

use super::{Backend, BackendError, RowResult};
use crate::prompt::Row;

/// One injected fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Sleep this long before answering.
    Sleep(Duration),
    /// Sleep this long per row before answering, with a progress frame after each row.
    RowSleep(Duration),
    /// Each row takes this many steps of this long, with a progress frame after each step.
    StepSleep(Duration, u32),
    /// Answer every row with the same logits.
    Constant,
    /// `abort()` on a call of at least this many rows (an input that kills the runtime).
    AbortRows(usize),
    /// On a call with a row holding this token id: abort, hang, or refuse the input.
    Token(u32, TokenFault),
    /// Never answer.
    Hang,
    /// `abort()` the process.
    Abort,
    /// Exit with status 3.
    Exit,
    /// Return this error.
    Error(BackendError),
    /// Fail to load.
    LoadFail,
    /// Take this long to load.
    LoadSleep(Duration),
    /// Apply the other faults only if this marker file does not exist yet (then create it).
    Once(std::path::PathBuf),
    /// Apply the other faults in the first this many processes only, counted in this file.
    Workers(u64, std::path::PathBuf),
    /// Append each call's rows to this file as the call arrives (see the module docs).
    Record(std::path::PathBuf),
}

/// What a poison token does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenFault {
    Abort,
    Hang,
    Input,
}

/// A fault and the call it applies to (`None`: every call).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultRule {
    pub fault: Fault,
    pub on_call: Option<u64>,
    /// With `on_call`: that call and every one after it (`@N+`).
    pub onward: bool,
}

impl FaultRule {
    fn applies_to(&self, call: u64) -> bool {
        match self.on_call {
            None => true,
            Some(n) if self.onward => call >= n,
            Some(n) => call == n,
        }
    }
}

/// Parses a fault spec (see the module docs).
pub fn parse_faults(spec: &str) -> Result<Vec<FaultRule>, String> {
    let mut rules = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (what, on_call, onward) = match part.rsplit_once('@') {
            Some((w, n)) => {
                let (n, onward) = match n.strip_suffix('+') {
                    Some(n) => (n, true),
                    None => (n, false),
                };
                (w, Some(n.parse::<u64>().map_err(|_| format!("bad call number in {part:?}"))?), onward)
            }
            None => (part, None, false),
        };
        let fault = match what.split_once('=') {
            Some(("sleep", ms)) => {
                Fault::Sleep(Duration::from_millis(ms.parse().map_err(|_| format!("bad sleep in {part:?}"))?))
            }
            Some(("row-sleep", ms)) => {
                Fault::RowSleep(Duration::from_millis(ms.parse().map_err(|_| format!("bad row-sleep in {part:?}"))?))
            }
            Some((kind @ ("abort-token" | "hang-token" | "input-token"), n)) => {
                let id = n.parse().map_err(|_| format!("bad token id in {part:?}"))?;
                let what = match kind {
                    "abort-token" => TokenFault::Abort,
                    "hang-token" => TokenFault::Hang,
                    _ => TokenFault::Input,
                };
                Fault::Token(id, what)
            }
            Some(("step-sleep", spec)) => {
                let bad = || format!("bad step-sleep in {part:?} (MSxSTEPS, e.g. 100x10)");
                let (ms, steps) = spec.split_once('x').ok_or_else(bad)?;
                let steps: u32 = steps.parse().map_err(|_| bad())?;
                Fault::StepSleep(Duration::from_millis(ms.parse().map_err(|_| bad())?), steps.max(1))
            }
            Some(("abort-rows", n)) => Fault::AbortRows(n.parse().map_err(|_| format!("bad abort-rows in {part:?}"))?),
            Some(("load-sleep", ms)) => {
                Fault::LoadSleep(Duration::from_millis(ms.parse().map_err(|_| format!("bad load-sleep in {part:?}"))?))
            }
            Some(("error", "fatal")) => {
                Fault::Error(BackendError::Fatal { code: Some(-1), message: "injected fatal error".into() })
            }
            Some(("error", "transient")) => Fault::Error(BackendError::Transient("injected transient error".into())),
            Some(("error", "input")) => Fault::Error(BackendError::Input("injected input error".into())),
            None if what == "hang" => Fault::Hang,
            None if what == "constant" => Fault::Constant,
            None if what == "abort" => Fault::Abort,
            None if what == "exit" => Fault::Exit,
            None if what == "load-fail" => Fault::LoadFail,
            Some(("once", path)) => Fault::Once(path.into()),
            Some(("record", path)) => Fault::Record(path.into()),
            Some(("workers", spec)) => {
                let bad = || format!("bad workers in {part:?} (N:PATH)");
                let (n, path) = spec.split_once(':').ok_or_else(bad)?;
                Fault::Workers(n.parse().map_err(|_| bad())?, path.into())
            }
            _ => return Err(format!("unknown fault {part:?}")),
        };
        rules.push(FaultRule { fault, on_call, onward });
    }
    Ok(rules)
}

/// The null backend.
#[derive(Debug, Default)]
pub struct NullBackend {
    faults: Vec<FaultRule>,
    calls: u64,
}

impl NullBackend {
    /// A null backend with these faults; fails if one of them is `load-fail`.
    pub fn new(mut faults: Vec<FaultRule>) -> Result<NullBackend, String> {
        if let Some(marker) = faults.iter().find_map(|f| match &f.fault {
            Fault::Once(p) => Some(p.clone()),
            _ => None,
        }) {
            // create_new: exactly one process wins the marker and gets the faults.
            if std::fs::OpenOptions::new().write(true).create_new(true).open(&marker).is_err() {
                faults.retain(|f| matches!(f.fault, Fault::Record(_)));
            }
        }
        if let Some((n, counter)) = faults.iter().find_map(|f| match &f.fault {
            Fault::Workers(n, p) => Some((*n, p.clone())),
            _ => None,
        }) {
            // Workers of one engine start one after another: a plain read and write is enough.
            let before: u64 = std::fs::read_to_string(&counter).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0);
            std::fs::write(&counter, (before + 1).to_string())
                .map_err(|e| format!("cannot count workers in {}: {e}", counter.display()))?;
            if before >= n {
                faults.retain(|f| matches!(f.fault, Fault::Record(_)));
            }
        }
        if faults.iter().any(|f| f.fault == Fault::LoadFail) {
            return Err("injected load failure".into());
        }
        for f in &faults {
            if let Fault::LoadSleep(d) = f.fault {
                std::thread::sleep(d);
            }
        }
        Ok(NullBackend { faults, calls: 0 })
    }

    /// The logits the null backend gives a row: a hash of its tokens, in [-4, 4).
    pub fn logits_for(row: &Row) -> RowResult {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &id in &row.input_ids {
            h = (h ^ u64::from(id)).wrapping_mul(0x0100_0000_01b3);
        }
        let value = |seed: u64| {
            let x = (h ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            ((x >> 40) % 8000) as f32 / 1000.0 - 4.0
        };
        RowResult {
            logits: (0..row.marker_pos.len() as u64).map(value).collect(),
            act_logits: vec![value(1000), value(1001)],
        }
    }
}

impl Backend for NullBackend {
    fn name(&self) -> &'static str {
        "null"
    }

    fn run(&mut self, rows: &[&Row]) -> Result<Vec<RowResult>, BackendError> {
        self.run_with_progress(rows, &mut |_, _| {})
    }

    fn run_with_progress(
        &mut self,
        rows: &[&Row],
        progress: &mut dyn FnMut(u32, u32),
    ) -> Result<Vec<RowResult>, BackendError> {
        self.calls += 1;
        let call = self.calls;
        let mut constant = false;
        let n = u32::try_from(rows.len()).unwrap_or(u32::MAX);
        for rule in self.faults.iter().filter(|r| r.applies_to(call)) {
            if let Fault::Record(path) = &rule.fault {
                record(path, rows);
            }
        }
        for rule in self.faults.iter().filter(|r| r.applies_to(call)) {
            match &rule.fault {
                Fault::Sleep(d) => std::thread::sleep(*d),
                Fault::RowSleep(d) => {
                    for done in 1..=n {
                        std::thread::sleep(*d);
                        if done < n {
                            progress(done, n);
                        }
                    }
                }
                Fault::StepSleep(d, steps) => {
                    let of = n.saturating_mul(*steps);
                    for done in 1..=of {
                        std::thread::sleep(*d);
                        if done < of {
                            progress(done, of);
                        }
                    }
                }
                Fault::Constant => constant = true,
                Fault::AbortRows(n) if rows.len() >= *n => std::process::abort(),
                Fault::AbortRows(_) => {}
                Fault::Token(id, what) if rows.iter().any(|r| r.input_ids.contains(id)) => match what {
                    TokenFault::Abort => std::process::abort(),
                    TokenFault::Hang => loop {
                        std::thread::park();
                    },
                    TokenFault::Input => {
                        return Err(BackendError::Input(format!("token id {id} is outside the vocabulary")));
                    }
                },
                Fault::Token(..) => {}
                Fault::Hang => loop {
                    std::thread::park();
                },
                Fault::Abort => std::process::abort(),
                Fault::Exit => std::process::exit(3),
                Fault::Error(e) => return Err(e.clone()),
                Fault::LoadFail | Fault::LoadSleep(_) | Fault::Once(_) | Fault::Workers(..) | Fault::Record(_) => {}
            }
        }
        if constant {
            let first = rows.first().map(|r| Self::logits_for(r));
            return Ok(rows
                .iter()
                .map(|r| {
                    let mut out = first.clone().unwrap_or_else(|| Self::logits_for(r));
                    out.logits.resize(r.marker_pos.len(), 0.5);
                    out
                })
                .collect());
        }
        Ok(rows.iter().map(|r| Self::logits_for(r)).collect())
    }
}

/// Appends one call's line to `path` (`record=PATH`): one write of the whole line, so the calls
/// of several worker processes on one file do not interleave. Best effort: a test that reads the
/// file fails on what is missing.
fn record(path: &std::path::Path, rows: &[&Row]) {
    use std::io::Write;
    let rows: Vec<String> =
        rows.iter().map(|r| r.input_ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")).collect();
    let line = format!("{}\t{}\n", std::process::id(), rows.join(" "));
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(line.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::QType;

    #[test]
    fn fault_specs_parse() {
        let f = parse_faults("sleep=20, hang@3,error=fatal@1,row-sleep=5,constant@2").unwrap();
        assert_eq!(f[3], FaultRule { fault: Fault::RowSleep(Duration::from_millis(5)), on_call: None, onward: false });
        assert_eq!(f[4], FaultRule { fault: Fault::Constant, on_call: Some(2), onward: false });
        assert_eq!(f[0], FaultRule { fault: Fault::Sleep(Duration::from_millis(20)), on_call: None, onward: false });
        assert_eq!(f[1], FaultRule { fault: Fault::Hang, on_call: Some(3), onward: false });
        assert!(matches!(f[2].fault, Fault::Error(BackendError::Fatal { .. })));
        let slow = parse_faults("load-sleep=1500").expect("load-sleep");
        assert_eq!(
            slow,
            [FaultRule { fault: Fault::LoadSleep(Duration::from_millis(1500)), on_call: None, onward: false }]
        );
        let steps = parse_faults("step-sleep=100x10@3+").expect("step-sleep");
        assert_eq!(
            steps,
            [FaultRule { fault: Fault::StepSleep(Duration::from_millis(100), 10), on_call: Some(3), onward: true }]
        );
        assert!(parse_faults("step-sleep=100").is_err());
        assert!(parse_faults("load-sleep=soon").is_err());
        assert!(parse_faults("explode").is_err());
        assert!(parse_faults("hang@x").is_err());
        assert_eq!(parse_faults("hang-token=666").unwrap()[0].fault, Fault::Token(666, TokenFault::Hang));
        assert!(parse_faults("input-token=x").is_err());
        assert_eq!(parse_faults("record=/tmp/calls").unwrap()[0].fault, Fault::Record("/tmp/calls".into()));
    }

    #[test]
    fn record_appends_each_calls_rows_as_it_arrives_faulty_or_not() {
        let path = std::env::temp_dir().join(format!("laya-null-record-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let spec = format!("record={},error=input@2", path.display());
        let mut n = NullBackend::new(parse_faults(&spec).unwrap()).unwrap();
        let a = Row { input_ids: vec![1, 7, 2], marker_pos: vec![1], qtype: QType::Noul, layout: None };
        let b = Row { input_ids: vec![1, 8], marker_pos: vec![1], qtype: QType::Noul, layout: None };
        n.run(&[&a, &b]).unwrap();
        assert!(n.run(&[&b]).is_err());
        let me = std::process::id();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{me}\t1,7,2 1,8\n{me}\t1,8\n"));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn logits_are_deterministic_and_depend_on_the_input() {
        let a = Row { input_ids: vec![1, 2, 3], marker_pos: vec![1, 2], qtype: QType::Choice, layout: None };
        let b = Row { input_ids: vec![1, 2, 4], ..a.clone() };
        assert_eq!(NullBackend::logits_for(&a), NullBackend::logits_for(&a));
        assert_ne!(NullBackend::logits_for(&a).logits, NullBackend::logits_for(&b).logits);
        assert_eq!(NullBackend::logits_for(&a).logits.len(), 2);
    }

    #[test]
    fn a_fault_on_the_nth_call_hits_only_that_call() {
        let mut n = NullBackend::new(parse_faults("error=transient@2").unwrap()).unwrap();
        let row = Row { input_ids: vec![1], marker_pos: vec![0], qtype: QType::Noul, layout: None };
        assert!(n.run(&[&row]).is_ok());
        assert!(matches!(n.run(&[&row]), Err(BackendError::Transient(_))));
        assert!(n.run(&[&row]).is_ok());
        let mut n = NullBackend::new(parse_faults("error=transient@2+").unwrap()).unwrap();
        assert!(n.run(&[&row]).is_ok());
        assert!(n.run(&[&row]).is_err() && n.run(&[&row]).is_err());
    }

    #[test]
    fn slow_rows_report_their_progress_before_the_answer() {
        let mut n = NullBackend::new(parse_faults("row-sleep=1,step-sleep=1x2@2").unwrap()).unwrap();
        let row = Row { input_ids: vec![1], marker_pos: vec![0], qtype: QType::Noul, layout: None };
        let mut seen = Vec::new();
        n.run_with_progress(&[&row, &row, &row], &mut |d, of| seen.push((d, of))).unwrap();
        assert_eq!(seen, [(1, 3), (2, 3)]);
        seen.clear();
        n.run_with_progress(&[&row, &row], &mut |d, of| seen.push((d, of))).unwrap();
        // row-sleep's two rows, then step-sleep's four steps.
        assert_eq!(seen, [(1, 2), (1, 4), (2, 4), (3, 4)]);
    }
}
