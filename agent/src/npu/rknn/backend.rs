//! [`RknnBackend`]: the engine's [`Backend`] over the bundle's RKNN graphs.

use super::guard::ConstantOutputGuard;
use super::inputs::choose_graph;
use super::runtime::{Runtime, RuntimeVersions};
use super::session::Session;
use super::{RknnConfig, RknnError, RknnGraph};
use crate::engine::{Backend, BackendError, RowResult};
use crate::prompt::Row;

/// What the backend returns as act logits: the RKNN graph has no act head output (the model
/// card's graph outputs `logits` only), so every row gets an even two-class split.
pub const NO_ACT_LOGITS: [f32; 2] = [0.0, 0.0];

/// The Laya graphs of one bundle, loaded in librknnrt, one question per run.
pub struct RknnBackend {
    /// One session per graph, by increasing `seq_len`. Each holds its own copy of the weights
    /// in the runtime, so a bundle's graph count is bounded by the board's memory.
    sessions: Vec<Session>,
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
        let rt = Runtime::load(&config.library)?;
        let mut sessions = Vec::with_capacity(specs.len());
        let mut versions = None;
        for spec in &specs {
            let mut session = Session::init(rt, spec)?;
            if versions.is_none() {
                let v = session.versions()?;
                v.check(&config.runtime_allowlist)?;
                versions = Some(v);
            }
            session.configure(config.core_mask)?;
            sessions.push(session);
        }
        let versions = versions.ok_or(RknnError::NoGraphs)?;
        Ok(RknnBackend { sessions, pad_id, versions, guard: ConstantOutputGuard::default() })
    }

    /// The runtime's and the NPU driver's versions, for the caller to log.
    pub fn versions(&self) -> &RuntimeVersions {
        &self.versions
    }

    /// The loaded graphs, by increasing `seq_len`.
    pub fn graphs(&self) -> impl Iterator<Item = &RknnGraph> {
        self.sessions.iter().map(|s| &s.graph)
    }

    /// Checks a row and picks the graph that runs it.
    fn session_for(&self, r: usize, row: &Row) -> Result<usize, BackendError> {
        let (n, k) = (row.input_ids.len(), row.marker_pos.len());
        // The graph itself has no vocabulary check to mirror: the ids go in as they are.
        crate::model::check_row(r, row, None).map_err(|e| BackendError::Input(e.to_string()))?;
        let shapes: Vec<(usize, usize)> =
            self.sessions.iter().map(|s| (s.graph.seq_len, s.graph.marker_slots)).collect();
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
        let mut out = Vec::with_capacity(rows.len());
        for (row, i) in rows.iter().zip(chosen) {
            let raw = self.sessions[i].run(row, self.pad_id)?;
            self.guard.check(row, raw).map_err(|message| BackendError::Fatal { code: None, message })?;
            // Slots past the real options hold -10000: dropped.
            out.push(RowResult { logits: raw[..row.marker_pos.len()].to_vec(), act_logits: NO_ACT_LOGITS.to_vec() });
        }
        Ok(out)
    }
}
