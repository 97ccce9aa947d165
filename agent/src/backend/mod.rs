//! Backends: everything that turns token rows into option logits.
//!
//! The engine sees tokens and tensors only, never JSON. Every backend implements [`Backend`]:
//! the CPU reference ([`cpu::CpuBackend`]) runs the whole model on candle, [`null`] injects
//! faults for tests, and [`npu`] holds the vendor runtimes (behind their cargo features), which
//! only a worker process loads. [`load`] turns the configuration into a backend, in one place.

pub mod cpu;
pub mod load;
pub mod npu;
pub mod null;

pub use load::{SetupError, check_model, load, set_threads, this_program};

use crate::prompt::Row;

/// What kind of failure kept a backend from loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadFailure {
    /// The vendor runtime itself was refused (a version the bundle does not allow): the agent
    /// publishes `runtime_rejected` for it, beside the restart, since no restart will help.
    RuntimeRejected,
    /// Anything else: a missing library or file, a bad bundle, a runtime error while loading.
    Other,
}

/// Why a backend could not be loaded: what kind of failure, and what the loader said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if *kind == LoadFailure::RuntimeRejected { "runtime rejected: " } else { "" })]
pub struct LoadError {
    pub kind: LoadFailure,
    pub message: String,
}

impl LoadError {
    pub fn other(message: impl Into<String>) -> LoadError {
        LoadError { kind: LoadFailure::Other, message: message.into() }
    }

    pub fn runtime_rejected(message: impl Into<String>) -> LoadError {
        LoadError { kind: LoadFailure::RuntimeRejected, message: message.into() }
    }
}

/// A loader's plain message is a failure of the [`LoadFailure::Other`] kind.
impl From<String> for LoadError {
    fn from(message: String) -> LoadError {
        LoadError::other(message)
    }
}

impl From<&str> for LoadError {
    fn from(message: &str) -> LoadError {
        LoadError::other(message)
    }
}

/// One row's raw model outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct RowResult {
    /// One logit per option, in option order.
    pub logits: Vec<f32>,
    /// The act head's logits (before its softmax).
    pub act_logits: Vec<f32>,
}

/// Why a backend could not answer. The variant decides what the supervisor does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The rows were unacceptable (the request's fault): answer with an error, change nothing.
    #[error("the model rejected the input: {0}")]
    Input(String),
    /// A failure the runtime recovers from by itself (e.g. a DSP subsystem restart): retry once.
    #[error("the backend failed and may recover: {0}")]
    Transient(String),
    /// The runtime is broken or hung (driver timeout, fatal error code, constant output): the
    /// worker process is killed and restarted.
    #[error("the backend failed fatally{}: {message}", code.map(|c| format!(" (code {c})")).unwrap_or_default())]
    Fatal { code: Option<i64>, message: String },
}

/// Turns a batch of question rows into their outputs, one per row, in order.
pub trait Backend: Send {
    /// The backend's name (`cpu`, `null`, `rknn`, `qnn`).
    fn name(&self) -> &'static str;
    /// Runs one batch.
    fn run(&mut self, rows: &[&Row]) -> Result<Vec<RowResult>, BackendError>;
    /// Runs one batch, calling `progress(done, of)` as its work advances (`done` of `of` steps,
    /// a step being a row or a part of one); the worker turns each call into a progress frame.
    /// The default reports nothing before the answer (the NPU backends: one vendor call).
    fn run_with_progress(
        &mut self,
        rows: &[&Row],
        progress: &mut dyn FnMut(u32, u32),
    ) -> Result<Vec<RowResult>, BackendError> {
        let _ = progress;
        self.run(rows)
    }
    /// The vendor runtime's version (librknnrt's, QAIRT's build id), for the status document;
    /// empty for backends without one.
    fn runtime_version(&self) -> String {
        String::new()
    }
}
