//! laya's decision head, the third stage: `h + type_emb[qtype]`, `head_layers` PyTorch
//! `TransformerEncoderLayer`s (pre-norm, ReLU, 4d feed-forward, `max(1, d / 64)` heads,
//! eps 1e-5, key-padding mask), the marker gather, the scorer
//! (LayerNorm -> Linear -> GELU -> Linear) and the act head on `[h[:, 0], top1, top1 - top2,
//! normalised entropy, k / 255]`.

use candle_core::{D, DType, Device, Module, Tensor};
use candle_nn::{LayerNorm, Linear};

use super::ModelError;
use super::weights::{Expected, Weights};

/// PyTorch's default LayerNorm epsilon, used by the head and the scorer.
const HEAD_EPS: f64 = 1e-5;
/// The logit of a marker slot a row does not have.
pub const MISSING_MARKER_LOGIT: f32 = -1e4;

struct HeadLayer {
    norm1: LayerNorm,
    in_proj: Linear,
    out_proj: Linear,
    norm2: LayerNorm,
    linear1: Linear,
    linear2: Linear,
}

/// The decision head's weights.
pub struct Head {
    nhead: usize,
    type_emb: Tensor,
    layers: Vec<HeadLayer>,
    scorer_norm: LayerNorm,
    scorer1: Linear,
    scorer2: Linear,
    act1: Linear,
    act2: Linear,
}

/// One row's head outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadOutput {
    /// One logit per real marker.
    pub logits: Vec<f32>,
    pub act_logits: Vec<f32>,
}

fn linear(w: &Weights, p: &str) -> Result<Linear, ModelError> {
    Ok(Linear::new(w.get(&format!("{p}.weight"))?, Some(w.get(&format!("{p}.bias"))?)))
}

fn norm(w: &Weights, p: &str) -> Result<LayerNorm, ModelError> {
    Ok(LayerNorm::new(w.get(&format!("{p}.weight"))?, w.get(&format!("{p}.bias"))?, HEAD_EPS))
}

impl Head {
    /// The tensors the head needs, with their shapes.
    pub fn expected(d: usize, head_layers: usize, n_act: usize, out: &mut Expected) {
        let mut lin = |p: String, o: usize, i: usize| {
            out.insert(format!("{p}.weight"), vec![o, i]);
            out.insert(format!("{p}.bias"), vec![o]);
        };
        for l in 0..head_layers {
            let p = format!("head.layers.{l}");
            lin(format!("{p}.linear1"), 4 * d, d);
            lin(format!("{p}.linear2"), d, 4 * d);
            lin(format!("{p}.self_attn.out_proj"), d, d);
        }
        lin("scorer.1".into(), d, d);
        lin("scorer.3".into(), 1, d);
        lin("act_head.0".into(), 256, d + 4);
        lin("act_head.2".into(), n_act, 256);
        for l in 0..head_layers {
            let p = format!("head.layers.{l}");
            out.insert(format!("{p}.self_attn.in_proj_weight"), vec![3 * d, d]);
            out.insert(format!("{p}.self_attn.in_proj_bias"), vec![3 * d]);
            for n in ["norm1", "norm2"] {
                out.insert(format!("{p}.{n}.weight"), vec![d]);
                out.insert(format!("{p}.{n}.bias"), vec![d]);
            }
        }
        out.insert("scorer.0.weight".into(), vec![d]);
        out.insert("scorer.0.bias".into(), vec![d]);
        out.insert("type_emb.weight".into(), vec![3, d]);
    }

    /// Loads the head's tensors (already verified).
    pub fn load(d: usize, head_layers: usize, w: &Weights) -> Result<Head, ModelError> {
        let mut layers = Vec::with_capacity(head_layers);
        for l in 0..head_layers {
            let p = format!("head.layers.{l}");
            layers.push(HeadLayer {
                norm1: norm(w, &format!("{p}.norm1"))?,
                in_proj: Linear::new(
                    w.get(&format!("{p}.self_attn.in_proj_weight"))?,
                    Some(w.get(&format!("{p}.self_attn.in_proj_bias"))?),
                ),
                out_proj: linear(w, &format!("{p}.self_attn.out_proj"))?,
                norm2: norm(w, &format!("{p}.norm2"))?,
                linear1: linear(w, &format!("{p}.linear1"))?,
                linear2: linear(w, &format!("{p}.linear2"))?,
            });
        }
        Ok(Head {
            nhead: (d / 64).max(1),
            type_emb: w.get("type_emb.weight")?,
            layers,
            scorer_norm: norm(w, "scorer.0")?,
            scorer1: linear(w, "scorer.1")?,
            scorer2: linear(w, "scorer.3")?,
            act1: linear(w, "act_head.0")?,
            act2: linear(w, "act_head.2")?,
        })
    }

