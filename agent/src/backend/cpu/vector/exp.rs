//! `exp` on SIMD lanes, and attention's softmax over a row with it (the max, then `exp(s - max)`
//! and its sum in one pass, then the scaling), instead of libm's `expf` once per score.
//!
//! The method is Cephes' `expf`: `n = round(x log2 e)`, `r = x - n ln 2` in two parts
//! (Cody-Waite), a degree-7 polynomial for `e^r` on `|r| <= ln 2 / 2`, times `2^n`. The power of two
//! is applied as two factors, so that a result below the smallest normal float is rounded once
//! (gradual underflow as libm gives it) and one above the largest is infinity.
//! **Maximum error: 2 ulps** against libm's `expf` over every float (NaN gives NaN, -inf 0, +inf
//! +inf; measured 1 ulp on AVX-512 and AVX2 over all 2^32 bit patterns:
//! `LAYA_SWEEP_STEP=1 cargo test --profile bench -p laya-edge --lib exp_is_within`, 5 minutes with
//! erf's; a dev build's test sweeps every 2^8th pattern and the special points' neighbourhoods).
//!
//! Softmax: each probability within a **relative 2^-20** of the exact softmax of the same scores
//! (computed in f64) for rows of up to 4096 scores (measured 5.2e-7 at most), where the scalar loop
//! it replaces (libm's `expf`, a sequential sum, a division per score; still the scalar path) is
//! within 2^-16 (4.9e-6 measured, its sum's error at 4096 scores): the sum is taken in as many
//! partial sums as a vector has lanes, and each score is multiplied by the sum's reciprocal. A masked score (laya's `f32::MIN` bias) gives exactly 0, as in the scalar loop.

use std::f32::consts::LOG2_E;

use pulp::{Simd, WithSimd};

use super::{Isa, Pass};

/// `ln 2` in two parts: `n * LN2_HI` is exact for the `n` that occur (LN2_HI is 0.693359375, 355/512;
/// these literals are the shortest that give Cephes' floats, as are the polynomial's).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes' `expf` polynomial: `e^r ~ 1 + r + r^2 (P0 r^5 + ... + P5)`.
const POLY: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_6e-1, 5e-1];
/// 1.5 * 2^23: added to `x log2 e`, it leaves `round(x log2 e)` in the low bits of the sum.
const SHIFTER: f32 = 12_582_912.0;
/// Below it the result is 0 (`e^-104` is under half the smallest subnormal), above the other
/// infinity; clamping there keeps `n` in `[-150, 129]`, where the two factors below are normal.
const LOWEST: f32 = -104.0;
const HIGHEST: f32 = 89.0;

/// `e^x` in every lane.
#[inline(always)]
pub(super) fn exp<S: Simd>(simd: S, x: S::f32s) -> S::f32s {
    let splat = |v: f32| simd.splat_f32s(v);
    let xc = simd.min_f32s(simd.max_f32s(x, splat(LOWEST)), splat(HIGHEST));
    let z = simd.mul_add_e_f32s(xc, splat(LOG2_E), splat(SHIFTER));
    let n = simd.sub_f32s(z, splat(SHIFTER));
    let r = simd.mul_add_e_f32s(n, splat(-LN2_HI), xc);
    let r = simd.mul_add_e_f32s(n, splat(-LN2_LO), r);
    let mut p = splat(POLY[0]);
    for c in &POLY[1..] {
        p = simd.mul_add_e_f32s(p, r, splat(*c));
    }
    let p = simd.add_f32s(simd.mul_add_e_f32s(p, simd.mul_f32s(r, r), r), splat(1.0));
    // 2^n as 2^a * 2^(n - a): a = -123 for n <= 0, 64 above, so `p * 2^(n - a)` is a normal
    // float (exact) and only the last product rounds. The low bits of z hold n: shifted into the
    // exponent field and biased by 127 - a.
    let e = simd.wrapping_dyn_shl_u32s(simd.transmute_u32s_f32s(z), simd.splat_u32s(23));
    let low = simd.less_than_or_equal_f32s(n, splat(0.0));
    let pick = |if_low: u32, if_high: u32| simd.select_u32s(low, simd.splat_u32s(if_low), simd.splat_u32s(if_high));
    let scale_a = simd.transmute_f32s_u32s(pick(4 << 23, 191 << 23));
    let scale_rest = simd.transmute_f32s_u32s(simd.add_u32s(e, pick(250 << 23, 63 << 23)));
    let y = simd.mul_f32s(simd.mul_f32s(p, scale_rest), scale_a);
    // NaN stays NaN (the clamps above may have replaced it).
    simd.select_f32s(simd.equal_f32s(x, x), y, x)
}

