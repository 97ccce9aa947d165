//! The ModernBERT encoder, as transformers 5.17 computes it, in two stages:
//! [`Encoder::embed`] (the token-embedding lookup, which stays on the host even when an NPU runs
//! the rest) and [`Encoder::encode`] (embedding norm, layers, final norm: what the QNN graph
//! computes from `inputs_embeds`, `gmask` and `smask`).
//!
//! Each layer: `h += Wo(attn(norm(h)))` with no norm before layer 0's attention, fused `Wqkv`,
//! rotary embeddings with the theta of the layer's type, then `h += Wo(act(a) * g)` where
//! `a, g = Wi(norm(h)).chunk(2)`.
//!
//! RoPE rotates token `i` by position `i` (transformers' default `position_ids`), or, for rows
//! with a parallel option layout, by each row's own position ids ([`Positions::PerRow`]).

use std::ops::Range;

use candle_core::{Device, Tensor};

use super::ModelError;
use super::attention::{Attention, Mask};
use super::config::{EncoderConfig, LayerType};
use super::dense::Dense;
use super::layer_norm::LayerNorm;
use super::mlp::FeedForward;
use super::weights::{Expected, Weights};
use crate::config::CpuWeights;

fn layer_norm(w: &Weights, prefix: &str, bias: bool, eps: f64) -> Result<LayerNorm, ModelError> {
    let weight = w.get(&format!("{prefix}.weight"))?;
    let bias = if bias { Some(w.get(&format!("{prefix}.bias"))?) } else { None };
    Ok(LayerNorm::new(&weight, bias.as_ref(), eps)?)
}

fn linear(w: &Weights, prefix: &str, bias: bool, mode: CpuWeights) -> Result<Dense, ModelError> {
    let weight = w.get(&format!("{prefix}.weight"))?;
    let bias = if bias { Some(w.get(&format!("{prefix}.bias"))?) } else { None };
    Ok(Dense::with_weights(&weight, bias.as_ref(), mode)?)
}

/// The mode of a layer's `Wqkv` in the CPU mode `mode`: f32 under int8, `mode` otherwise.
///
/// Why int8 leaves it: measured on the built-in probe (60 rows, 2026-12-05), it is the one
/// product whose f32 saves the most decisions: with it in f32 and the other three int8, the demo
/// model and bpe-t5 keep every decision (60/60) where all four in int8 flipped one each;
/// keeping any one of the other three in f32 instead lost a bpe-t5 row or two, and activation
/// schemes alone (asymmetric u8, scales per 8 or 16 inputs, SmoothQuant-style channel scales)
/// left at least one fixture refused. wp-t4 stays refused either way (BENCHMARKS.md, "int8 with
/// `Wqkv` in f32"). A plausible reason, not measured: queries and keys meet in the attention
/// scores, whose softmax turns their error into a different mixture of values. It is a quarter
/// of a layer's dense work at d = 1024 (`3d^2` of `4d^2 + 3 d f`, f = 2624): int8 gave up 10-15%
/// of its rows/s to it there. bf16 keeps all four.
fn qkv_mode(mode: CpuWeights) -> CpuWeights {
    match mode {
        CpuWeights::Int8 => CpuWeights::F32,
        other => other,
    }
}

struct Layer {
    kind: LayerType,
    attn_norm: Option<LayerNorm>,
    wqkv: Dense,
    wo: Dense,
    mlp_norm: LayerNorm,
    wi: Dense,
    mlp_wo: Dense,
}

