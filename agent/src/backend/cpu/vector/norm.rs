//! Layer norm over rows: `(x - mean) / sqrt(var + eps) * w (+ b)` in three vector passes: a first
//! mean `m`; the sum of `x - m` and of its square (the mean's correction `c` and the variance,
//! from the shifted values); then `((x - m) - c) / sqrt(var + eps) * w (+ b)`.
//!
//! Why shifted: candle's scalar `layer_norm` (what the model called before issue #43) takes
//! `E[x^2] - mean^2` in f32, which loses the variance to cancellation when a row's mean is large
//! against its spread, and a mean summed in f32 is itself off by far more than the spread then;
//! PyTorch, which laya runs on, loses neither. Shifting by the first mean keeps both sums at the
//! scale of the spread. **Maximum error** against the same function in f64: `2^-18 (|w| (1 +
//! |x̂|) + |b|)` per element, x̂ being the normed value, for rows of up to 4096 values whose mean
//! is up to 10^4 standard deviations from 0 (`layer_norm_is_within_its_documented_error_of_f64_on_every_path`
//! prints what it measured). A row with a NaN or an infinity gives NaN throughout, a constant row
//! gives the shift.

use pulp::{Simd, WithSimd};
use rayon::prelude::*;

use super::{Isa, Pass};

/// Layer norm of each row of `x` (rows of `weight.len()` values) into `out` (the same size),
/// on this process's instruction set; the rows on rayon's pool when `parallel`. Leftover values
/// past the last whole row, and rows past the shorter of `x` and `out`, are not touched.
pub fn layer_norm(x: &[f32], weight: &[f32], bias: Option<&[f32]>, eps: f32, out: &mut [f32], parallel: bool) {
    layer_norm_on(Isa::active(), x, weight, bias, eps, out, parallel);
}

/// [`layer_norm`] on `isa`.
pub(super) fn layer_norm_on(
    isa: Isa,
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    eps: f32,
    out: &mut [f32],
    parallel: bool,
) {
    let d = weight.len();
    if d == 0 || bias.is_some_and(|b| b.len() != d) {
        return;
    }
    let one = |(out, x): (&mut [f32], &[f32])| Row { x, weight, bias, eps, out }.run(isa);
    if parallel {
        out.par_chunks_exact_mut(d).zip(x.par_chunks_exact(d)).for_each(one);
    } else {
        out.chunks_exact_mut(d).zip(x.chunks_exact(d)).for_each(one);
    }
}

/// The mean's correction and the variance from the sums of the shifted values and of their
/// squares over `d` values (the variance never below 0).
#[inline(always)]
fn moments(shifted: f32, squares: f32, d: f32) -> (f32, f32) {
    let correction = shifted / d;
    (correction, (squares / d - correction * correction).max(0.0))
}

/// One row.
struct Row<'a> {
    x: &'a [f32],
    weight: &'a [f32],
    bias: Option<&'a [f32]>,
    eps: f32,
    out: &'a mut [f32],
}

impl Pass for Row<'_> {
    fn scalar(self) {
        let d = self.x.len() as f32;
        let first = self.x.iter().sum::<f32>() / d;
        let (shifted, squares) =
            self.x.iter().fold((0f32, 0f32), |(s, q), v| (s + (v - first), q + (v - first) * (v - first)));
        let (correction, var) = moments(shifted, squares, d);
        let inv = 1.0 / (var + self.eps).sqrt();
        for (i, (y, v)) in self.out.iter_mut().zip(self.x).enumerate() {
            let scaled = ((v - first) - correction) * inv * self.weight[i];
            *y = self.bias.map_or(scaled, |b| scaled + b[i]);
        }
    }
}

