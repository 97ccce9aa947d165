//! [`RknnBackend`]: the engine's [`Backend`] over the bundle's RKNN graphs.
//!
//! The graph scores one question per run, and a run takes about as long on three NPU cores as
//! on one, so the backend keeps up to three *lanes*: each a context of every graph (the first
//! lane from `rknn_init`, the others from `rknn_dup_context`, sharing the weights), lane `i`
//! pinned to core `i`. A call's rows are handed out to the lanes as they come free, one thread
//! per lane, so three questions take about one run. A hung run in any lane blocks the call,
//! which the supervisor's per-call deadline catches by killing the worker process: every lane
//! is covered by the same watchdog, deadline and restart logic as one context was.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::guard::ConstantOutputGuard;
use super::inputs::choose_graph;
use super::runtime::{Runtime, RuntimeVersions};
use super::session::Session;
use super::{CONTEXT_CORE_MASKS, RknnConfig, RknnError, RknnGraph};
use crate::backend::{Backend, BackendError, RowResult};
use crate::prompt::Row;

/// What the backend returns as act logits: the RKNN graph has no act head output (the model
/// card's graph outputs `logits` only), so every row gets an even two-class split.
pub const NO_ACT_LOGITS: [f32; 2] = [0.0, 0.0];

/// The Laya graphs of one bundle, loaded in librknnrt, one question per run.
pub struct RknnBackend {
    /// Lanes of sessions: `lanes[i][g]` is lane `i`'s context of graph `g` (by increasing
    /// `seq_len`). Each graph holds its own copy of the weights in the runtime (shared by its
    /// lanes), so a bundle's graph count is bounded by the board's memory. Lane 0 holds the
    /// contexts from `rknn_init`, dropped last (see `Drop`).
    lanes: Vec<Vec<Session>>,
    pad_id: u32,
    versions: RuntimeVersions,
    guard: ConstantOutputGuard,
}

impl RknnBackend {
    /// Loads the runtime library, refuses it unless its release is in the allowlist, loads every
    /// graph, checks its inputs and output against its spec, and sets the core mask.
    /// `pad_id` is the tokenizer's padding token.
    pub fn load(graphs: &[RknnGraph], config: &RknnConfig, pad_id: u32) -> Result<RknnBackend, RknnError> {
        if config.library.as_os_str().is_empty() {
            return Err(RknnError::NoLibrary);
        }
        if graphs.is_empty() {
            return Err(RknnError::NoGraphs);
        }
        let mut specs = graphs.to_vec();
        specs.sort_by_key(|g| g.seq_len);
        for g in &specs {
            if g.seq_len == 0
                || g.marker_slots == 0
                || u32::try_from(g.seq_len).is_err()
                || u32::try_from(g.marker_slots).is_err()
            {
                return Err(RknnError::BadGraphSpec {
                    file: g.file.clone(),
                    message: format!(
                        "seq_len {} and marker_slots {} must be positive 32-bit sizes",
                        g.seq_len, g.marker_slots
                    ),
                });
            }
        }
        if let Some(w) = specs.windows(2).find(|w| w[0].seq_len == w[1].seq_len) {
            return Err(RknnError::BadGraphSpec {
                file: w[1].file.clone(),
                message: format!("another graph ({}) has the same seq_len {}", w[0].file.display(), w[0].seq_len),
            });
        }
        if !(1..=CONTEXT_CORE_MASKS.len()).contains(&config.contexts) {
            return Err(RknnError::BadContexts(config.contexts));
        }
        let rt = Runtime::load(&config.library)?;
        let mut lanes: Vec<Vec<Session>> = (0..config.contexts).map(|_| Vec::with_capacity(specs.len())).collect();
        let mut versions = None;
        for spec in &specs {
            let mut first = Session::init(rt, spec)?;
            if versions.is_none() {
                let v = first.versions()?;
                v.check(&config.runtime_allowlist)?;
                versions = Some(v);
            }
            let mut contexts = Vec::with_capacity(config.contexts);
            for _ in 1..config.contexts {
                contexts.push(first.dup()?);
            }
            contexts.insert(0, first);
            for (i, mut session) in contexts.into_iter().enumerate() {
                let mask = if config.contexts == 1 { config.core_mask } else { CONTEXT_CORE_MASKS[i] };
                session.configure(mask)?;
                lanes[i].push(session);
            }
        }
        let versions = versions.ok_or(RknnError::NoGraphs)?;
        Ok(RknnBackend { lanes, pad_id, versions, guard: ConstantOutputGuard::default() })
    }

    /// How many contexts each graph has (rows run side by side).
    pub fn contexts(&self) -> usize {
        self.lanes.len()
    }