/// Cos/sin tables of one RoPE theta.
struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    fn new(theta: f64, head_dim: usize) -> Rope {
        // As transformers: inv_freq = 1 / theta^(arange(0, dim, 2) / dim), in f32.
        let inv_freq = (0..head_dim / 2).map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32)).collect();
        Rope { inv_freq }
    }

    /// `[L, head_dim / 2]` cos and sin tables for positions `0..l`.
    fn tables(&self, l: usize) -> Result<(Tensor, Tensor), ModelError> {
        let (cos, sin) = self.angles((0..l).map(|pos| pos as f32), l);
        let half = self.inv_freq.len();
        Ok((Tensor::from_vec(cos, (l, half), &Device::Cpu)?, Tensor::from_vec(sin, (l, half), &Device::Cpu)?))
    }

    /// `[B, L, head_dim / 2]` cos and sin tables for each row's own positions (`[B * L]`).
    fn tables_at(&self, positions: &[u32], b: usize, l: usize) -> Result<(Tensor, Tensor), ModelError> {
        let (cos, sin) = self.angles(positions.iter().map(|&pos| pos as f32), b * l);
        let half = self.inv_freq.len();
        Ok((Tensor::from_vec(cos, (b, l, half), &Device::Cpu)?, Tensor::from_vec(sin, (b, l, half), &Device::Cpu)?))
    }

    /// cos and sin of `pos * inv_freq` for each position, as transformers computes them in f32.
    fn angles(&self, positions: impl Iterator<Item = f32>, n: usize) -> (Vec<f32>, Vec<f32>) {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for pos in positions {
            for &f in &self.inv_freq {
                let angle = pos * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        (cos, sin)
    }
}

/// Where RoPE puts each token of a batch.
#[derive(Debug, Clone, Copy)]
pub enum Positions<'a> {
    /// `0..L` for every row (the sequential layout).
    Sequential,
    /// Each row's own position ids, `[B * L]` row-major (a parallel layout, `prompt::parallel`).
    PerRow(&'a [u32]),
}

/// A batch packed end to end for [`Encoder::encode_packed`].
#[derive(Debug, Clone, Copy)]
pub struct Packed<'a> {
    /// Each row's tokens.
    pub rows: &'a [Range<usize>],
    /// Each token's RoPE position (`0..len` in a sequential row, the position ids in a parallel one).
    pub positions: &'a [u32],
    /// For a parallel batch, each token's `(position id, option id)`.
    pub layout: Option<&'a [(u32, u32)]>,
}

/// The encoder's weights and configuration.
pub struct Encoder {
    pub config: EncoderConfig,
    tok_embeddings: Tensor,
    emb_norm: LayerNorm,
    layers: Vec<Layer>,
    final_norm: LayerNorm,
    rope_global: Rope,
    rope_local: Rope,
}

impl Encoder {
    /// The tensors the encoder needs, with their shapes.
    pub fn expected(cfg: &EncoderConfig, out: &mut Expected) {
        let (d, i2, v) = (cfg.hidden_size, 2 * cfg.intermediate_size, cfg.vocab_size);
        let mut put = |name: String, shape: Vec<usize>| {
            out.insert(name, shape);
        };
        put("encoder.embeddings.tok_embeddings.weight".into(), vec![v, d]);
        let norm = |put: &mut dyn FnMut(String, Vec<usize>), p: &str| {
            put(format!("{p}.weight"), vec![d]);
            if cfg.norm_bias {
                put(format!("{p}.bias"), vec![d]);
            }
        };
        norm(&mut put, "encoder.embeddings.norm");
        norm(&mut put, "encoder.final_norm");
        for l in 0..cfg.num_hidden_layers {
            let p = format!("encoder.layers.{l}");
            if l > 0 {
                norm(&mut put, &format!("{p}.attn_norm"));
            }
            norm(&mut put, &format!("{p}.mlp_norm"));
            put(format!("{p}.attn.Wqkv.weight"), vec![3 * d, d]);
            put(format!("{p}.attn.Wo.weight"), vec![d, d]);
            if cfg.attention_bias {
                put(format!("{p}.attn.Wqkv.bias"), vec![3 * d]);
                put(format!("{p}.attn.Wo.bias"), vec![d]);
            }
            put(format!("{p}.mlp.Wi.weight"), vec![i2, d]);
            put(format!("{p}.mlp.Wo.weight"), vec![d, cfg.intermediate_size]);
            if cfg.mlp_bias {
                put(format!("{p}.mlp.Wi.bias"), vec![i2]);
                put(format!("{p}.mlp.Wo.bias"), vec![d]);
            }
        }
    }

    /// Loads the encoder's tensors (already verified).
    pub fn load(cfg: EncoderConfig, w: &Weights) -> Result<Encoder, ModelError> {
        Encoder::load_with(cfg, w, CpuWeights::F32)
    }

