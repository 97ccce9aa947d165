//! Backends: what turns token rows into option logits.
//!
//! The engine sees tokens and tensors only, never JSON. Every backend implements [`Backend`];
//! the CPU reference ([`cpu::CpuBackend`]) runs the whole model in this process.

pub mod cpu;

use crate::prompt::Row;

/// One row's raw model outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct RowResult {
    /// One logit per option, in option order.
    pub logits: Vec<f32>,
    /// The act head's logits (before its softmax).
    pub act_logits: Vec<f32>,
}

/// Why a backend could not answer.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("the model rejected the input: {0}")]
    Input(String),
    #[error("the backend failed: {0}")]
    Failed(String),
}

/// Turns a batch of question rows into their outputs, one per row, in order.
pub trait Backend: Send {
    /// The backend's name (`cpu`, `null`, `rknn`, `qnn`).
    fn name(&self) -> &'static str;
    /// Runs one batch.
    fn run(&mut self, rows: &[&Row]) -> Result<Vec<RowResult>, BackendError>;
}
