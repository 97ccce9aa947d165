//! The feed-forward blocks, the encoder's `h + Wo(act(a) * g)` where `a, g = Wi(x).chunk(2)`
//! and the head's `h + linear2(relu(linear1(x)))`, run a block of [`TOKENS`] tokens at a time,
//! the activation (and the gate's product) in one pass.
//!
//! Why blocks: the inner product's output is the largest buffer of a layer (10.25 MiB for a
//! 512-token row at d=1024 and an encoder FFN of 2624, gated; 8 MiB in a head of FFN 4096).
//! Computed whole, with the activation's copy, the product's and the packed product on top, a
//! feed-forward held 26-31 MiB at once and set the worker's memory under load (BENCHMARKS.md,
//! "Memory with 512-token rows").
//! A block's intermediate is a few MiB and is reused from block to block. Each token's result is
//! the same sums in the same order whatever the block (a token's products do not read its
//! neighbours), so the block size is a memory choice, not a numerical one.
//!
//! The exact GELU of a gated block (ModernBERT's GeGLU) runs vectorised (`vector::gelu_gate`:
//! candle's formula on an `erf` within 2 ulps of libm's); the other activations are candle's own
//! scalar ops (`candle_core::op::Gelu` and the others, the functions `Tensor::gelu` maps), so
//! their floats are those the tensor ops gave.

use candle_core::op::{Gelu, GeluErf, Relu, Silu, UnaryOpT};
use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::config::Activation;
use super::dense::{Dense, contiguous_f32};
use super::vector;

/// Tokens of a block: one token block of the packed product (`panels::TOKEN_BLOCK`), so the
/// products stream their weights exactly as often as on the whole row.
pub const TOKENS: usize = super::panels::TOKEN_BLOCK;

/// A feed-forward block, applied as `x.apply_op2(h)` with `x` the normed hidden states and `h`
/// the residual: `h + down(act(up(x)))`, or gated (the encoder's GeGLU) `h + down(act(a) * g)`
/// where `a, g = up(x).chunk(2)`.
pub struct FeedForward<'a> {
    pub up: &'a Dense,
    pub down: &'a Dense,
    pub activation: Activation,
    pub gated: bool,
}

impl FeedForward<'_> {
    /// The block over `x` with the residual `h`, both of the same shape `[.., d]`.
    pub fn forward(&self, x: &Tensor, h: &Tensor) -> candle_core::Result<Tensor> {
        x.contiguous()?.apply_op2_no_bwd(&h.contiguous()?, self)
    }

    fn run(&self, x: &[f32], h: &[f32]) -> candle_core::Result<Vec<f32>> {
        let (d, f) = (self.down.out(), self.down.inp());
        let width = if self.gated { 2 * f } else { f };
        if d == 0
            || f == 0
            || self.up.inp() != d
            || self.up.out() != width
            || x.len() != h.len()
            || !x.len().is_multiple_of(d)
        {
            candle_core::bail!(
                "feed-forward: up {} -> {}, down {f} -> {d}{}, {} inputs, {} residuals",
                self.up.inp(),
                self.up.out(),
                if self.gated { " (gated)" } else { "" },
                x.len(),
                h.len()
            );
        }
        let n = x.len() / d;
        let mut out = h.to_vec();
        let block = TOKENS.min(n);
        let mut inter = vec![0f32; block * width];
        let mut gated = vec![0f32; if self.gated { block * f } else { 0 }];
        for start in (0..n).step_by(TOKENS) {
            let c = TOKENS.min(n - start);
            let inter = &mut inter[..c * width];
            inter.fill(0.0);
            self.up.add_to(&x[start * d..(start + c) * d], c, inter)?;
            let act: &[f32] = if self.gated {
                let gated = &mut gated[..c * f];
                match self.activation {
                    Activation::Gelu => gate(inter, gated, f, vector::gelu_gate),
                    Activation::GeluTanh => gate(inter, gated, f, scalar_gate::<Gelu>),
                    Activation::Relu => gate(inter, gated, f, scalar_gate::<Relu>),
                    Activation::Silu => gate(inter, gated, f, scalar_gate::<Silu>),
                }
                gated
            } else {
                match self.activation {
                    Activation::Gelu => apply::<GeluErf>(inter),
                    Activation::GeluTanh => apply::<Gelu>(inter),
                    Activation::Relu => apply::<Relu>(inter),
                    Activation::Silu => apply::<Silu>(inter),
                }
                inter
            };
            self.down.add_to(act, c, &mut out[start * d..(start + c) * d])?;
        }
        Ok(out)
    }
}

