//! laya's decision head, the third stage: `h + type_emb[qtype]`, `head_layers` PyTorch
//! `TransformerEncoderLayer`s (pre-norm, ReLU, 4d feed-forward, `max(1, d / 64)` heads,
//! eps 1e-5, key-padding mask), the marker gather, the scorer
//! (LayerNorm -> Linear -> GELU -> Linear) and the act head on `[h[:, 0], top1, top1 - top2,
//! normalised entropy, k / 255]`.
//!
//! Only position 0 (the act head's pooled state) and the marker positions of the last layer's
//! output are ever read, so the last layer computes keys and values for every position but
//! queries, attention, the output projection and the feed-forward only for those rows (exact:
//! each output row of a layer depends on every key and value but on its own query alone). At
//! L=128 with 4 markers this removes about 40% of a 2-layer head's FLOPs. Where the read rows
//! are few, it does not compute the keys and values at every position either: each read row's
//! query goes through each head's key weights (`q . (W_k x + b_k) = (q W_k) . x + q . b_k`, and
//! `q . b_k`, the same for every key of the query, is lost in the softmax), meets the normed
//! states themselves, and the weighted sum of those goes through the value weights after
//! (`sum_j p_j (W_v x_j + b_v) = W_v sum_j p_j x_j + b_v`, the probabilities summing to 1):
//! `S (2d^2 + 2 H L d)` multiply-adds for `S` read rows instead of `2 L d^2` (at d=1024, 16 heads,
//! L=128 and 5 read rows, 31M instead of 268M). Exact but for the order of the sums.
//!
//! The rows run packed end to end, as the encoder's do: the key-padding mask becomes each row's
//! tokens attending to that row's alone (the packed attention op, `attention.rs`, without RoPE),
//! so no padding position is computed and no whole score matrix is held; only the last layer's
//! keys and values are padded, for its few queries. A padded batch (the NPU backends' hidden
//! states) is packed first.

use candle_core::{D, DType, Device, Tensor};

use std::ops::Range;

use super::ModelError;
use super::attention::{Attention, Mask};
use super::config::Activation;
use super::dense::Dense;
use super::layer_norm::LayerNorm;
use super::mlp::FeedForward;
use super::weights::{Expected, Weights};

/// PyTorch's default LayerNorm epsilon, used by the head and the scorer.
const HEAD_EPS: f64 = 1e-5;
/// The logit of a marker slot a row does not have.
pub const MISSING_MARKER_LOGIT: f32 = -1e4;

/// One `TransformerEncoderLayer`; `P`, its query, key and value projections (`in_proj_weight`
/// and `in_proj_bias`): packed together ([`Dense`]) for the layers before the last, a
/// [`LastProj`] for the last.
struct HeadLayer<P> {
    norm1: LayerNorm,
    in_proj: P,
    out_proj: Dense,
    norm2: LayerNorm,
    linear1: Dense,
    linear2: Dense,
}

/// Queries, keys and values at every token, for a whole layer.
trait Projections {
    /// `[T, 3d]` for `x` `[T, d]`.
    fn qkv(&self, x: &Tensor) -> candle_core::Result<Tensor>;
}

impl Projections for Dense {
    fn qkv(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.forward(x)
    }
}

impl Projections for LastProj {
    fn qkv(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        Tensor::cat(&[self.q.forward(x)?, self.kv(x)?], 1)
    }
}

/// The last layer's projections: the queries packed (they run at the read rows), the keys and
/// values as plain per-head matrices, which the read rows' queries are multiplied through
/// (module doc). Together the same 12 d^2 bytes as the fused layers' packed weights.
struct LastProj {
    q: Dense,
    /// `[heads, head_dim, d]`: each head's rows of the key weight, and of the value weight.
    k: Tensor,
    v: Tensor,
    /// `[d]`.
    k_bias: Tensor,
    v_bias: Tensor,
}

