//! The CPU reference backend: the whole model on candle in this process.

use std::path::Path;

use super::{Backend, BackendError, RowResult};
use crate::bundle::AgentConfig;
use crate::model::{CpuModel, ModelError};
use crate::prompt::Row;

/// The Laya model on the CPU.
pub struct CpuBackend {
    model: CpuModel,
    pad_id: u32,
}

impl CpuBackend {
    /// Loads the checkpoint in `dir`; `pad_id` is the tokenizer's padding token.
    pub fn load(dir: &Path, config: &AgentConfig, pad_id: u32) -> Result<CpuBackend, ModelError> {
        Ok(CpuBackend { model: CpuModel::load(dir, config)?, pad_id })
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn run(&mut self, rows: &[&Row]) -> Result<Vec<RowResult>, BackendError> {
        self.run_with_progress(rows, &mut |_, _| {})
    }

    /// Progress after each encoder layer over the batch: a board's CPU, slowed by other work,
    /// still shows it is getting on, within a row as across rows.
    fn run_with_progress(
        &mut self,
        rows: &[&Row],
        progress: &mut dyn FnMut(u32, u32),
    ) -> Result<Vec<RowResult>, BackendError> {
        let out = self.model.forward_with(rows, self.pad_id, progress).map_err(|e| {
            if e.is_input() {
                BackendError::Input(e.to_string())
            } else {
                BackendError::Fatal { code: None, message: e.to_string() }
            }
        })?;
        Ok(out.into_iter().map(|o| RowResult { logits: o.logits, act_logits: o.act_logits }).collect())
    }
}
