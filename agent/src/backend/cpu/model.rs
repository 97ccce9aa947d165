//! The CPU model itself: [`CpuModel`] loads a laya checkpoint and runs the encoder and the head
//! over a batch of rows.
//!
//! A batch whose rows have no parallel option layout runs exactly as it always has (laya 0.3.20's
//! sequential masks, RoPE at `0..L`). As soon as one row has a layout, the batch runs laya
//! 0.4.15's parallel path: each row's own position ids and `parallel_option_masks`. A row without
//! a layout in such a batch is given the layout laya gives a row without options (positions
//! `0..len`, option 0), under which the parallel masks and positions are the sequential ones, so
//! it gets the outputs it would get in a batch of its own kind (a test holds it to that). laya's
//! `collate_items` refuses a batch that mixes the two only because it would have to invent the
//! missing layouts; here each row keeps its own, and the engine's merged batches and health rows
//! need no special case. The decision head is the same in both layouts (laya's head has no
//! positional encoding and masks padding only).

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use super::encoder::Positions;
use super::masks;
use super::weights::{Expected, Weights};
use super::{Encoder, EncoderConfig, Head, HeadOutput};

use crate::bundle::{AgentConfig, BundleError};
use crate::prompt::Row;
use crate::prompt::parallel::ParallelLayout;