    /// [`Encoder::load`] with the layers' dense products in `mode` (`[cpu] weights`): the
    /// quantised modes quantise the dense weights of each layer here, as they are read (int8
    /// all but `Wqkv`, [`qkv_mode`]); the embeddings and the norms stay f32.
    pub fn load_with(cfg: EncoderConfig, w: &Weights, mode: CpuWeights) -> Result<Encoder, ModelError> {
        let (eps, nb) = (cfg.norm_eps, cfg.norm_bias);
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for (l, &kind) in cfg.layer_types.iter().enumerate() {
            let p = format!("encoder.layers.{l}");
            layers.push(Layer {
                kind,
                // Layer 0 has no attention norm: the embedding norm just ran.
                attn_norm: if l == 0 { None } else { Some(layer_norm(w, &format!("{p}.attn_norm"), nb, eps)?) },
                wqkv: linear(w, &format!("{p}.attn.Wqkv"), cfg.attention_bias, qkv_mode(mode))?,
                wo: linear(w, &format!("{p}.attn.Wo"), cfg.attention_bias, mode)?,
                mlp_norm: layer_norm(w, &format!("{p}.mlp_norm"), nb, eps)?,
                wi: linear(w, &format!("{p}.mlp.Wi"), cfg.mlp_bias, mode)?,
                mlp_wo: linear(w, &format!("{p}.mlp.Wo"), cfg.mlp_bias, mode)?,
            });
        }
        Ok(Encoder {
            tok_embeddings: w.get("encoder.embeddings.tok_embeddings.weight")?,
            emb_norm: layer_norm(w, "encoder.embeddings.norm", nb, eps)?,
            final_norm: layer_norm(w, "encoder.final_norm", nb, eps)?,
            rope_global: Rope::new(cfg.global_rope_theta, cfg.head_dim()),
            rope_local: Rope::new(cfg.local_rope_theta, cfg.head_dim()),
            layers,
            config: cfg,
        })
    }

    /// Stage 1: `[B, L]` token ids -> `[B, L, d]` raw token embeddings.
    pub fn embed(&self, ids: &Tensor) -> Result<Tensor, ModelError> {
        let (b, l) = ids.dims2()?;
        let flat = self.tok_embeddings.index_select(&ids.flatten_all()?, 0)?;
        Ok(flat.reshape((b, l, self.config.hidden_size))?)
    }

    /// Stage 2: `[B, L, d]` embeddings with `[B, 1, L, L]` additive global and sliding-window
    /// biases -> `[B, L, d]` final hidden states.
    pub fn encode(&self, embeds: &Tensor, global_bias: &Tensor, sliding_bias: &Tensor) -> Result<Tensor, ModelError> {
        self.encode_with(embeds, global_bias, sliding_bias, &mut |_| {})
    }

    /// [`Encoder::encode`], calling `on_layer(i)` after layer `i` (from 1): the worker's signs
    /// of progress, so a CPU slowed by contention is seen working rather than hung.
    pub fn encode_with(
        &self,
        embeds: &Tensor,
        global_bias: &Tensor,
        sliding_bias: &Tensor,
        on_layer: &mut dyn FnMut(usize),
    ) -> Result<Tensor, ModelError> {
        self.encode_at(embeds, global_bias, sliding_bias, Positions::Sequential, on_layer)
    }

    /// [`Encoder::encode_with`] with RoPE at the given positions: transformers' `position_ids`,
    /// which laya 0.4.15 passes for the parallel layout.
    pub fn encode_at(
        &self,
        embeds: &Tensor,
        global_bias: &Tensor,
        sliding_bias: &Tensor,
        positions: Positions<'_>,
        on_layer: &mut dyn FnMut(usize),
    ) -> Result<Tensor, ModelError> {
        let (b, l, _) = embeds.dims3()?;
        let ((cos_g, sin_g), (cos_l, sin_l)) = match positions {
            Positions::Sequential => (self.rope_global.tables(l)?, self.rope_local.tables(l)?),
            Positions::PerRow(p) => {
                if p.len() != b * l {
                    return Err(
                        candle_core::Error::Msg(format!("{} position ids for a [{b}, {l}] batch", p.len())).into()
                    );
                }
                (self.rope_global.tables_at(p, b, l)?, self.rope_local.tables_at(p, b, l)?)
            }
        };
        let mut h = self.emb_norm.forward(&embeds.contiguous()?)?;
        for (n, layer) in self.layers.iter().enumerate() {
            let (bias, cos, sin) = match layer.kind {
                LayerType::Global => (global_bias, &cos_g, &sin_g),
                LayerType::Sliding => (sliding_bias, &cos_l, &sin_l),
            };
            let x = match &layer.attn_norm {
                Some(norm) => norm.forward(&h)?,
                None => h.clone(),
            };
            let attn = self.attention(layer, &x, bias, cos, sin)?;
            h = layer.wo.forward_add(&attn, &h)?;
            h = self.feed_forward(layer, &h)?;
            on_layer(n + 1);
        }
        Ok(self.final_norm.forward(&h)?)
    }

