//! `erf` on SIMD lanes, and the encoder's GeGLU pass with it: `gelu(a) * g` over a token's halves,
//! GELU being the exact (erf) one ModernBERT's `hidden_activation = "gelu"` names, computed as
//! candle's `GeluErf` computes it, `(erf(a / sqrt 2) + 1) * 0.5 * a`, with a vector `erf` in place
//! of libm's `erff` (the `libm` crate's, which candle calls).
//!
//! The method is the faithfully rounded `erff` Norbert Juffa published (Stack Overflow question
//! 35148198; ONNX Runtime's MLAS uses the same coefficients): below |x| = 0.921875 an odd
//! polynomial, `x + x P(x^2)`; above, `1 - exp(-Q(|x|))` with this module's sibling `exp`; 1 from
//! |x| = 3.925 on, where `erff` is 1 in f32. **Maximum error: 2 ulps** against libm's `erff` over
//! every float (NaN gives NaN, ±0 ±0, ±inf ±1; measured 1 ulp on AVX-512 and AVX2 over all 2^32
//! bit patterns, `erf_is_within_its_documented_ulps_of_libm_on_every_path` with `LAYA_SWEEP_STEP=1`
//! as for `exp`).
//!
//! GeGLU: `gelu(a) * g` equals candle's scalar formula on libm's `erff` up to that erf error
//! carried through, `0.5 |a g|` times (2 ulps of `erff(a / sqrt 2)` plus the ulp of `1 + erf` it
//! may round across), plus 3 ulps of the result: the rest of the formula is the same operations in
//! the same order.

use std::f32::consts::FRAC_1_SQRT_2;

use candle_core::op::{GeluErf, UnaryOpT};
use pulp::{Simd, WithSimd};

use super::exp::exp;
use super::{Isa, Pass};

/// Where the two approximations meet, and where erf is 1 in f32.
const SPLIT: f32 = 0.921_875;
const UPPER: f32 = 3.925;
/// `erf(x) ~ x + x P(x^2)` for |x| <= SPLIT.
const SMALL: [f32; 6] =
    [-5.991_049_7e-4, 4.993_396e-3, -2.676_673_4e-2, 1.128_180_25e-1, -3.761_248_6e-1, 1.283_791_5e-1];
/// `erf(x) ~ 1 - exp(-(t + t Q(t)))`, t = |x|, above SPLIT.
const BIG: [f32; 7] =
    [1.729_489_3e-5, -3.832_086_8e-4, 3.883_934_3e-3, -2.425_456e-2, 1.067_778_5e-1, 6.348_467e-1, 1.287_175_1e-1];

/// `erf(x)` in every lane.
#[inline(always)]
pub(super) fn erf<S: Simd>(simd: S, x: S::f32s) -> S::f32s {
    let splat = |v: f32| simd.splat_f32s(v);
    let sign = simd.and_f32s(x, splat(-0.0));
    let t = simd.min_f32s(simd.abs_f32s(x), splat(UPPER));
    let square = simd.mul_f32s(t, t);
    let mut small = splat(SMALL[0]);
    for c in &SMALL[1..] {
        small = simd.mul_add_e_f32s(small, square, splat(*c));
    }
    let small = simd.mul_add_e_f32s(small, t, t);
    let mut big = splat(BIG[0]);
    for c in &BIG[1..] {
        big = simd.mul_add_e_f32s(big, t, splat(*c));
    }
    let big = simd.mul_add_e_f32s(big, t, t);
    let big = simd.sub_f32s(splat(1.0), exp(simd, simd.sub_f32s(splat(0.0), big)));
    let r = simd.select_f32s(simd.greater_than_f32s(t, splat(SPLIT)), big, small);
    let r = simd.or_f32s(r, sign);
    // NaN stays NaN (the clamp above replaced it).
    simd.select_f32s(simd.equal_f32s(x, x), r, x)
}

/// `y = gelu(a) * g` over one token's halves, on this process's instruction set (over the
/// shortest of the three, which the feed-forward makes equal).
pub fn gelu_gate(y: &mut [f32], a: &[f32], g: &[f32]) {
    gelu_gate_on(Isa::active(), y, a, g);
}

/// [`gelu_gate`] on `isa`.
pub(super) fn gelu_gate_on(isa: Isa, y: &mut [f32], a: &[f32], g: &[f32]) {
    let n = y.len().min(a.len()).min(g.len());
    GeluGate { y: &mut y[..n], a: &a[..n], g: &g[..n] }.run(isa);
}

struct GeluGate<'a> {
    y: &'a mut [f32],
    a: &'a [f32],
    g: &'a [f32],
}

/// candle's GELU, `(erf(a / sqrt 2) + 1) * 0.5 * a`, on the vector erf.
#[inline(always)]
fn gelu<S: Simd>(simd: S, a: S::f32s) -> S::f32s {
    let e = erf(simd, simd.mul_f32s(a, simd.splat_f32s(FRAC_1_SQRT_2)));
    simd.mul_f32s(simd.mul_f32s(simd.add_f32s(e, simd.splat_f32s(1.0)), simd.splat_f32s(0.5)), a)
}

impl Pass for GeluGate<'_> {
    /// candle's `GeluErf` on libm's `erff` (the GeGLU before issue #43).
    fn scalar(self) {
        for ((y, &a), &g) in self.y.iter_mut().zip(self.a).zip(self.g) {
            *y = GeluErf::f32(a) * g;
        }
    }
}