    fn self_attention(&self, layer: &HeadLayer, x: &Tensor, key_bias: &Tensor) -> Result<Tensor, ModelError> {
        let (b, l, d) = x.dims3()?;
        let hd = d / self.nhead;
        let qkv = layer.in_proj.forward(x)?;
        let part = |i: usize| -> candle_core::Result<Tensor> {
            qkv.narrow(D::Minus1, i * d, d)?.reshape((b, l, self.nhead, hd))?.transpose(1, 2)?.contiguous()
        };
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        let scores = (q.matmul(&k.t()?)? * (hd as f64).powf(-0.5))?.broadcast_add(key_bias)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let out = probs.matmul(&v)?.transpose(1, 2)?.reshape((b, l, d))?;
        Ok(layer.out_proj.forward(&out)?)
    }

    /// Stage 3: `[B, L, d]` encoder states of rows with the given lengths, types and marker
    /// positions -> each row's option logits and act logits.
    pub fn forward(
        &self,
        hidden: &Tensor,
        lengths: &[usize],
        qtypes: &[u32],
        markers: &[&[u32]],
    ) -> Result<Vec<HeadOutput>, ModelError> {
        let (b, l, d) = hidden.dims3()?;
        let dev = Device::Cpu;
        let qt = Tensor::from_vec(qtypes.to_vec(), b, &dev)?;
        let mut h = hidden.broadcast_add(&self.type_emb.index_select(&qt, 0)?.unsqueeze(1)?)?;
        let key_bias = Tensor::from_vec(super::masks::key_padding_biases(lengths, l), (b, 1, 1, l), &dev)?;
        for layer in &self.layers {
            let x = layer.norm1.forward(&h)?;
            h = (&h + self.self_attention(layer, &x, &key_bias)?)?;
            let x = layer.norm2.forward(&h)?;
            h = (&h + layer.linear2.forward(&layer.linear1.forward(&x)?.relu()?)?)?;
        }
        // Gather the markers (a row without a marker k reads position 0, masked below).
        let kmax = markers.iter().map(|m| m.len()).max().unwrap_or(0).max(1);
        let mut index = Vec::with_capacity(b * kmax);
        for (row, m) in markers.iter().enumerate() {
            for j in 0..kmax {
                let pos = m.get(j).copied().unwrap_or(0) as usize;
                index.push((row * l + pos.min(l - 1)) as u32);
            }
        }
        let flat = h.reshape((b * l, d))?;
        let picked = flat.index_select(&Tensor::from_vec(index, b * kmax, &dev)?, 0)?.reshape((b, kmax, d))?;
        let x = self.scorer1.forward(&self.scorer_norm.forward(&picked)?)?.gelu_erf()?;
        let scores: Vec<Vec<f32>> = self.scorer2.forward(&x)?.squeeze(D::Minus1)?.to_dtype(DType::F32)?.to_vec2()?;

        // Act features from the untempered softmax over the batch's marker slots.
        let mut feats = Vec::with_capacity(b * 4);
        let mut logits_out = Vec::with_capacity(b);
        for (row, m) in markers.iter().enumerate() {
            let k = m.len();
            let slots: Vec<f32> =
                (0..kmax).map(|j| if j < k { scores[row][j] } else { MISSING_MARKER_LOGIT }).collect();
            let max = slots.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = slots.iter().map(|&s| (s - max).exp()).collect();
            let sum: f32 = e.iter().sum();
            let p: Vec<f32> = e.iter().map(|&v| v / sum).collect();
            let kk = k.max(2) as f32;
            let ent = -p.iter().map(|&v| v * v.max(1e-9).ln()).sum::<f32>() / kk.ln();
            let mut sorted = p.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let top1 = sorted.first().copied().unwrap_or(0.0);
            let top2 = sorted.get(1).copied().unwrap_or(0.0);
            feats.extend_from_slice(&[top1, top1 - top2, ent, k as f32 / 255.0]);
            logits_out.push(slots[..k].to_vec());
        }
        let pooled = h.narrow(1, 0, 1)?.squeeze(1)?;
        let feats = Tensor::from_vec(feats, (b, 4), &dev)?;
        let act_in = Tensor::cat(&[&pooled, &feats], 1)?;
        let act: Vec<Vec<f32>> = self.act2.forward(&self.act1.forward(&act_in)?.gelu_erf()?)?.to_vec2()?;
        Ok(logits_out.into_iter().zip(act).map(|(logits, act_logits)| HeadOutput { logits, act_logits }).collect())
    }
}
