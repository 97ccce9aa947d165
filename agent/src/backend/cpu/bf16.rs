//! The bf16 products of the opt-in `[cpu] weights = "bf16"` mode (issue #43): weights rounded to
//! bf16 at load, each call's tokens rounded to bf16, the products summed in f32 by AVX-512 BF16's
//! `vdpbf16ps` (two bf16 products into each of 16 f32 lanes an instruction).
//!
//! Only where the CPU has it: `Bf16Kernel::detect` refuses a CPU without AVX-512 BF16 (or a
//! process told `LAYA_CPU_KERNELS` other than `avx512f`), and the mode is refused at start with
//! that message rather than run on a slow emulation. The scalar path (f32 sums of the widened
//! bf16 values) is the reference the tests hold the vector one to.
//!
//! Layout as `int8`'s, by pairs: a weight panel is [`MR`] channels, each depth pair of a channel
//! two adjacent bf16s; a token tile [`NR`] tokens likewise. Error against the f32 product: each
//! operand is rounded to 8 significant bits (relative error at most 2^-9), so a product is within
//! about 2^-8 of its f32 value and a sum within `2^-8 sum|w x|` (plus f32's own rounding); the
//! tests hold every path to that bound.

use std::sync::Arc;

use super::panels::each_block;

/// Output channels of a packed weight panel.
pub const MR: usize = 32;
/// Tokens of a packed tile.
pub const NR: usize = 8;
const TOKEN_BLOCK: usize = 192;

/// One set of bf16 microkernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bf16Kernel {
    /// AVX-512 BF16 (`vdpbf16ps`).
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// f32 sums of the widened values: the tests' reference, never chosen to serve.
    Scalar,
}

impl Bf16Kernel {
    /// The name `--version` prints.
    pub fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Bf16Kernel::Avx512 => "avx512-bf16",
            Bf16Kernel::Scalar => "scalar",
        }
    }

    /// Every set this CPU runs (the scalar one last).
    pub fn available() -> Vec<Bf16Kernel> {
        let mut sets = Vec::new();
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bf16") {
            sets.push(Bf16Kernel::Avx512);
        }
        sets.push(Bf16Kernel::Scalar);
        sets
    }

    /// The set `[cpu] weights = "bf16"` runs on, or why this CPU (or this process's
    /// `LAYA_CPU_KERNELS`) cannot run the mode.
    pub fn detect() -> Result<Bf16Kernel, String> {
        let forced = super::vector::forced();
        match Bf16Kernel::available().first() {
            Some(&k) if k != Bf16Kernel::Scalar && forced.as_deref().is_none_or(|f| f == "avx512f") => Ok(k),
            Some(&k) if k != Bf16Kernel::Scalar => Err(format!(
                "[cpu] weights = \"bf16\" runs on AVX-512 BF16 only, and {} = {:?} forbids it",
                super::vector::FORCE_VAR,
                forced.unwrap_or_default()
            )),
            _ => Err("[cpu] weights = \"bf16\" needs a CPU with bf16 dot products (AVX-512 BF16), which this one does not have: use \"f32\" or \"int8\"".into()),
        }
    }

    fn tile(self, w: &[u16], x: &[u16], k2: usize, acc: &mut [[f32; MR]; NR]) {
        assert!(w.len() >= k2 * MR * 2 && x.len() >= k2 * NR * 2);
        match self {
            // SAFETY: `available` found AVX-512 F and BF16 before offering the set; the kernel
            // reads `k2 * MR * 2` values of `w` and `k2 * NR * 2` of `x` (asserted above) and
            // writes only `acc`.
            #[cfg(target_arch = "x86_64")]
            Bf16Kernel::Avx512 => unsafe { tile_avx512(w.as_ptr(), x.as_ptr(), k2, acc) },
            Bf16Kernel::Scalar => tile_scalar(w, x, k2, acc),
        }
    }
}

/// A bf16 value as the f32 it stands for.
fn widen(v: u16) -> f32 {
    f32::from_bits(u32::from(v) << 16)
}