/// Softmax of one row in place, on this process's instruction set.
pub fn softmax(row: &mut [f32]) {
    softmax_on(Isa::active(), row);
}

/// [`softmax`] on `isa`.
pub(super) fn softmax_on(isa: Isa, row: &mut [f32]) {
    Softmax(row).run(isa);
}

struct Softmax<'a>(&'a mut [f32]);

impl Pass for Softmax<'_> {
    /// The loop this replaces (attention's before issue #43).
    fn scalar(self) {
        let s = self.0;
        let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for v in s.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        s.iter_mut().for_each(|v| *v /= sum);
    }
}

impl WithSimd for Softmax<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let row = self.0;
        let (head, tail) = S::as_simd_f32s(row);
        let mut lanes = simd.splat_f32s(f32::NEG_INFINITY);
        for v in head {
            lanes = simd.max_f32s(lanes, *v);
        }
        let max = tail.iter().copied().fold(simd.reduce_max_f32s(lanes), f32::max);
        let max_v = simd.splat_f32s(max);
        let (head, tail) = S::as_mut_simd_f32s(row);
        let mut sums = simd.splat_f32s(0.0);
        for v in head.iter_mut() {
            *v = exp(simd, simd.sub_f32s(*v, max_v));
            sums = simd.add_f32s(sums, *v);
        }
        let mut sum = simd.reduce_sum_f32s(sums);
        if !tail.is_empty() {
            let e = exp(simd, simd.sub_f32s(simd.partial_load_f32s(tail), max_v));
            simd.partial_store_f32s(tail, e);
            sum += tail.iter().sum::<f32>();
        }
        let inv = simd.splat_f32s(1.0 / sum);
        let (head, tail) = S::as_mut_simd_f32s(row);
        for v in head.iter_mut() {
            *v = simd.mul_f32s(*v, inv);
        }
        let inv = 1.0 / sum;
        tail.iter_mut().for_each(|v| *v *= inv);
    }
}

#[cfg(test)]
mod tests {
    use super::super::accuracy::{sweep, ulps};
    use super::*;