impl WithSimd for GeluGate<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let (y, y_tail) = S::as_mut_simd_f32s(self.y);
        let (a, a_tail) = S::as_simd_f32s(self.a);
        let (g, g_tail) = S::as_simd_f32s(self.g);
        for ((y, a), g) in y.iter_mut().zip(a).zip(g) {
            *y = simd.mul_f32s(gelu(simd, *a), *g);
        }
        if !y_tail.is_empty() {
            let v = simd.mul_f32s(gelu(simd, simd.partial_load_f32s(a_tail)), simd.partial_load_f32s(g_tail));
            simd.partial_store_f32s(y_tail, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::accuracy::{sweep, ulps};
    use super::*;

    /// The reference: the `erff` candle's GELU calls (the `libm` crate's port of FreeBSD's).
    fn libm_erf(x: f32) -> f32 {
        candle_core::cpu::erf::erf_f32(x)
    }

    /// `erf` over a slice on `isa` (the scalar path: libm).
    struct Erf<'a>(&'a mut [f32]);

    impl Pass for Erf<'_> {
        fn scalar(self) {
            self.0.iter_mut().for_each(|v| *v = libm_erf(*v));
        }
    }

    impl WithSimd for Erf<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) {
            let (head, tail) = S::as_mut_simd_f32s(self.0);
            for v in head.iter_mut() {
                *v = erf(simd, *v);
            }
            let e = erf(simd, simd.partial_load_f32s(tail));
            simd.partial_store_f32s(tail, e);
        }
    }

    const ERF_ULPS: u32 = 2;

    #[test]
    fn erf_is_within_its_documented_ulps_of_libm_on_every_path() {
        // The split between the two approximations, the clamp, where erff turns 1 in f32, and the
        // start of the small-argument range.
        let isas = Isa::available();
        let mut worst = vec![(0u32, 0f32); isas.len()];
        let count = sweep(&[SPLIT, UPPER, 3.919_205, 0.5, 2.0, 1e-4, 1e-20], |x| {
            let want: Vec<f32> = x.iter().map(|v| libm_erf(*v)).collect();
            for (isa, worst) in isas.iter().zip(worst.iter_mut()) {
                let mut got = x.to_vec();
                Erf(&mut got).run(*isa);
                for ((g, w), x) in got.iter().zip(&want).zip(x) {
                    if ulps(*g, *w) > worst.0 {
                        *worst = (ulps(*g, *w), *x);
                    }
                }
            }
        });
        for (isa, (worst, at)) in isas.iter().zip(worst) {
            eprintln!("erf on {}: at most {worst} ulps (at {at:e}), {count} inputs", isa.name());
            assert!(worst <= ERF_ULPS, "{}: {worst} ulps at {at:e}", isa.name());
        }
    }

    #[test]
    fn erf_gives_the_special_values_exactly_on_every_path() {
        for isa in Isa::available() {
            let mut v = vec![0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 10.0, -10.0, f32::MAX, f32::MIN];
            let want = [0.0, -0.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0];
            Erf(&mut v).run(isa);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&v), bits(&want), "{}", isa.name());
            let mut nan = vec![f32::NAN, -f32::NAN];
            Erf(&mut nan).run(isa);
            assert!(nan.iter().all(|v| v.is_nan()), "{}", isa.name());
        }
    }

    #[test]
    fn the_gelu_gate_is_candles_formula_within_the_erf_error_on_every_path() {
        // Every swept float as `a`, against a gate of both signs and magnitudes.
        let isas = Isa::available();
        sweep(&[SPLIT * std::f32::consts::SQRT_2, UPPER * std::f32::consts::SQRT_2, -5.0, 5.0], |a| {
            let g: Vec<f32> = (0..a.len()).map(|i| [1.0, -0.75, 3.5e-3, 2.0e3][i % 4]).collect();
            let mut want = vec![0f32; a.len()];
            GeluGate { y: &mut want, a, g: &g }.scalar();
            for isa in &isas {
                let mut got = vec![0f32; a.len()];
                gelu_gate_on(*isa, &mut got, a, &g);
                for i in 0..a.len() {
                    let (got, want) = (got[i], want[i]);
                    if want.is_nan() {
                        assert!(got.is_nan(), "{}: gelu({}) * {} = {got}, not NaN", isa.name(), a[i], g[i]);
                        continue;
                    }
                    // 0.5 |a g| times the erf's 2 ulps (an ulp of erf's value is at most 2^-24 below
                    // 1, and its own size below) and the ulp of 1 + erf, then 3 ulps of the result
                    // (two products rounded from different values).
                    let e = libm_erf(a[i] * FRAC_1_SQRT_2);
                    let erf_ulp = if e.abs() >= 0.5 {
                        f32::EPSILON / 2.0
                    } else {
                        (e.abs() * f32::EPSILON).max(f32::from_bits(1))
                    };
                    let sum_ulp = if e >= 0.0 { f32::EPSILON } else { f32::EPSILON / 2.0 };
                    let carried =
                        0.5 * (a[i] as f64 * g[i] as f64).abs() * (ERF_ULPS as f64 * erf_ulp as f64 + sum_ulp as f64);
                    let ulp = (f32::from_bits(want.abs().to_bits() + 1) - want.abs()) as f64;
                    let near = ulps(got, want) <= 3 || (got as f64 - want as f64).abs() <= carried + 3.0 * ulp;
                    assert!(near, "{}: gelu({:e}) * {} = {got:e}, candle {want:e}", isa.name(), a[i], g[i]);
                }
            }
        });
    }
}