impl LastProj {
    /// From the `[3d, d]` `in_proj_weight` and `[3d]` `in_proj_bias`, for `heads` heads.
    fn new(weight: &Tensor, bias: &Tensor, heads: usize) -> candle_core::Result<LastProj> {
        let d = weight.dim(1)?;
        if weight.dims2()? != (3 * d, d) || bias.dims1()? != 3 * d || heads == 0 || d % heads != 0 {
            candle_core::bail!("head in_proj {:?} and bias {:?} for {heads} heads", weight.shape(), bias.shape());
        }
        // Copies of their own: views would keep the whole `[3d, d]` tensor alive beside them.
        let own = |t: &Tensor, i: usize, shape: &[usize]| -> candle_core::Result<Tensor> {
            let part = t.narrow(0, i * d, d)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            Tensor::from_vec(part, shape, &Device::Cpu)
        };
        let per_head = [heads, d / heads, d];
        Ok(LastProj {
            q: Dense::new(&weight.narrow(0, 0, d)?, Some(&bias.narrow(0, 0, d)?))?,
            k: own(weight, 1, &per_head)?,
            v: own(weight, 2, &per_head)?,
            k_bias: own(bias, 1, &[d])?,
            v_bias: own(bias, 2, &[d])?,
        })
    }

    /// Keys and values at every token of `x` `[T, d]`: `[T, 2d]`.
    fn kv(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let d = x.dim(1)?;
        let k = x.matmul(&self.k.reshape((d, d))?.t()?)?.broadcast_add(&self.k_bias)?;
        let v = x.matmul(&self.v.reshape((d, d))?.t()?)?.broadcast_add(&self.v_bias)?;
        Tensor::cat(&[k, v], 1)
    }

    /// Whether `s` read rows of rows up to `l` tokens cost fewer multiply-adds through the
    /// weights (`s (d + H l)`, per `2d`) than with keys and values at every token (`l (d + s)`).
    fn through_weights(&self, s: usize, l: usize) -> bool {
        let (heads, _, d) = self.k.dims3().unwrap_or((1, 1, 1));
        s * (d + heads * l) < l * (d + s)
    }
}

/// The decision head's weights.
pub struct Head {
    nhead: usize,
    type_emb: Tensor,
    /// The layers before the last.
    layers: Vec<HeadLayer<Dense>>,
    last: Option<HeadLayer<LastProj>>,
    scorer_norm: LayerNorm,
    scorer1: Dense,
    scorer2: Dense,
    act1: Dense,
    act2: Dense,
    /// Whether the last layer runs at the read rows only (always, but for the benchmark that
    /// measures what it saves: [`Head::set_last_layer_whole`]).
    reduce_last: bool,
}

/// One row's head outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadOutput {
    /// One logit per real marker.
    pub logits: Vec<f32>,
    pub act_logits: Vec<f32>,
}

fn linear(w: &Weights, p: &str) -> Result<Dense, ModelError> {
    Ok(Dense::new(&w.get(&format!("{p}.weight"))?, Some(&w.get(&format!("{p}.bias"))?))?)
}