    /// Stage 2 over a packed batch (rows end to end, no padding): `[T, d]` embeddings ->
    /// `[T, d]` final hidden states, with attention over each row's own tokens
    /// ([`Attention`]: no bias tensors, no score matrices, a sliding layer's masked blocks
    /// skipped). The same model as [`Encoder::encode_at`], which the tests hold it to.
    pub fn encode_packed(
        &self,
        embeds: Tensor,
        packed: &Packed<'_>,
        on_layer: &mut dyn FnMut(usize),
    ) -> Result<Tensor, ModelError> {
        let (t, _) = embeds.dims2()?;
        if packed.positions.len() != t || packed.rows.iter().any(|r| r.end > t) {
            return Err(candle_core::Error::Msg(format!(
                "{} positions and rows {:?} for {t} packed tokens",
                packed.positions.len(),
                packed.rows
            ))
            .into());
        }
        let (cos_g, sin_g) = self.rope_global.angles(packed.positions.iter().map(|&p| p as f32), t);
        let (cos_l, sin_l) = self.rope_local.angles(packed.positions.iter().map(|&p| p as f32), t);
        let (heads, head_dim) = (self.config.num_attention_heads, self.config.head_dim());
        // The raw embeddings are taken by value and freed once normed: one `[T, d]` less held.
        let mut h = self.emb_norm.forward(&embeds.contiguous()?)?;
        drop(embeds);
        for (n, layer) in self.layers.iter().enumerate() {
            let (window, cos, sin) = match layer.kind {
                LayerType::Global => (None, &cos_g, &sin_g),
                LayerType::Sliding => (Some(self.config.sliding_window()), &cos_l, &sin_l),
            };
            let mask = match packed.layout {
                Some(tokens) => Mask::Parallel { tokens, window },
                None => Mask::Sequential { window },
            };
            // The normed states are dropped as soon as Wqkv has read them.
            let qkv = match &layer.attn_norm {
                Some(norm) => layer.wqkv.forward(&norm.forward(&h)?)?,
                None => layer.wqkv.forward(&h)?,
            };
            let attn = qkv.apply_op1_no_bwd(&Attention {
                rows: packed.rows,
                heads,
                head_dim,
                rope: Some((cos.as_slice(), sin.as_slice())),
                mask,
            })?;
            drop(qkv);
            h = layer.wo.forward_add(&attn, &h)?;
            h = self.feed_forward(layer, &h)?;
            on_layer(n + 1);
        }
        Ok(self.final_norm.forward(&h)?)
    }

    /// `h + Wo(act(a) * g)` where `a, g = Wi(norm(h)).chunk(2)` ([`FeedForward`]: a block of
    /// tokens at a time).
    fn feed_forward(&self, layer: &Layer, h: &Tensor) -> Result<Tensor, ModelError> {
        let x = layer.mlp_norm.forward(h)?;
        let ff =
            FeedForward { up: &layer.wi, down: &layer.mlp_wo, activation: self.config.hidden_activation, gated: true };
        Ok(ff.forward(&x, h)?)
    }

    fn attention(
        &self,
        layer: &Layer,
        x: &Tensor,
        bias: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<Tensor, ModelError> {
        let (b, l, d) = x.dims3()?;
        let heads = self.config.num_attention_heads;
        let hd = self.config.head_dim();
        let qkv = layer.wqkv.forward(x)?.reshape((b, l, 3, heads, hd))?;
        let part = |i: usize| -> candle_core::Result<Tensor> {
            qkv.narrow(2, i, 1)?.squeeze(2)?.transpose(1, 2)?.contiguous()
        };
        let q = candle_nn::rotary_emb::rope(&part(0)?, cos, sin)?;
        let k = candle_nn::rotary_emb::rope(&part(1)?, cos, sin)?;
        let v = part(2)?;
        let scores = (q.matmul(&k.t()?)? * (hd as f64).powf(-0.5))?.broadcast_add(bias)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        Ok(probs.matmul(&v)?.transpose(1, 2)?.reshape((b, l, d))?)
    }
}
