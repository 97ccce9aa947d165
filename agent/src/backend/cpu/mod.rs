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
mod bf16;
pub mod config;
pub mod dense;
pub mod encoder;
pub mod head;
mod int8;
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

/// What `--version` says each `[cpu] weights` mode runs its encoder's products on, on this CPU
/// (and under `LAYA_CPU_KERNELS`): `f32` the `gemm` set, `int8` the int8 set (`avx512-vnni`,
/// `avx2`, `neon-sdot` or `scalar`), `bf16` its set or why the mode is refused here.
pub fn weight_kernels() -> Vec<(CpuWeights, String)> {
    vec![
        (CpuWeights::F32, kernel_set().to_owned()),
        (CpuWeights::Int8, int8::I8Kernel::detect().name().to_owned()),
        (
            CpuWeights::Bf16,
            match bf16::Bf16Kernel::detect() {
                Ok(k) => k.name().to_owned(),
                Err(_) => "unavailable on this CPU".to_owned(),
            },
        ),
    ]
}

/// Whether this CPU (and process) can run `mode`; why not, if it cannot (bf16 without AVX-512
/// BF16): what the agent refuses at start with.
pub fn check_weights(mode: CpuWeights) -> Result<(), String> {
    match mode {
        CpuWeights::Bf16 => bf16::Bf16Kernel::detect().map(|_| ()),
        CpuWeights::F32 | CpuWeights::Int8 => Ok(()),
    }
}

/// The name the CPU backend answers under in `mode`: `cpu` (f32, the reference), `cpu-int8`,
/// `cpu-bf16` (each quantised mode is its own probe path).
pub fn backend_name(mode: CpuWeights) -> &'static str {
    match mode {
        CpuWeights::F32 => "cpu",
        CpuWeights::Int8 => "cpu-int8",
        CpuWeights::Bf16 => "cpu-bf16",
    }
}

use std::path::Path;

use super::{Backend, BackendError, RowResult};
use crate::bundle::AgentConfig;
use crate::config::CpuWeights;
use crate::prompt::Row;

/// The Laya model on the CPU.
pub struct CpuBackend {
    model: CpuModel,
    mode: CpuWeights,
}

impl CpuBackend {
    /// Loads the checkpoint in `dir` (f32).
    pub fn load(dir: &Path, config: &AgentConfig) -> Result<CpuBackend, ModelError> {
        CpuBackend::load_with(dir, config, CpuWeights::F32)
    }

    /// Loads the checkpoint in `dir` with the encoder's products in `mode` (`[cpu] weights`).
    pub fn load_with(dir: &Path, config: &AgentConfig, mode: CpuWeights) -> Result<CpuBackend, ModelError> {
        check_weights(mode).map_err(|message| ModelError::Weights { path: dir.to_owned(), message })?;
        Ok(CpuBackend { model: CpuModel::load_with(dir, config, mode)?, mode })
    }
}

impl Backend for CpuBackend {
    /// `cpu`, `cpu-int8` or `cpu-bf16` ([`backend_name`]).
    fn name(&self) -> &'static str {
        backend_name(self.mode)
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
