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

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use super::encoder::Packed;
use super::weights::{Expected, Weights};
use super::{Encoder, EncoderConfig, Head, HeadOutput};

use crate::bundle::{AgentConfig, BundleError};
use crate::config::CpuWeights;
use crate::prompt::Row;

/// Tokens of the rows that run through the encoder together ([`token_groups`]).
pub const GROUP_TOKENS: usize = 512;

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
        CpuModel::load_with(dir, agent, CpuWeights::F32)
    }

    /// [`CpuModel::load`] with the encoder's dense products in `mode` (`[cpu] weights`); the
    /// head stays f32 in every mode.
    pub fn load_with(dir: &Path, agent: &AgentConfig, mode: CpuWeights) -> Result<CpuModel, ModelError> {
        let (enc_cfg, weights) = CpuModel::open(dir, agent)?;
        let d = enc_cfg.hidden_size;
        let model = CpuModel {
            encoder: Encoder::load_with(enc_cfg, &weights, mode)?,
            head: Head::load(d, agent.head_layers, &weights)?,
        };
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

    /// Runs a batch of question rows through all three stages and returns each row's option
    /// logits and act logits. No padding token is needed: the rows run packed end to end.
    pub fn forward(&self, rows: &[&Row]) -> Result<Vec<HeadOutput>, ModelError> {
        self.forward_with(rows, &mut |_, _| {})
    }

    /// The steps [`CpuModel::forward_with`] reports: one per encoder layer, and the head.
    pub fn steps(&self) -> u32 {
        u32::try_from(self.encoder.config.num_hidden_layers + 1).unwrap_or(u32::MAX)
    }

    /// [`CpuModel::forward`], calling `progress(done, of)` after each encoder layer of each group
    /// of rows ([`token_groups`]; `of` is [`CpuModel::steps`], `done` the share of the call's
    /// layers run; the head is the last step, which the answer itself reports).
    pub fn forward_with(
        &self,
        rows: &[&Row],
        progress: &mut dyn FnMut(u32, u32),
    ) -> Result<Vec<HeadOutput>, ModelError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        for (r, row) in rows.iter().enumerate() {
            check_row(r, row, Some(self.encoder.config.vocab_size))?;
        }
        let groups = token_groups(rows);
        let (layers, of) = (self.encoder.config.num_hidden_layers, self.steps());
        let mut out = Vec::with_capacity(rows.len());
        for (g, group) in groups.iter().enumerate() {
            let mut report = |layer: usize| {
                // Every layer of every group is a sign of progress; `done` counts whole layers
                // of the call, so it grows to `layers` over the groups.
                let done = (g * layers + layer) * layers / (groups.len() * layers).max(1);
                progress(u32::try_from(done).unwrap_or(u32::MAX).min(of - 1), of)
            };
            out.extend(self.forward_group(&rows[group.clone()], &mut report)?);
        }
        Ok(out)
    }

    /// Encoder and head over rows that run together, packed end to end (no padding).
    fn forward_group(&self, rows: &[&Row], on_layer: &mut dyn FnMut(usize)) -> Result<Vec<HeadOutput>, ModelError> {
        let total: usize = rows.iter().map(|r| r.input_ids.len()).sum();
        let mut spans = Vec::with_capacity(rows.len());
        let mut ids = Vec::with_capacity(total);
        let mut positions = Vec::with_capacity(total);
        let parallel = rows.iter().any(|r| r.layout.is_some());
        let mut layout = Vec::with_capacity(if parallel { total } else { 0 });
        for row in rows {
            spans.push(ids.len()..ids.len() + row.input_ids.len());
            ids.extend_from_slice(&row.input_ids);
            match &row.layout {
                // laya 0.4.15's parallel path: RoPE at the position ids, its option masks.
                Some(p) => {
                    positions.extend_from_slice(&p.position_ids);
                    layout.extend(p.position_ids.iter().copied().zip(p.option_ids.iter().copied()));
                }
                // A row without a layout runs as laya lays out a row without options (positions
                // `0..len`, option 0): the sequential masks and positions exactly, in a batch of
                // either kind.
                None => {
                    let len = u32::try_from(row.input_ids.len()).unwrap_or(u32::MAX);
                    positions.extend(0..len);
                    if parallel {
                        layout.extend((0..len).map(|p| (p, 0)));
                    }
                }
            }
        }
        let dev = Device::Cpu;
        let embeds = self.encoder.embed(&Tensor::from_vec(ids, (1, total), &dev)?)?.squeeze(0)?;
        let packed = Packed { rows: &spans, positions: &positions, layout: parallel.then_some(layout.as_slice()) };
        let hidden = self.encoder.encode_packed(embeds, &packed, on_layer)?;
        let qtypes: Vec<u32> = rows.iter().map(|r| r.qtype.index() as u32).collect();
        let markers: Vec<&[u32]> = rows.iter().map(|r| r.marker_pos.as_slice()).collect();
        self.head.forward_packed(&hidden, &spans, &qtypes, &markers)
    }
}

/// The rows that run together: consecutive rows up to [`GROUP_TOKENS`] tokens in all (a longer
/// row alone). What a call costs in memory is then bounded by the group, not by the request:
/// the largest buffers of a layer (the feed-forward's `[T, 2 x intermediate]`) hold at most
/// [`GROUP_TOKENS`] tokens, and multiplies of that many rows already run at gemm's full speed.
fn token_groups(rows: &[&Row]) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let (mut start, mut tokens) = (0, 0);
    for (r, row) in rows.iter().enumerate() {
        let len = row.input_ids.len();
        if r > start && tokens + len > GROUP_TOKENS {
            groups.push(start..r);
            (start, tokens) = (r, 0);
        }
        tokens += len;
    }
    if start < rows.len() {
        groups.push(start..rows.len());
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::QType;

    fn row(len: usize) -> Row {
        Row { input_ids: vec![1; len], marker_pos: vec![0], qtype: QType::Choice, layout: None }
    }

    #[test]
    fn rows_are_grouped_in_order_up_to_the_token_budget_and_a_long_row_runs_alone() {
        let rows: Vec<Row> = [100, 300, 112, 1, 600, 40, 500, 12].iter().map(|&n| row(n)).collect();
        let refs: Vec<&Row> = rows.iter().collect();
        assert_eq!(token_groups(&refs), vec![0..3, 3..4, 4..5, 5..6, 6..8]);
        assert_eq!(token_groups(&refs[..1]), vec![0..1]);
        assert!(token_groups(&[]).is_empty());
    }
}