impl WithSimd for Row<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let d = self.x.len() as f32;
        let (x, x_tail) = S::as_simd_f32s(self.x);
        let mut sums = simd.splat_f32s(0.0);
        for v in x {
            sums = simd.add_f32s(sums, *v);
        }
        let first = (simd.reduce_sum_f32s(sums) + x_tail.iter().sum::<f32>()) / d;
        let first_v = simd.splat_f32s(first);
        let (mut shifted, mut squares) = (simd.splat_f32s(0.0), simd.splat_f32s(0.0));
        for v in x {
            let dev = simd.sub_f32s(*v, first_v);
            shifted = simd.add_f32s(shifted, dev);
            squares = simd.mul_add_e_f32s(dev, dev, squares);
        }
        let (tail_shifted, tail_squares) =
            x_tail.iter().fold((0f32, 0f32), |(s, q), v| (s + (v - first), q + (v - first) * (v - first)));
        let (correction, var) =
            moments(simd.reduce_sum_f32s(shifted) + tail_shifted, simd.reduce_sum_f32s(squares) + tail_squares, d);
        let inv = 1.0 / (var + self.eps).sqrt();
        let (correction_v, inv_v) = (simd.splat_f32s(correction), simd.splat_f32s(inv));
        let (w, w_tail) = S::as_simd_f32s(self.weight);
        let (out, out_tail) = S::as_mut_simd_f32s(self.out);
        let scaled = |v: S::f32s, w: S::f32s| {
            simd.mul_f32s(simd.mul_f32s(simd.sub_f32s(simd.sub_f32s(v, first_v), correction_v), inv_v), w)
        };
        match self.bias {
            Some(b) => {
                let (b, _) = S::as_simd_f32s(b);
                for (((y, v), w), b) in out.iter_mut().zip(x).zip(w).zip(b) {
                    *y = simd.add_f32s(scaled(*v, *w), *b);
                }
            }
            None => {
                for ((y, v), w) in out.iter_mut().zip(x).zip(w) {
                    *y = scaled(*v, *w);
                }
            }
        }
        let start = self.x.len() - x_tail.len();
        for (i, (y, v)) in out_tail.iter_mut().zip(x_tail).enumerate() {
            let scaled = ((v - first) - correction) * inv * w_tail[i];
            *y = self.bias.map_or(scaled, |b| scaled + b[start + i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same two-pass layer norm in f64.
    fn reference(x: &[f32], w: &[f32], b: Option<&[f32]>, eps: f32) -> Vec<(f64, f64)> {
        let d = x.len() as f64;
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / d;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d;
        let inv = 1.0 / (var + eps as f64).sqrt();
        (0..x.len())
            .map(|i| {
                let normed = (x[i] as f64 - mean) * inv;
                (normed * w[i] as f64 + b.map_or(0.0, |b| b[i] as f64), normed)
            })
            .collect()
    }

    fn values(n: usize, seed: u64, mean: f32, spread: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                mean + spread * (((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
            })
            .collect()
    }

    /// The documented bound, as a power of two.
    const ERROR: f64 = 1.0 / (1u64 << 18) as f64;

    #[test]
    fn layer_norm_is_within_its_documented_error_of_f64_on_every_path() {
        for isa in Isa::available() {
            let mut worst = 0f64;
            for d in [1, 3, 8, 17, 64, 768, 1024, 1031, 4096] {
                let w = values(d, 1, 1.0, 0.5);
                let b = values(d, 2, 0.0, 0.2);
                for (mean, spread) in [(0.0, 1.0), (5.0, 1e-3), (-300.0, 1.0), (0.0, 1e4), (1.0, 1e-3), (1e3, 2.0)] {
                    for (eps, bias) in [(1e-5, None), (1e-5, Some(&b[..]))] {
                        let rows = 3;
                        let x: Vec<f32> = (0..rows).flat_map(|r| values(d, 10 + r as u64, mean, spread)).collect();
                        let mut out = vec![f32::NAN; rows * d];
                        layer_norm_on(isa, &x, &w, bias, eps, &mut out, rows > 1 && d > 500);
                        for r in 0..rows {
                            let want = reference(&x[r * d..(r + 1) * d], &w, bias, eps);
                            for (i, (y, n)) in want.into_iter().enumerate() {
                                let scale =
                                    (w[i] as f64).abs() * (1.0 + n.abs()) + bias.map_or(0.0, |b| (b[i] as f64).abs());
                                let err = (out[r * d + i] as f64 - y).abs() / scale;
                                worst = worst.max(err);
                                assert!(
                                    err <= ERROR,
                                    "{} d={d} mean {mean} spread {spread}: {} against {y} ({err:e})",
                                    isa.name(),
                                    out[r * d + i]
                                );
                            }
                        }
                    }
                }
            }
            eprintln!("layer norm on {}: at most {worst:e} of |w| (1 + |x̂|) + |b|", isa.name());
        }
    }

    #[test]
    fn a_row_with_nan_or_infinity_is_nan_and_a_constant_row_gives_the_shift_on_every_path() {
        let d = 37;
        let (w, b) = (values(d, 3, 1.0, 0.5), values(d, 4, 0.0, 1.0));
        for isa in Isa::available() {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut x = values(d, 5, 0.0, 1.0);
                x[20] = bad;
                let mut out = vec![0f32; d];
                layer_norm_on(isa, &x, &w, Some(&b), 1e-5, &mut out, false);
                assert!(out.iter().all(|v| v.is_nan()), "{} with {bad}: {out:?}", isa.name());
            }
            let mut out = vec![0f32; d];
            layer_norm_on(isa, &[2.5; 37], &w, Some(&b), 1e-5, &mut out, false);
            assert_eq!(out, b, "{}", isa.name());
        }
    }

    #[test]
    fn a_bias_of_the_wrong_length_or_no_weight_leaves_the_output_as_it_was() {
        let mut out = vec![7.0f32; 8];
        layer_norm_on(Isa::active(), &[1.0; 8], &[1.0; 4], Some(&[0.0; 3]), 1e-5, &mut out, false);
        layer_norm_on(Isa::active(), &[1.0; 8], &[], None, 1e-5, &mut out, false);
        assert_eq!(out, vec![7.0; 8]);
    }
}