/// Whether elementwise passes split their tokens over candle's threads.
fn parallel() -> bool {
    candle_core::utils::get_num_threads() > 1
}

/// `gated[t] = act(a[t]) * g[t]` for each token `t` of a block, where `inter[t] = [a | g]`
/// (`2f` floats) and `gated[t]` has `f`: `row(gated[t], a, g)` for each.
fn gate(inter: &[f32], gated: &mut [f32], f: usize, row: impl Fn(&mut [f32], &[f32], &[f32]) + Sync) {
    let one = |(y, ag): (&mut [f32], &[f32])| {
        let (a, g) = ag.split_at(f);
        row(y, a, g);
    };
    if parallel() {
        gated.par_chunks_mut(f).zip(inter.par_chunks(2 * f)).for_each(one);
    } else {
        gated.chunks_mut(f).zip(inter.chunks(2 * f)).for_each(one);
    }
}

/// `y = act(a) * g` with candle's scalar op.
fn scalar_gate<A: UnaryOpT>(y: &mut [f32], a: &[f32], g: &[f32]) {
    for ((y, &a), &g) in y.iter_mut().zip(a).zip(g) {
        *y = A::f32(a) * g;
    }
}

/// `v = act(v)` in place over a block.
fn apply<A: UnaryOpT>(inter: &mut [f32]) {
    let one = |v: &mut f32| *v = A::f32(*v);
    if parallel() {
        inter.par_iter_mut().for_each(one);
    } else {
        inter.iter_mut().for_each(one);
    }
}