/// Why the model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("incompatible model: 'model.safetensors' not found at {0}")]
    NoWeights(PathBuf),
    #[error("incompatible encoder config {path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Weights { path: PathBuf, message: String },
    #[error("tensor computation failed: {0}")]
    Tensor(#[from] candle_core::Error),
    #[error("row {row}: token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { row: usize, id: u32, vocab: usize },
    #[error("row {row}: a marker at {pos} is past the row's {len} tokens")]
    MarkerOutOfRange { row: usize, pos: u32, len: usize },
    #[error("row {row} is empty")]
    EmptyRow { row: usize },
    #[error("row {row}: a parallel layout of {positions} position ids and {options} option ids for {len} tokens")]
    LayoutLength { row: usize, positions: usize, options: usize, len: usize },
    #[error("row {row} has a parallel option layout, which the {backend} backend does not run")]
    LayoutUnsupported { row: usize, backend: &'static str },
}

impl ModelError {
    /// Whether the rows, not the model, are at fault.
    pub fn is_input(&self) -> bool {
        matches!(
            self,
            ModelError::TokenOutOfRange { .. }
                | ModelError::MarkerOutOfRange { .. }
                | ModelError::EmptyRow { .. }
                | ModelError::LayoutLength { .. }
                | ModelError::LayoutUnsupported { .. }
        )
    }
}

/// Checks row `r` before any stage runs it: not empty, every marker inside the row, a parallel
/// layout (if any) with one position id and one option id per token and, with `vocab`, every
/// token inside the vocabulary. Every backend refuses the same rows the same way.
pub fn check_row(r: usize, row: &Row, vocab: Option<usize>) -> Result<(), ModelError> {
    if row.input_ids.is_empty() {
        return Err(ModelError::EmptyRow { row: r });
    }
    if let Some(vocab) = vocab
        && let Some(&id) = row.input_ids.iter().find(|&&id| id as usize >= vocab)
    {
        return Err(ModelError::TokenOutOfRange { row: r, id, vocab });
    }
    if let Some(&pos) = row.marker_pos.iter().find(|&&p| p as usize >= row.input_ids.len()) {
        return Err(ModelError::MarkerOutOfRange { row: r, pos, len: row.input_ids.len() });
    }
    if let Some(layout) = &row.layout {
        let (positions, options, len) = (layout.position_ids.len(), layout.option_ids.len(), row.input_ids.len());
        if positions != len || options != len {
            return Err(ModelError::LayoutLength { row: r, positions, options, len });
        }
    }
    Ok(())
}

/// Refuses row `r` if it has a parallel option layout: for the backends that run only the
/// sequential one (the NPU graphs take no position ids, and their masks are built for it), which
/// would otherwise answer it as a different input.
pub fn refuse_layout(r: usize, row: &Row, backend: &'static str) -> Result<(), ModelError> {
    if row.layout.is_some() { Err(ModelError::LayoutUnsupported { row: r, backend }) } else { Ok(()) }
}

/// The Laya model on the CPU.
pub struct CpuModel {
    pub encoder: Encoder,
    pub head: Head,
}

impl CpuModel {
    /// Loads `dir/encoder/config.json` and `dir/model.safetensors` (f32, f16 or bf16,
    /// read tensor by tensor), checking every tensor against the architecture first.
    pub fn load(dir: &Path, agent: &AgentConfig) -> Result<CpuModel, ModelError> {
        let (enc_cfg, weights) = CpuModel::open(dir, agent)?;
        let d = enc_cfg.hidden_size;
        let model =
            CpuModel { encoder: Encoder::load(enc_cfg, &weights)?, head: Head::load(d, agent.head_layers, &weights)? };
        // The copies made on the way are garbage now: see `heap`.
        crate::platform::heap::release_freed();
        Ok(model)
    }

    /// Checks `dir` as [`CpuModel::load`] would, reading no tensor: the encoder config, and
    /// `model.safetensors`'s header (every tensor's byte range inside the file, so a truncated
    /// file is refused) against the architecture. Cheap in memory and time: what the agent runs
    /// at start for the model its workers will load.
    pub fn check(dir: &Path, agent: &AgentConfig) -> Result<(), ModelError> {
        CpuModel::open(dir, agent).map(|_| ())
    }

    /// The encoder config and the weights' header, checked against the architecture.
    fn open(dir: &Path, agent: &AgentConfig) -> Result<(EncoderConfig, Weights), ModelError> {
        let enc_cfg = EncoderConfig::load(&dir.join("encoder").join("config.json"))?;
        let weights = Weights::open(&dir.join("model.safetensors"))?;
        let mut expected = Expected::new();
        Encoder::expected(&enc_cfg, &mut expected);
        Head::expected(enc_cfg.hidden_size, agent.head_layers, agent.n_act, &mut expected);
        weights.verify(&expected)?;
        Ok((enc_cfg, weights))
    }

    /// Runs a batch of question rows (padded to the longest with `pad_id`) through all three
    /// stages and returns each row's option logits and act logits.
    pub fn forward(&self, rows: &[&Row], pad_id: u32) -> Result<Vec<HeadOutput>, ModelError> {
        self.forward_with(rows, pad_id, &mut |_, _| {})
    }

    /// The steps [`CpuModel::forward_with`] reports: one per encoder layer, and the head.
    pub fn steps(&self) -> u32 {
        u32::try_from(self.encoder.config.num_hidden_layers + 1).unwrap_or(u32::MAX)
    }

    /// [`CpuModel::forward`], calling `progress(done, of)` after each encoder layer over the
    /// batch (`of` is [`CpuModel::steps`]; the head is the last step, which the answer itself
    /// reports).
    pub fn forward_with(
        &self,
        rows: &[&Row],
        pad_id: u32,
        progress: &mut dyn FnMut(u32, u32),
    ) -> Result<Vec<HeadOutput>, ModelError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        for (r, row) in rows.iter().enumerate() {
            check_row(r, row, Some(self.encoder.config.vocab_size))?;
        }
        let b = rows.len();
        let lengths: Vec<usize> = rows.iter().map(|r| r.input_ids.len()).collect();
        let l = lengths.iter().copied().max().unwrap_or(1);
        let mut ids = vec![pad_id; b * l];
        for (r, row) in rows.iter().enumerate() {
            ids[r * l..r * l + row.input_ids.len()].copy_from_slice(&row.input_ids);
        }
        let dev = Device::Cpu;
        let ids = Tensor::from_vec(ids, (b, l), &dev)?;
        let window = Some(self.encoder.config.sliding_window());
        let parallel = rows.iter().any(|r| r.layout.is_some());
        let (global, sliding, positions) = if parallel {
            // laya 0.4.15's parallel path: its own masks and RoPE at the position ids. A row of
            // the batch without a layout runs as laya lays out a row without options: positions
            // `0..len`, no option, which gives it the sequential biases and positions exactly.
            let laid_out: Vec<Cow<'_, ParallelLayout>> = rows
                .iter()
                .map(|r| match &r.layout {
                    Some(p) => Cow::Borrowed(p),
                    None => Cow::Owned(ParallelLayout::sequential(r.input_ids.len())),
                })
                .collect();
            let views: Vec<masks::LaidOut<'_>> = laid_out
                .iter()
                .map(|p| masks::LaidOut { position_ids: &p.position_ids, option_ids: &p.option_ids })
                .collect();
            // Padded with position 0, as laya's `collate_items`.
            let mut positions = vec![0u32; b * l];
            for (r, p) in laid_out.iter().enumerate() {
                positions[r * l..r * l + p.position_ids.len()].copy_from_slice(&p.position_ids);
            }
            let global = masks::parallel_attention_biases(&views, l, None);
            let sliding = masks::parallel_attention_biases(&views, l, window);
            (global, sliding, Some(positions))
        } else {
            (masks::attention_biases(&lengths, l, None), masks::attention_biases(&lengths, l, window), None)
        };
        let global = Tensor::from_vec(global, (b, 1, l, l), &dev)?;
        let sliding = Tensor::from_vec(sliding, (b, 1, l, l), &dev)?;
        let embeds = self.encoder.embed(&ids)?;
        let of = self.steps();
        let positions = positions.as_deref().map_or(Positions::Sequential, Positions::PerRow);
        let hidden = self.encoder.encode_at(&embeds, &global, &sliding, positions, &mut |layer| {
            progress(u32::try_from(layer).unwrap_or(u32::MAX).min(of - 1), of)
        })?;
        let qtypes: Vec<u32> = rows.iter().map(|r| r.qtype.index() as u32).collect();
        let markers: Vec<&[u32]> = rows.iter().map(|r| r.marker_pos.as_slice()).collect();
        self.head.forward(&hidden, &lengths, &qtypes, &markers)
    }
}
