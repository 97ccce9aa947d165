//! The CPU reference: the whole Laya model in Rust on candle, loaded from a laya checkpoint
//! directory exactly as `laya.Agent` loads it.
//!
//! It is split into the stages the NPU backends share: [`Encoder::embed`] (host gather),
//! [`Encoder::encode`] (what an NPU graph runs) and [`Head::forward`] (host, float). The CPU
//! model runs a batch's rows packed end to end through the encoder ([`Encoder::encode_packed`],
//! attention over each row's own tokens) and the head ([`Head::forward_packed`]), in groups of
//! bounded size, with no padding.
//!
//! The linear layers multiply on weights packed once at load (`panels`, on the `gemm` crate's
//! microkernels, the widest set the CPU has, chosen at run time); the feed-forwards run a block of
//! tokens at a time (`mlp`), so what a request holds beyond the model stays small. Softmax's
//! `exp`, the GeGLU's erf and the layer norms run vectorised on the same width (`vector`);
//! `LAYA_CPU_KERNELS` forces a narrower set for both.
//!
//! [`CpuBackend`] is the [`Backend`](super::Backend) over [`CpuModel`], in this process or a worker.

mod attention;
pub mod config;
pub mod dense;
pub mod encoder;
pub mod head;
mod layer_norm;
pub mod masks;
mod mlp;
mod model;
mod panels;
mod vector;
pub mod weights;

pub use config::EncoderConfig;
pub use encoder::Encoder;
pub use head::{Head, HeadOutput};
pub use model::{CpuModel, ModelError, check_row, refuse_layout};

/// The set of `gemm` microkernels the linear layers run on this CPU (`avx512f`, `fma`, `neon` or
/// `scalar`), chosen at run time: for reports and benchmarks.
pub fn kernel_set() -> &'static str {
    panels::Kernel::detect().name
}

/// The instruction set of the vectorised passes (softmax's `exp`, the GeGLU's erf, layer norm):
/// `avx512f`, `fma` (AVX2), `neon` or `scalar`, chosen at run time; for reports and benchmarks.
pub fn vector_set() -> &'static str {
    vector::Isa::active().name()
}

pub use vector::FORCE_VAR as FORCE_KERNELS_VAR;

use std::path::Path;

use super::{Backend, BackendError, RowResult};
use crate::bundle::AgentConfig;
use crate::prompt::Row;

/// The Laya model on the CPU.
pub struct CpuBackend {
    model: CpuModel,
}

impl CpuBackend {
    /// Loads the checkpoint in `dir`.
    pub fn load(dir: &Path, config: &AgentConfig) -> Result<CpuBackend, ModelError> {
        Ok(CpuBackend { model: CpuModel::load(dir, config)? })
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
        let out = self.model.forward_with(rows, progress).map_err(|e| {
            if e.is_input() {
                BackendError::Input(e.to_string())
            } else {
                BackendError::Fatal { code: None, message: e.to_string() }
            }
        })?;
        Ok(out.into_iter().map(|o| RowResult { logits: o.logits, act_logits: o.act_logits }).collect())
    }
}
