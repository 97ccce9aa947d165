//! RoPE's rotation of a block of query or key rows (transformers' `apply_rotary_pos_emb`: the
//! halves of a head, `x1 cos - x2 sin` and `x2 cos + x1 sin`), vectorised.
//!
//! Why: attention rotates each block's queries and keys itself (no rotated `[T, d]` copy is
//! kept), so the rotation runs again for every block that reads a key; as a scalar loop it was
//! 2.5% of a layer (BENCHMARKS.md, "Vectorised passes outside the products"). The products and
//! the sums are separate operations in the scalar loop's order (no fused multiply-add), so every
//! path gives **the scalar loop's floats exactly**.

use pulp::{Simd, WithSimd};

use super::{Isa, Pass};

/// Rotates `rows` rows of one head: row `r` of `out` (`hd` floats, `out` holding `rows * hd`)
/// from the `hd` floats of `x` at `r * stride`, with the `hd / 2` cos and sin at `r * (hd / 2)`,
/// on this process's instruction set. Rows that any input is too short for are left as they are.
pub fn rotate(out: &mut [f32], x: &[f32], stride: usize, cos: &[f32], sin: &[f32], hd: usize) {
    rotate_on(Isa::active(), out, x, stride, cos, sin, hd);
}

/// [`rotate`] on `isa`.
pub(super) fn rotate_on(isa: Isa, out: &mut [f32], x: &[f32], stride: usize, cos: &[f32], sin: &[f32], hd: usize) {
    let half = hd / 2;
    if half == 0 {
        return;
    }
    // The rows every input has.
    let rows = (out.len() / hd).min(cos.len() / half).min(sin.len() / half).min(if x.len() < hd {
        0
    } else {
        (x.len() - hd) / stride.max(1) + 1
    });
    Rotate { out: &mut out[..rows * hd], x, stride, cos, sin, half }.run(isa);
}

struct Rotate<'a> {
    out: &'a mut [f32],
    x: &'a [f32],
    stride: usize,
    cos: &'a [f32],
    sin: &'a [f32],
    half: usize,
}

impl Rotate<'_> {
    /// Row `r`'s input halves, cos and sin.
    fn inputs(&self, r: usize) -> (&[f32], &[f32], &[f32], &[f32]) {
        let half = self.half;
        let x = &self.x[r * self.stride..r * self.stride + 2 * half];
        let (x1, x2) = x.split_at(half);
        (x1, x2, &self.cos[r * half..(r + 1) * half], &self.sin[r * half..(r + 1) * half])
    }
}

impl Pass for Rotate<'_> {
    /// The loop attention ran before issue #43.
    fn scalar(mut self) {
        let half = self.half;
        let out = std::mem::take(&mut self.out);
        for (r, y) in out.chunks_exact_mut(2 * half).enumerate() {
            let (x1, x2, cos, sin) = self.inputs(r);
            let (y1, y2) = y.split_at_mut(half);
            for i in 0..half {
                y1[i] = x1[i] * cos[i] - x2[i] * sin[i];
                y2[i] = x2[i] * cos[i] + x1[i] * sin[i];
            }
        }
    }
}

impl WithSimd for Rotate<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(mut self, simd: S) {
        let half = self.half;
        let out = std::mem::take(&mut self.out);
        for (r, y) in out.chunks_exact_mut(2 * half).enumerate() {
            let (x1, x2, cos, sin) = self.inputs(r);
            let (y1, y2) = y.split_at_mut(half);
            let (y1, y1_tail) = S::as_mut_simd_f32s(y1);
            let (y2, y2_tail) = S::as_mut_simd_f32s(y2);
            let (a, a_tail) = S::as_simd_f32s(x1);
            let (b, b_tail) = S::as_simd_f32s(x2);
            let (c, c_tail) = S::as_simd_f32s(cos);
            let (s, s_tail) = S::as_simd_f32s(sin);
            for i in 0..y1.len() {
                y1[i] = simd.sub_f32s(simd.mul_f32s(a[i], c[i]), simd.mul_f32s(b[i], s[i]));
                y2[i] = simd.add_f32s(simd.mul_f32s(b[i], c[i]), simd.mul_f32s(a[i], s[i]));
            }
            for i in 0..y1_tail.len() {
                y1_tail[i] = a_tail[i] * c_tail[i] - b_tail[i] * s_tail[i];
                y2_tail[i] = b_tail[i] * c_tail[i] + a_tail[i] * s_tail[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761) | 1;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
            })
            .collect()
    }

    #[test]
    fn every_path_rotates_to_the_scalar_loops_floats_exactly() {
        // Head dims whose halves are below, at and past a vector's width; strides of a packed qkv.
        for (hd, stride, rows) in [(2, 2, 5), (6, 18, 3), (32, 96, 7), (64, 192, 65), (66, 200, 9), (128, 3 * 128, 4)] {
            let x = values(stride * rows, hd as u32);
            let (cos, sin) = (values(rows * hd / 2, 1), values(rows * hd / 2, 2));
            let mut want = vec![f32::NAN; rows * hd];
            Rotate { out: &mut want, x: &x, stride, cos: &cos, sin: &sin, half: hd / 2 }.scalar();
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; rows * hd];
                rotate_on(isa, &mut got, &x, stride, &cos, &sin, hd);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{} hd {hd}", isa.name());
            }
        }
    }

    #[test]
    fn rows_an_input_is_too_short_for_are_left_alone() {
        let (hd, stride) = (8, 24);
        let x = values(stride * 2 + hd, 3);
        let (cos, sin) = (values(4 * 4, 4), values(2 * 4, 5));
        let mut out = vec![7.0f32; 4 * hd];
        rotate(&mut out, &x, stride, &cos, &sin, hd);
        // sin has 2 rows: rows 2 and 3 keep their 7s.
        assert!(out[..2 * hd].iter().all(|&v| v != 7.0));
        assert!(out[2 * hd..].iter().all(|&v| v == 7.0));
        rotate(&mut out, &x, stride, &cos, &sin, 1);
    }
}