    /// The runtime's and the NPU driver's versions, for the caller to log.
    pub fn versions(&self) -> &RuntimeVersions {
        &self.versions
    }

    /// The loaded graphs, by increasing `seq_len`.
    pub fn graphs(&self) -> impl Iterator<Item = &RknnGraph> {
        self.lanes[0].iter().map(|s| &s.graph)
    }

    /// Checks a row and picks the graph that runs it.
    fn session_for(&self, r: usize, row: &Row) -> Result<usize, BackendError> {
        let (n, k) = (row.input_ids.len(), row.marker_pos.len());
        // The graph itself has no vocabulary check to mirror: the ids go in as they are.
        crate::backend::cpu::check_row(r, row, None)
            .and_then(|()| crate::backend::cpu::refuse_layout(r, row, "rknn"))
            .map_err(|e| BackendError::Input(e.to_string()))?;
        let shapes: Vec<(usize, usize)> =
            self.lanes[0].iter().map(|s| (s.graph.seq_len, s.graph.marker_slots)).collect();
        choose_graph(&shapes, n, k).ok_or_else(|| {
            let have: Vec<String> = shapes.iter().map(|(l, s)| format!("{l} tokens x {s} options")).collect();
            BackendError::Input(format!(
                "row {r} has {n} tokens and {k} options; no RKNN graph of this bundle holds it ({})",
                have.join(", ")
            ))
        })
    }
}

impl Backend for RknnBackend {
    fn name(&self) -> &'static str {
        "rknn"
    }

    fn runtime_version(&self) -> String {
        format!("librknnrt {} (driver {})", self.versions.api, self.versions.driver)
    }

    fn run(&mut self, rows: &[&Row]) -> Result<Vec<RowResult>, BackendError> {
        // Check every row first: a bad row fails the batch before the NPU does any work.
        let chosen = rows.iter().enumerate().map(|(r, row)| self.session_for(r, row)).collect::<Result<Vec<_>, _>>()?;
        let raws = self.run_lanes(rows, &chosen)?;
        let mut out = Vec::with_capacity(rows.len());
        for (row, raw) in rows.iter().zip(&raws) {
            // In row order, whichever lane ran the row.
            self.guard.check(row, raw).map_err(|message| BackendError::Fatal { code: None, message })?;
            // Slots past the real options hold -10000: dropped.
            out.push(RowResult { logits: raw[..row.marker_pos.len()].to_vec(), act_logits: NO_ACT_LOGITS.to_vec() });
        }
        Ok(out)
    }
}

/// One row's raw `marker_slots` logits, or why the run failed.
type RawResult = Result<Vec<f32>, BackendError>;

impl RknnBackend {
    /// Each row's raw logits, row `r` on graph `chosen[r]`: on this thread with one lane or one
    /// row, else one thread per lane, each taking the next row not yet taken. After a failure no
    /// lane takes another row; the first failure in row order is the call's.
    fn run_lanes(&mut self, rows: &[&Row], chosen: &[usize]) -> Result<Vec<Vec<f32>>, BackendError> {
        let pad_id = self.pad_id;
        if self.lanes.len() == 1 || rows.len() == 1 {
            let lane = &mut self.lanes[0];
            return rows.iter().zip(chosen).map(|(row, &g)| lane[g].run(row, pad_id).map(<[f32]>::to_vec)).collect();
        }
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let results: Vec<Mutex<Option<RawResult>>> = rows.iter().map(|_| Mutex::new(None)).collect();
        std::thread::scope(|scope| {
            for lane in self.lanes.iter_mut().take(rows.len()) {
                let (next, stop, results) = (&next, &stop, &results);
                scope.spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let r = next.fetch_add(1, Ordering::SeqCst);
                        let Some(row) = rows.get(r) else { break };
                        let result = lane[chosen[r]].run(row, pad_id).map(<[f32]>::to_vec);
                        if result.is_err() {
                            stop.store(true, Ordering::SeqCst);
                        }
                        *results[r].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
                    }
                });
            }
        });
        let mut out = Vec::with_capacity(rows.len());
        for (r, slot) in results.into_iter().enumerate() {
            match slot.into_inner().unwrap_or_else(|e| e.into_inner()) {
                Some(result) => out.push(result?),
                // Only rows after a failure are left unrun, so an earlier row returned the error.
                None => {
                    return Err(BackendError::Fatal { code: None, message: format!("row {r} was not run") });
                }
            }
        }
        Ok(out)
    }
}

impl Drop for RknnBackend {
    fn drop(&mut self) {
        // Duplicated contexts go before the contexts they were duplicated from.
        while self.lanes.pop().is_some() {}
    }
}
