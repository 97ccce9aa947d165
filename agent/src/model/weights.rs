//! `model.safetensors`: memory-mapped, checked against the architecture, widened to f32.
//!
//! laya refuses a checkpoint whose tensors do not match the model it builds
//! (`_verify_compatibility`, then a strict `load_state_dict`). The same checks run here before
//! anything is computed, and every problem names the tensor.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use super::ModelError;

/// The checkpoint's tensors, memory-mapped.
pub struct Weights {
    path: PathBuf,
    st: MmapedSafetensors,
    device: Device,
}

/// What the architecture expects: tensor name -> shape.
pub type Expected = BTreeMap<String, Vec<usize>>;

/// Buffers laya saves that the forward pass does not read.
const IGNORED_BUFFERS: &[&str] = &["temperature"];

impl Weights {
    /// Maps `path` (f32, f16 or bf16 tensors).
    pub fn open(path: &Path) -> Result<Weights, ModelError> {
        if !path.is_file() {
            return Err(ModelError::NoWeights(path.to_owned()));
        }
        // SAFETY: the file is mapped read-only and not modified while mapped: model files are
        // installed read-only (laya-edge never writes them), and candle validates the header
        // and every tensor's byte range against the mapping before reading.
        let st = unsafe { MmapedSafetensors::new(path) }
            .map_err(|e| ModelError::Weights { path: path.to_owned(), message: e.to_string() })?;
        Ok(Weights { path: path.to_owned(), st, device: Device::Cpu })
    }

    /// Checks names and shapes like laya: missing tensors, shape mismatches and unexpected
    /// tensors are all reported, at most five of each kind named.
    pub fn verify(&self, expected: &Expected) -> Result<(), ModelError> {
        let found: BTreeMap<String, Vec<usize>> =
            self.st.tensors().into_iter().map(|(name, view)| (name, view.shape().to_vec())).collect();
        let mut problems = Vec::new();
        let missing: Vec<&String> = expected.keys().filter(|k| !found.contains_key(*k)).collect();
        if !missing.is_empty() {
            problems.push(format!(
                "missing {} parameter tensors (e.g. {:?})",
                missing.len(),
                missing.iter().take(5).collect::<Vec<_>>()
            ));
        }
        let mismatched: Vec<String> = expected
            .iter()
            .filter_map(|(k, shape)| {
                let got = found.get(k)?;
                (got != shape).then(|| format!("{k}: expected {shape:?}, found {got:?}"))
            })
            .collect();
        if !mismatched.is_empty() {
            problems.push(format!(
                "{} shape mismatches: {}",
                mismatched.len(),
                mismatched.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
            ));
        }
        let unexpected: Vec<&String> =
            found.keys().filter(|k| !expected.contains_key(*k) && !IGNORED_BUFFERS.contains(&k.as_str())).collect();
        if !unexpected.is_empty() {
            problems.push(format!(
                "{} unexpected tensors (e.g. {:?})",
                unexpected.len(),
                unexpected.iter().take(5).collect::<Vec<_>>()
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ModelError::Weights {
                path: self.path.clone(),
                message: format!("the checkpoint does not match its configured architecture: {}", problems.join("; ")),
            })
        }
    }

    /// One tensor as f32 (shapes were checked by [`Weights::verify`]).
    pub fn get(&self, name: &str) -> Result<Tensor, ModelError> {
        let err = |message: String| ModelError::Weights { path: self.path.clone(), message };
        let t = self.st.load(name, &self.device).map_err(|e| err(format!("{name}: {e}")))?;
        match t.dtype() {
            DType::F32 => Ok(t),
            DType::F16 | DType::BF16 => t.to_dtype(DType::F32).map_err(|e| err(format!("{name}: {e}"))),
            other => Err(err(format!("{name} is stored as {other:?}; only f32, f16 and bf16 are supported"))),
        }
    }
}