    /// `exp` over a slice on `isa` (the scalar path: libm).
    struct Exp<'a>(&'a mut [f32]);

    impl Pass for Exp<'_> {
        fn scalar(self) {
            self.0.iter_mut().for_each(|v| *v = v.exp());
        }
    }

    impl WithSimd for Exp<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) {
            let (head, tail) = S::as_mut_simd_f32s(self.0);
            for v in head.iter_mut() {
                *v = exp(simd, *v);
            }
            let e = exp(simd, simd.partial_load_f32s(tail));
            simd.partial_store_f32s(tail, e);
        }
    }

    /// The documented maximum error, in ulps.
    const EXP_ULPS: u32 = 2;

    #[test]
    fn exp_is_within_its_documented_ulps_of_libm_on_every_path() {
        // The overflow threshold (ln of the largest float), where the results turn subnormal
        // (ln of the smallest normal) and where they reach 0 (ln of half the smallest subnormal).
        let isas = Isa::available();
        let mut worst = vec![(0u32, 0f32); isas.len()];
        let count = sweep(&[88.722_84, -87.336_54, -103.972_08, -103.278_93, 1e-7, 0.346_573_6], |x| {
            let want: Vec<f32> = x.iter().map(|v| v.exp()).collect();
            for (isa, worst) in isas.iter().zip(worst.iter_mut()) {
                let mut got = x.to_vec();
                Exp(&mut got).run(*isa);
                for ((g, w), x) in got.iter().zip(&want).zip(x) {
                    if ulps(*g, *w) > worst.0 {
                        *worst = (ulps(*g, *w), *x);
                    }
                }
            }
        });
        for (isa, (worst, at)) in isas.iter().zip(worst) {
            eprintln!("exp on {}: at most {worst} ulps (at {at:e}), {count} inputs", isa.name());
            assert!(worst <= EXP_ULPS, "{}: {worst} ulps at {at:e}", isa.name());
        }
    }

    #[test]
    fn exp_gives_libms_special_values_exactly_on_every_path() {
        for isa in Isa::available() {
            let mut v = vec![0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, -200.0, 200.0, f32::MIN, f32::MAX, -104.0];
            let want = [1.0, 1.0, f32::INFINITY, 0.0, 0.0, f32::INFINITY, 0.0, f32::INFINITY, 0.0];
            let mut nan = vec![f32::NAN, -f32::NAN];
            Exp(&mut v).run(isa);
            Exp(&mut nan).run(isa);
            assert_eq!(v, want, "{}", isa.name());
            assert!(nan.iter().all(|v| v.is_nan()), "{}", isa.name());
        }
    }

    /// Rows as attention makes them: scores of a few units, some masked with laya's bias.
    fn row(n: usize, seed: u32, masked_every: usize) -> Vec<f32> {
        let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|i| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let s = (state >> 8) as f32 / (1u32 << 24) as f32 * 16.0 - 8.0;
                if masked_every > 0 && i % masked_every == 1 { s + super::super::super::masks::MASKED } else { s }
            })
            .collect()
    }

    /// The documented bound of a probability's relative error: the vector paths, and the scalar
    /// loop (its sequential sum).
    fn softmax_bound(isa: Isa) -> f64 {
        if isa.name() == "scalar" { 1.0 / (1u64 << 16) as f64 } else { 1.0 / (1u64 << 20) as f64 }
    }

    /// The softmax of the same scores in f64.
    fn exact(x: &[f32]) -> Vec<f64> {
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let e: Vec<f64> = x.iter().map(|&v| (v as f64 - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        e.iter().map(|v| v / sum).collect()
    }

    #[test]
    fn softmax_is_within_its_documented_error_of_the_exact_one_and_masked_scores_are_exactly_zero() {
        for isa in Isa::available() {
            let mut worst = 0f64;
            for n in [1, 2, 7, 8, 15, 16, 17, 64, 100, 128, 191, 512, 4096] {
                for (seed, masked) in [(1, 0), (2, 3), (3, 2), (5, 0), (6, 0)] {
                    let x = row(n, seed, masked);
                    let want = exact(&x);
                    let mut got = x.clone();
                    softmax_on(isa, &mut got);
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        let relative = (*g as f64 - w).abs() / w.max(f32::MIN_POSITIVE as f64);
                        worst = worst.max(relative);
                        assert!(
                            relative <= softmax_bound(isa),
                            "{} n={n} seed {seed}: {g} against {w} at {i}",
                            isa.name()
                        );
                        if x[i] < -1e30 {
                            assert_eq!(g.to_bits(), 0, "{} a masked score", isa.name());
                        }
                    }
                }
            }
            eprintln!("softmax on {}: at most {worst:e} relative", isa.name());
        }
    }

    #[test]
    fn softmax_of_a_row_with_nan_or_infinity_is_nan_as_in_the_scalar_loop() {
        for isa in Isa::available() {
            for bad in [f32::NAN, f32::INFINITY] {
                for n in [3, 17] {
                    let mut x = row(n, 4, 0);
                    x[n / 2] = bad;
                    let mut want = x.clone();
                    Softmax(&mut want).scalar();
                    softmax_on(isa, &mut x);
                    assert!(want.iter().all(|v| v.is_nan()), "the scalar loop");
                    assert!(x.iter().all(|v| v.is_nan()), "{} with {bad}: {x:?}", isa.name());
                }
            }
            // An empty row stays empty; a row of one is 1.
            softmax_on(isa, &mut []);
            let mut one = [-3.5f32];
            softmax_on(isa, &mut one);
            assert_eq!(one, [1.0]);
        }
    }
}