/// An f32 rounded to the nearest bf16 (ties to even; a NaN stays a NaN).
fn narrow(v: f32) -> u16 {
    let bits = v.to_bits();
    if v.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

fn tile_scalar(w: &[u16], x: &[u16], k2: usize, acc: &mut [[f32; MR]; NR]) {
    *acc = [[0.0; MR]; NR];
    for k in 0..k2 {
        for (t, a) in acc.iter_mut().enumerate() {
            let (x0, x1) = (widen(x[(k * NR + t) * 2]), widen(x[(k * NR + t) * 2 + 1]));
            for (r, s) in a.iter_mut().enumerate() {
                let (w0, w1) = (widen(w[(k * MR + r) * 2]), widen(w[(k * MR + r) * 2 + 1]));
                *s += x0 * w0 + x1 * w1;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile_avx512(w: *const u16, x: *const u16, k2: usize, acc: &mut [[f32; MR]; NR]) {
    use std::arch::x86_64::*;
    let mut a = [[_mm512_setzero_ps(); 2]; NR];
    for k in 0..k2 {
        // SAFETY: panel k's 64 values and tile k's 16 are inside the caller's buffers; a vector
        // of 32 bf16s is a vector of 16 i32s, bit for bit.
        unsafe {
            let wk = w.add(k * MR * 2);
            let w0: __m512bh = std::mem::transmute(_mm512_loadu_si512(wk.cast()));
            let w1: __m512bh = std::mem::transmute(_mm512_loadu_si512(wk.add(32).cast()));
            let xk = x.add(k * NR * 2).cast::<i32>();
            for (t, at) in a.iter_mut().enumerate() {
                let b: __m512bh = std::mem::transmute(_mm512_set1_epi32(xk.add(t).read_unaligned()));
                at[0] = _mm512_dpbf16_ps(at[0], b, w0);
                at[1] = _mm512_dpbf16_ps(at[1], b, w1);
            }
        }
    }
    for (at, out) in a.iter().zip(acc.iter_mut()) {
        // SAFETY: `out` is 32 f32s: two stores of 16.
        unsafe {
            _mm512_storeu_ps(out.as_mut_ptr(), at[0]);
            _mm512_storeu_ps(out.as_mut_ptr().add(16), at[1]);
        }
    }
}

/// Rounds `rows` rows of `depth` f32s (row-major) to bf16 and packs them in groups of `width`:
/// group, depth pair, the group's rows, the pair's 2 values (zeros past the ends).
fn pack(v: &[f32], rows: usize, depth: usize, width: usize) -> Vec<u16> {
    let k2 = depth.div_ceil(2);
    let mut out = vec![0u16; rows.div_ceil(width) * k2 * width * 2];
    for r in 0..rows {
        let base = (r / width) * k2 * width * 2 + (r % width) * 2;
        for (d, &x) in v[r * depth..(r + 1) * depth].iter().enumerate() {
            out[base + (d / 2) * width * 2 + d % 2] = narrow(x);
        }
    }
    out
}

/// A `[rows, depth]` weight matrix in bf16, packed for one kernel set.
#[derive(Clone)]
pub struct Bf16Weights {
    kernel: Bf16Kernel,
    data: Arc<Vec<u16>>,
    rows: usize,
    depth: usize,
}

impl Bf16Weights {
    /// Rounds and packs a row-major `[rows, depth]` matrix.
    pub fn convert(kernel: Bf16Kernel, w: &[f32], rows: usize, depth: usize) -> Result<Bf16Weights, String> {
        if w.len() != rows * depth {
            return Err(format!("bf16: {} weights for {rows} x {depth}", w.len()));
        }
        Ok(Bf16Weights { kernel, data: Arc::new(pack(w, rows, depth, MR)), rows, depth })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// `dst[r * ld + i] += sum_d W[i, d] x[r * depth + d]` for every token `r < n`, the tokens
    /// rounded to bf16. Panels run on rayon's pool when `threads` > 1.
    pub fn multiply_add(&self, x: &[f32], n: usize, dst: &mut [f32], ld: usize, threads: usize) {
        let (depth, kernel) = (self.depth, self.kernel);
        assert!(x.len() >= n * depth && ld >= self.rows && dst.len() >= n.saturating_sub(1) * ld + self.rows);
        if n == 0 || self.rows == 0 {
            return;
        }
        let k2 = depth.div_ceil(2);
        let tokens = pack(x, n, depth, NR);
        let tile = |p: usize, t: usize, acc: &mut [[f32; MR]; NR]| {
            let panel = &self.data[p * k2 * MR * 2..(p + 1) * k2 * MR * 2];
            kernel.tile(panel, &tokens[t * k2 * NR * 2..(t + 1) * k2 * NR * 2], k2, acc);
        };
        each_block(self.rows, n, dst, ld, threads, TOKEN_BLOCK, tile, |_, _, s| s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_is_to_nearest_even_and_keeps_nan() {
        assert_eq!(narrow(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to even (1).
        assert_eq!(narrow(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(narrow(1.0 + 3.0 / 256.0), 0x3f82);
        assert!(widen(narrow(f32::NAN)).is_nan());
        assert_eq!(widen(narrow(-2.5)), -2.5);
    }

    #[test]
    fn every_bf16_kernel_is_the_f32_product_within_the_documented_bound() {
        let (rows, depth, n) = (70, 1027, 13);
        let mut seed = 11u64;
        let mut f = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % 20_001) as f32 / 10_000.0 - 1.0
        };
        let w: Vec<f32> = (0..rows * depth).map(|_| f() * 0.05).collect();
        let x: Vec<f32> = (0..n * depth).map(|_| f() * 3.0).collect();
        let mut worst = 0f64;
        for kernel in Bf16Kernel::available() {
            let q = Bf16Weights::convert(kernel, &w, rows, depth).unwrap();
            for threads in [1, 2] {
                let mut got = vec![0.5f32; n * rows];
                q.multiply_add(&x, n, &mut got, rows, threads);
                for t in 0..n {
                    for r in 0..rows {
                        let (wr, xr) = (&w[r * depth..(r + 1) * depth], &x[t * depth..(t + 1) * depth]);
                        let want = 0.5 + wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>();
                        let mass: f64 = wr.iter().zip(xr).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                        let err = (got[t * rows + r] as f64 - want).abs();
                        worst = worst.max(err / mass);
                        assert!(err <= mass / 256.0 + 1e-5, "{}: {err} for a mass of {mass}", kernel.name());
                    }
                }
            }
        }
        assert!(worst > 0.0, "bf16 rounds somewhere");
    }

    #[test]
    fn the_mode_runs_only_where_the_cpu_has_bf16() {
        let has = Bf16Kernel::available()[0] != Bf16Kernel::Scalar;
        match (Bf16Kernel::detect(), super::super::vector::forced()) {
            (Ok(k), _) => assert!(has && k != Bf16Kernel::Scalar),
            (Err(why), None) => assert!(!has && why.contains("AVX-512 BF16"), "{why}"),
            (Err(why), Some(_)) => assert!(why.contains("bf16"), "{why}"),
        }
    }
}