impl CustomOp2 for FeedForward<'_> {
    fn name(&self) -> &'static str {
        "feed-forward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, h) =
            (contiguous_f32(s1, l1, "feed-forward: input")?, contiguous_f32(s2, l2, "feed-forward: residual")?);
        if l1.dims() != l2.dims() {
            candle_core::bail!("feed-forward: input {:?} and residual {:?}", l1.dims(), l2.dims());
        }
        Ok((CpuStorage::F32(self.run(x, h)?), l2.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{D, Device};

    use super::*;

    fn random(shape: &[usize]) -> Tensor {
        Tensor::randn(0f32, 0.5, shape, &Device::Cpu).unwrap()
    }

    fn activate(act: Activation, a: &Tensor) -> Tensor {
        match act {
            Activation::Gelu => a.gelu_erf(),
            Activation::GeluTanh => a.gelu(),
            Activation::Relu => a.relu(),
            Activation::Silu => a.silu(),
        }
        .unwrap()
    }

    /// The block as the tensor ops compute it, whole: what the encoder and the head did before
    /// blocks.
    fn whole(up: &Dense, down: &Dense, act: Activation, gated: bool, x: &Tensor, h: &Tensor) -> Tensor {
        let inter = up.forward(x).unwrap();
        let f = down.inp();
        let inner = if gated && act == Activation::Gelu {
            // The vectorised GeGLU, over the whole intermediate at once.
            let rows = inter.dims2().unwrap().0;
            let mut out = vec![0f32; rows * f];
            gate(&inter.flatten_all().unwrap().to_vec1::<f32>().unwrap(), &mut out, f, vector::gelu_gate);
            Tensor::from_vec(out, (rows, f), &Device::Cpu).unwrap()
        } else if gated {
            let (a, g) = (inter.narrow(D::Minus1, 0, f).unwrap(), inter.narrow(D::Minus1, f, f).unwrap());
            (activate(act, &a) * g).unwrap()
        } else {
            activate(act, &inter)
        };
        down.forward_add(&inner, h).unwrap()
    }

    #[test]
    fn blocks_of_tokens_give_the_whole_blocks_floats_bit_for_bit_gated_or_not_for_every_activation() {
        // The down product's depth (f) spans two of the products' depth blocks.
        let (d, f) = (40, 272);
        for gated in [true, false] {
            let width = if gated { 2 * f } else { f };
            let up = Dense::new(&random(&[width, d]), Some(&random(&[width]))).unwrap();
            let down = Dense::new(&random(&[d, f]), Some(&random(&[d]))).unwrap();
            // Fewer tokens than a block, one exactly, and blocks with a partial last one.
            for tokens in [1, 7, TOKENS, TOKENS + 1, 2 * TOKENS + 13] {
                let (x, h) = (random(&[tokens, d]), random(&[tokens, d]));
                for act in [Activation::Gelu, Activation::GeluTanh, Activation::Relu, Activation::Silu] {
                    let want = whole(&up, &down, act, gated, &x, &h).flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    let ff = FeedForward { up: &up, down: &down, activation: act, gated };
                    let got = ff.forward(&x, &h).unwrap();
                    assert_eq!(got.dims(), &[tokens, d]);
                    let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert!(bits(&got) == bits(&want), "{tokens} tokens, {act:?}, gated {gated}");
                }
            }
        }
    }

    #[test]
    fn the_vectorised_geglu_gives_the_tensor_ops_floats_within_float_error() {
        let (d, f, tokens) = (40, 272, 2 * TOKENS + 13);
        let up = Dense::new(&random(&[2 * f, d]), Some(&random(&[2 * f]))).unwrap();
        let down = Dense::new(&random(&[d, f]), Some(&random(&[d]))).unwrap();
        let (x, h) = ((random(&[tokens, d]) * 4.0).unwrap(), random(&[tokens, d]));
        let inter = up.forward(&x).unwrap();
        let (a, g) = (inter.narrow(D::Minus1, 0, f).unwrap(), inter.narrow(D::Minus1, f, f).unwrap());
        let want = down.forward_add(&(a.gelu_erf().unwrap() * g).unwrap(), &h).unwrap();
        let got =
            FeedForward { up: &up, down: &down, activation: Activation::Gelu, gated: true }.forward(&x, &h).unwrap();
        let worst: f32 =
            (got - &want).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap();
        let largest: f32 = want.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap();
        assert!(worst <= 1e-5 * largest, "{worst} of {largest}");
    }

    #[test]
    fn a_batch_keeps_its_leading_dimensions_and_a_mismatched_residual_is_refused() {
        let (d, i) = (16, 8);
        let wi = Dense::new(&random(&[2 * i, d]), None).unwrap();
        let wo = Dense::new(&random(&[d, i]), None).unwrap();
        let ff = FeedForward { up: &wi, down: &wo, activation: Activation::Gelu, gated: true };
        let (x, h) = (random(&[2, 5, d]), random(&[2, 5, d]));
        assert_eq!(ff.forward(&x, &h).unwrap().dims(), &[2, 5, d]);
        let err = ff.forward(&x, &random(&[2, 4, d])).expect_err("a residual of another shape");
        assert!(err.to_string().contains("residual"), "{err}");
        // No feature to step by is an error, not a panic.
        let (none_in, none_out) =
            (Dense::new(&random(&[0, d]), None).unwrap(), Dense::new(&random(&[d, 0]), None).unwrap());
        let empty = FeedForward { up: &none_in, down: &none_out, activation: Activation::Gelu, gated: true };
        assert!(empty.forward(&x, &h).is_err());
        // Weights that do not chain (Wi's output is not twice Wo's input) are refused, not run.
        let bad = FeedForward { up: &wo, down: &wo, activation: Activation::Gelu, gated: true };
        assert!(bad.forward(&random(&[3, i]), &random(&[3, i])).is_err());
    }
}