fn norm(w: &Weights, p: &str) -> Result<LayerNorm, ModelError> {
    Ok(LayerNorm::new(&w.get(&format!("{p}.weight"))?, Some(&w.get(&format!("{p}.bias"))?), HEAD_EPS)?)
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
        let nhead = (d / 64).max(1);
        // Layer `l`, its projections made by `proj` from the in_proj weight and bias.
        fn layer<P>(
            w: &Weights,
            l: usize,
            proj: impl FnOnce(&Tensor, &Tensor) -> candle_core::Result<P>,
        ) -> Result<HeadLayer<P>, ModelError> {
            let p = format!("head.layers.{l}");
            Ok(HeadLayer {
                norm1: norm(w, &format!("{p}.norm1"))?,
                in_proj: proj(
                    &w.get(&format!("{p}.self_attn.in_proj_weight"))?,
                    &w.get(&format!("{p}.self_attn.in_proj_bias"))?,
                )?,
                out_proj: linear(w, &format!("{p}.self_attn.out_proj"))?,
                norm2: norm(w, &format!("{p}.norm2"))?,
                linear1: linear(w, &format!("{p}.linear1"))?,
                linear2: linear(w, &format!("{p}.linear2"))?,
            })
        }
        let before = head_layers.saturating_sub(1);
        let layers = (0..before)
            .map(|l| layer(w, l, |weight, bias| Dense::new(weight, Some(bias))))
            .collect::<Result<Vec<_>, _>>()?;
        let last = match head_layers {
            0 => None,
            _ => Some(layer(w, before, |weight, bias| LastProj::new(weight, bias, nhead))?),
        };
        Ok(Head {
            nhead,
            type_emb: w.get("type_emb.weight")?,
            layers,
            last,
            scorer_norm: norm(w, "scorer.0")?,
            scorer1: linear(w, "scorer.1")?,
            scorer2: linear(w, "scorer.3")?,
            act1: linear(w, "act_head.0")?,
            act2: linear(w, "act_head.2")?,
            reduce_last: true,
        })
    }

    /// Benchmark-only: the multiply-add FLOPs (2 per MAC) of the head's layers on one row of `l`
    /// tokens of which `reads` are read (position 0 and the markers), the last layer as
    /// `forward` runs it (`reduced`: at the read rows, through the weights where it chooses so)
    /// or whole.
    #[doc(hidden)]
    pub fn flops(&self, l: usize, reads: usize, reduced: bool) -> f64 {
        let d = self.type_emb.dim(1).unwrap_or(0) as f64;
        let (heads, lf, s) = (self.nhead as f64, l as f64, reads as f64);
        // in_proj 3 d^2, out_proj d^2, feed-forward 8 d^2 a row; attention 2 l d a query row.
        let whole = 2.0 * (12.0 * lf * d * d + 2.0 * lf * lf * d);
        let last = match &self.last {
            None => 0.0,
            Some(_) if !reduced => whole,
            // Queries, output and feed-forward 10 d^2 a read row; through the key and value
            // weights 2 d^2 and the scores and weighted states 2 H l d a read row.
            Some(last) if last.in_proj.through_weights(reads, l) => 2.0 * s * (12.0 * d * d + 2.0 * heads * lf * d),
            Some(_) => 2.0 * (2.0 * lf * d * d + 10.0 * s * d * d + 2.0 * s * lf * d),
        };
        whole * self.layers.len() as f64 + last
    }

    /// Benchmark-only: run the last layer at every position, then gather (the head before the
    /// work reduction), to measure what the reduction saves. Same results within float rounding.
    #[doc(hidden)]
    pub fn set_last_layer_whole(&mut self, whole: bool) {
        self.reduce_last = !whole;
    }

    /// Head `i` of the `parts` fused projections in `t` `[B, N, parts * d]` (queries, keys,
    /// values side by side), as `[B, heads, N, head_dim]`. For one row a strided view of `t`
    /// (the matmuls read it in place), for more a copy (candle's batched matmul needs the
    /// rows of a batch evenly spaced).
    fn split_heads(&self, t: &Tensor, parts: usize, i: usize) -> candle_core::Result<Tensor> {
        let (b, n, width) = t.dims3()?;
        let hd = width / parts / self.nhead;
        let view = t.reshape((b, n, parts, self.nhead, hd))?.narrow(2, i, 1)?.squeeze(2)?.transpose(1, 2)?;
        if b == 1 { Ok(view) } else { view.contiguous() }
    }

    /// Multi-head attention of the queries `q` `[B, H, S, hd]` over keys `k` and values `v`
    /// `[B, H, L, hd]`, through the output projection, added to `residual`: `[B, S, d]`.
    fn attend(
        &self,
        layer: &HeadLayer<LastProj>,
        residual: &Tensor,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        key_bias: &Tensor,
    ) -> Result<Tensor, ModelError> {
        let (b, _, s, hd) = q.dims4()?;
        let scores = (q.matmul(&k.t()?)? * (hd as f64).powf(-0.5))?.broadcast_add(key_bias)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let out = probs.matmul(v)?.transpose(1, 2)?.reshape((b, s, self.nhead * hd))?;
        Ok(layer.out_proj.forward_add(&out, residual)?)
    }

    /// The feed-forward block with its residual: `h + linear2(relu(linear1(norm2(h))))`.
    fn feed_forward<P>(&self, layer: &HeadLayer<P>, h: &Tensor) -> Result<Tensor, ModelError> {
        let ff = FeedForward { up: &layer.linear1, down: &layer.linear2, activation: Activation::Relu, gated: false };
        Ok(ff.forward(&layer.norm2.forward(h)?, h)?)
    }

    /// A whole layer over packed rows: every token of `h` `[T, d]` in and out, each row's
    /// tokens attending to that row's alone (what the key-padding mask does in a padded batch).
    fn layer<P: Projections>(
        &self,
        layer: &HeadLayer<P>,
        h: &Tensor,
        rows: &[Range<usize>],
    ) -> Result<Tensor, ModelError> {
        let d = h.dim(1)?;
        let qkv = layer.in_proj.qkv(&layer.norm1.forward(h)?)?;
        let heads = self.nhead;
        let op = Attention { rows, heads, head_dim: d / heads, rope: None, mask: Mask::Sequential { window: None } };
        let attn = qkv.apply_op1_no_bwd(&op)?;
        drop(qkv);
        let h = layer.out_proj.forward_add(&attn, h)?;
        self.feed_forward(layer, &h)
    }

    /// The last layer at the tokens `picks` (`B * S` indices into the packed `[T]`) only: the
    /// queries, the output projection and the feed-forward for the picked tokens; the attention
    /// through the key and value weights with `through` (module doc,
    /// [`LastProj::through_weights`]), over keys and values from every token (padded per row to
    /// `[B, L, 2d]`, masked by `key_bias`) otherwise. `[B, S, d]`, equal to the whole layer's
    /// output gathered at `picks`.
    fn last_layer(
        &self,
        layer: &HeadLayer<LastProj>,
        h: &Tensor,
        rows: &[Range<usize>],
        picks: &Tensor,
        key_bias: &Tensor,
        through: bool,
    ) -> Result<Tensor, ModelError> {
        let d = h.dim(1)?;
        let b = rows.len();
        let s = picks.dim(0)? / b;
        let p = &layer.in_proj;
        let x = layer.norm1.forward(h)?;
        let gather = |t: &Tensor| -> candle_core::Result<Tensor> { t.index_select(picks, 0)?.reshape((b, s, d)) };
        let q = p.q.forward(&gather(&x)?)?;
        let h = if through {
            layer.out_proj.forward_add(&self.attend_through(p, &x, &q, rows)?, &gather(h)?)?
        } else {
            let kv = pad_rows(&p.kv(&x)?, rows)?;
            let (k, v) = (self.split_heads(&kv, 2, 0)?, self.split_heads(&kv, 2, 1)?);
            self.attend(layer, &gather(h)?, &self.split_heads(&q, 1, 0)?, &k, &v, key_bias)?
        };
        self.feed_forward(layer, &h)
    }

    /// The attention of the read rows' queries `q` `[B, S, d]` over their rows of the normed
    /// states `x` `[T, d]`, through the key and value weights (module doc): `[B, S, d]`, before
    /// the output projection. Row by row, so no padding.
    fn attend_through(
        &self,
        p: &LastProj,
        x: &Tensor,
        q: &Tensor,
        rows: &[Range<usize>],
    ) -> candle_core::Result<Tensor> {
        let (_, s, d) = q.dims3()?;
        let (heads, hd, _) = p.k.dims3()?;
        let scale = (hd as f64).powf(-0.5);
        let mut out = Vec::with_capacity(rows.len());
        for (row, r) in rows.iter().enumerate() {
            let xr = x.narrow(0, r.start, r.len())?;
            // [H, S, hd] through each head's key rows: [H, S, d].
            let qk = q.get(row)?.reshape((s, heads, hd))?.transpose(0, 1)?.contiguous()?.matmul(&p.k)?;
            let scores = (qk.reshape((heads * s, d))?.matmul(&xr.t()?)? * scale)?;
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            // The weighted states [H, S, d], through each head's value rows: [H, S, hd].
            let z = probs.matmul(&xr)?.reshape((heads, s, d))?;
            let o = z.matmul(&p.v.transpose(1, 2)?)?;
            out.push(o.transpose(0, 1)?.reshape((s, d))?.broadcast_add(&p.v_bias)?);
        }
        Tensor::stack(&out, 0)
    }

    /// Stage 3: `[B, L, d]` encoder states of rows with the given lengths (padded to `L`), types
    /// and marker positions -> each row's option logits and act logits. The rows are packed and
    /// run as [`Head::forward_packed`].
    pub fn forward(
        &self,
        hidden: &Tensor,
        lengths: &[usize],
        qtypes: &[u32],
        markers: &[&[u32]],
    ) -> Result<Vec<HeadOutput>, ModelError> {
        let mut rows = Vec::with_capacity(lengths.len());
        let mut parts = Vec::with_capacity(lengths.len());
        for (r, &len) in lengths.iter().enumerate() {
            let start = rows.last().map_or(0, |p: &Range<usize>| p.end);
            rows.push(start..start + len);
            parts.push(hidden.get(r)?.narrow(0, 0, len)?);
        }
        self.forward_packed(&Tensor::cat(&parts, 0)?, &rows, qtypes, markers)
    }

    /// Stage 3 over rows packed end to end: `[T, d]` encoder states, each row's tokens in `rows`
    /// -> each row's option logits and act logits. No padding token is computed but for the
    /// last layer's keys and values, padded to the longest row for the few queries it runs.
    pub fn forward_packed(
        &self,
        hidden: &Tensor,
        rows: &[Range<usize>],
        qtypes: &[u32],
        markers: &[&[u32]],
    ) -> Result<Vec<HeadOutput>, ModelError> {
        let (t, d) = hidden.dims2()?;
        let b = rows.len();
        if b == 0 || qtypes.len() != b || markers.len() != b || rows.iter().any(|r| r.is_empty() || r.end > t) {
            return Err(candle_core::Error::Msg(format!(
                "head: rows {rows:?} of {t} tokens, {} types, {} marker lists",
                qtypes.len(),
                markers.len()
            ))
            .into());
        }
        let dev = Device::Cpu;
        let token_types: Vec<u32> =
            rows.iter().zip(qtypes).flat_map(|(r, &q)| std::iter::repeat_n(q, r.len())).collect();
        let mut h = (hidden + self.type_emb.index_select(&Tensor::from_vec(token_types, t, &dev)?, 0)?)?;
        let lengths: Vec<usize> = rows.iter().map(|r| r.len()).collect();
        let l = lengths.iter().copied().max().unwrap_or(1);
        let key_bias = Tensor::from_vec(super::masks::key_padding_biases(&lengths, l), (b, 1, 1, l), &dev)?;
        // The tokens the head reads, per row: position 0, then each marker slot (a row without a
        // marker k reads position 0, masked below).
        let kmax = markers.iter().map(|m| m.len()).max().unwrap_or(0).max(1);
        let s = 1 + kmax;
        let mut index = Vec::with_capacity(b * s);
        for (r, m) in rows.iter().zip(markers) {
            index.push(r.start as u32);
            for j in 0..kmax {
                let pos = m.get(j).copied().unwrap_or(0) as usize;
                index.push((r.start + pos.min(r.len() - 1)) as u32);
            }
        }
        let picks = Tensor::from_vec(index, b * s, &dev)?;
        for layer in &self.layers {
            h = self.layer(layer, &h, rows)?;
        }
        let read = match &self.last {
            Some(last) if self.reduce_last => {
                let through = last.in_proj.through_weights(s, l);
                self.last_layer(last, &h, rows, &picks, &key_bias, through)?
            }
            Some(last) => self.layer(last, &h, rows)?.index_select(&picks, 0)?.reshape((b, s, d))?,
            None => h.index_select(&picks, 0)?.reshape((b, s, d))?,
        };
        let pooled = read.narrow(1, 0, 1)?.squeeze(1)?;
        let picked = read.narrow(1, 1, kmax)?;
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
        let feats = Tensor::from_vec(feats, (b, 4), &dev)?;
        let act_in = Tensor::cat(&[&pooled, &feats], 1)?;
        let act: Vec<Vec<f32>> = self.act2.forward(&self.act1.forward(&act_in)?.gelu_erf()?)?.to_vec2()?;
        Ok(logits_out.into_iter().zip(act).map(|(logits, act_logits)| HeadOutput { logits, act_logits }).collect())
    }
}

/// Packed rows `[T, w]` padded with zeros to the longest row: `[B, L, w]`.
fn pad_rows(t: &Tensor, rows: &[Range<usize>]) -> candle_core::Result<Tensor> {
    let l = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let padded = rows
        .iter()
        .map(|r| t.narrow(0, r.start, r.len())?.pad_with_zeros(0, 0, l - r.len()))
        .collect::<candle_core::Result<Vec<_>>>()?;
    Tensor::stack(&padded, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(shape: &[usize]) -> Tensor {
        Tensor::randn(0f32, 0.3, shape, &Device::Cpu).unwrap()
    }

    fn random_linear(o: usize, i: usize) -> Dense {
        Dense::new(&random(&[o, i]), Some(&random(&[o]))).unwrap()
    }

    fn random_norm(d: usize) -> LayerNorm {
        LayerNorm::new(&(random(&[d]) + 1.0).unwrap(), Some(&random(&[d])), HEAD_EPS).unwrap()
    }

    /// A layer with the projections `in_proj`.
    fn random_layer<P>(d: usize, in_proj: P) -> HeadLayer<P> {
        HeadLayer {
            norm1: random_norm(d),
            in_proj,
            out_proj: random_linear(d, d),
            norm2: random_norm(d),
            linear1: random_linear(4 * d, d),
            linear2: random_linear(d, 4 * d),
        }
    }

    fn random_head(d: usize, layers: usize) -> Head {
        Head {
            nhead: 2,
            type_emb: random(&[3, d]),
            layers: (1..layers).map(|_| random_layer(d, random_linear(3 * d, d))).collect(),
            // The random heads have 2 heads.
            last: (layers > 0)
                .then(|| random_layer(d, LastProj::new(&random(&[3 * d, d]), &random(&[3 * d]), 2).unwrap())),
            scorer_norm: random_norm(d),
            scorer1: random_linear(d, d),
            scorer2: random_linear(1, d),
            act1: random_linear(256, d + 4),
            act2: random_linear(3, 256),
            reduce_last: true,
        }
    }

    #[test]
    fn a_row_gets_the_same_outputs_alone_as_in_a_padded_batch() {
        // One row reads its heads in place, a batch copies them: both must agree, and with the
        // padding masked, a short row must not see its batch's longer rows. (Alone, a row's 11
        // positions take dense.rs's few-rows path, the batch's 22 the other: the sums differ in
        // order, hence a relative tolerance; reading a wrong head differs by whole units.)
        let (d, l) = (128, 11);
        let head = random_head(d, 2);
        let hidden = random(&[2, l, d]);
        let (lengths, qtypes) = ([11, 7], [0u32, 2]);
        let markers: [&[u32]; 2] = [&[3, 5, 9], &[2, 6]];
        let batch = head.forward(&hidden, &lengths, &qtypes, &markers).unwrap();
        for row in 0..2 {
            let alone = hidden.narrow(0, row, 1).unwrap().narrow(1, 0, lengths[row]).unwrap();
            let got = head.forward(&alone, &lengths[row..=row], &qtypes[row..=row], &markers[row..=row]).unwrap();
            let (a, b) = (&got[0], &batch[row]);
            assert_eq!(a.logits.len(), markers[row].len());
            for (x, y) in a.logits.iter().chain(&a.act_logits).zip(b.logits.iter().chain(&b.act_logits)) {
                assert!((x - y).abs() <= 1e-4 * x.abs().max(1.0), "row {row}: {x} alone, {y} in the batch");
            }
        }
        assert_ne!(batch[0].act_logits, batch[1].act_logits);
    }

    #[test]
    fn the_last_layer_computed_at_the_read_rows_equals_the_whole_layer_gathered_there() {
        let (d, l) = (128, 9);
        let head = random_head(d, 1);
        let Some(layer) = &head.last else { panic!("a head of one layer") };
        // Two rows packed, the second shorter (6 tokens): position 0, markers, a repeated slot.
        let lengths = [9, 6];
        let rows = [0..9, 9..15];
        let key_bias =
            Tensor::from_vec(crate::backend::cpu::masks::key_padding_biases(&lengths, l), (2, 1, 1, l), &Device::Cpu)
                .unwrap();
        let picks_v: Vec<u32> = vec![0, 3, 8, 1, 9, 9 + 5, 9 + 2, 9];
        let picks = Tensor::from_vec(picks_v.clone(), 8, &Device::Cpu).unwrap();
        let h = random(&[15, d]);
        let whole = head.layer(layer, &h, &rows).unwrap();
        let want: Vec<f32> = whole.index_select(&picks, 0).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        // Over keys and values at every token, and through the key and value weights.
        for through in [false, true] {
            let got = head.last_layer(layer, &h, &rows, &picks, &key_bias, through).unwrap();
            let got: Vec<f32> = got.flatten_all().unwrap().to_vec1().unwrap();
            assert_eq!(got.len(), want.len());
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            let top = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            // The same sums in another order: a relative tolerance (a wrong head or a lost bias
            // is off by whole units).
            assert!(worst <= 1e-5 * top, "through the weights {through}: largest difference {worst} of {top}");
        }
        // And the outputs differ per row: the check compares something.
        assert!(want[..d].iter().zip(&want[d..2 * d]).any(|(a, b)| (a - b).abs() > 1e-3));
    }

    #[test]
    fn the_last_layer_goes_through_the_weights_for_few_read_rows_and_not_for_many() {
        // The QCS6490 head's dimensions: d=1024, 16 heads.
        let (d, heads) = (1024, 16);
        let p = LastProj::new(&random(&[3 * d, d]), &random(&[3 * d]), heads).unwrap();
        // 5 read rows (4 markers): through the weights at every length from 32 tokens up.
        for l in [32, 128, 256, 512] {
            assert!(p.through_weights(5, l), "5 read rows of {l} tokens");
        }
        // 64 markers of a 128-token row: keys and values at every token cost less.
        assert!(!p.through_weights(65, 128));
        assert!(!p.through_weights(5, 4), "a 4-token row");
    }
}
