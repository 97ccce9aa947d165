//! The int8 products of the opt-in quantised CPU mode (`[cpu] weights = "int8"`, issue #43):
//! weights quantised at load per output channel, activations per row at each call, the product
//! in int8 with i32 accumulation, then scaled back into the f32 output. The mode runs three of
//! an encoder layer's four dense products here (`Wo`, the feed-forward's `Wi` and `Wo`); `Wqkv`
//! stays f32 (`encoder::qkv_mode` says why, with the figures).
//!
//! What was measured and not kept (2026-12-05, fake-quantised products on the built-in probe,
//! BENCHMARKS.md "int8 and bf16 CPU modes"): asymmetric u8 activations per row, symmetric
//! scales per 8 or 16 activations, SmoothQuant-style channel scales (alpha 0.3, 0.5) and weight
//! scales per 16 or 32 inputs each left at least one fixture model flipping a probe row; only
//! f32 activations with weight scales per 16 inputs kept all four, which is no
//! longer an int8 product.
//!
//! Why a helper of our own and not candle's quantized matmul: candle's `QMatMul` (Q8_0: a scale
//! per block of 32 weights) multiplies one output row by one weight row at a time (a dot product
//! per element, no register blocking: read in its source, not measured here), so every weight
//! byte is read again for every token of a 100-500-token call. Here the loop nest is the f32
//! one's (`panels`):
//! weights packed once at load in panels of [`MR`] output channels, the tokens packed per call
//! in tiles of [`NR`], and a microkernel that keeps an `MR x NR` block of i32 sums in registers
//! over the whole depth:
//!
//! - AVX-512 VNNI (`vpdpbusd`: 64 u8 x s8 products into 16 i32 lanes a instruction): the tokens
//!   are stored offset by 128 (u8), and `128 * sum(w)` per channel is subtracted after;
//! - AVX2 (`vpmaddubsw` + `vpmaddwd`): `|x|` (u8) times `w` with `x`'s sign (`vpsignb`), so a
//!   pair of products is at most 2 x 128 x 127 = 32512 and the i16 sum never saturates;
//! - aarch64 with the dot-product extension (`sdot`, by element; through `asm!`, since Rust's
//!   `vdotq` intrinsics are not stable);
//! - a scalar path everywhere, which the others are tested against bit for bit (integer sums are
//!   exact: the tests run each path on random and extreme inputs, ±127 and -128).
//!
//! Quantisation: a channel's weights `w` become `round(w / s)` with `s = max|w| / 127` (so in
//! -127..=127); a row of activations likewise with its own scale. A sum is exact in i32 up to
//! [`MAX_DEPTH`] products (255 x 127 each, the VNNI offset's worst case).
//!
//! `LAYA_CPU_KERNELS` picks the set as it does the f32 kernels: `avx512f` the VNNI kernel
//! (where the CPU has VNNI, else AVX2), `fma` the AVX2 one, `neon` the `sdot` one, `scalar`.

use std::sync::{Arc, OnceLock};

use super::panels::each_block;

/// Output channels of a packed weight panel.
pub const MR: usize = 32;
/// Tokens of a packed tile.
pub const NR: usize = 8;
/// Tokens of one block: their packed bytes stay in L2 while every panel passes them.
const TOKEN_BLOCK: usize = 192;
const _: () = assert!(TOKEN_BLOCK.is_multiple_of(NR));

/// The deepest product whose i32 sums cannot overflow: 255 x 127 x 66_000 < 2^31.
pub const MAX_DEPTH: usize = 66_000;

/// One set of int8 microkernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum I8Kernel {
    /// AVX-512 VNNI (`vpdpbusd`), with AVX-512 BW.
    #[cfg(target_arch = "x86_64")]
    Vnni,
    /// AVX2 (`vpmaddubsw`, `vpmaddwd`, `vpsignb`).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// aarch64's dot-product extension (`sdot`).
    #[cfg(target_arch = "aarch64")]
    Sdot,
    /// Plain integer loops.
    Scalar,
}

impl I8Kernel {
    /// The name `--version` prints.
    pub fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            I8Kernel::Vnni => "avx512-vnni",
            #[cfg(target_arch = "x86_64")]
            I8Kernel::Avx2 => "avx2",
            #[cfg(target_arch = "aarch64")]
            I8Kernel::Sdot => "neon-sdot",
            I8Kernel::Scalar => "scalar",
        }
    }

    /// The `LAYA_CPU_KERNELS` name that selects this set.
    fn forced_by(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            I8Kernel::Vnni => "avx512f",
            #[cfg(target_arch = "x86_64")]
            I8Kernel::Avx2 => "fma",
            #[cfg(target_arch = "aarch64")]
            I8Kernel::Sdot => "neon",
            I8Kernel::Scalar => "scalar",
        }
    }

    /// Every set this CPU runs, widest first, the scalar one last.
    pub fn available() -> Vec<I8Kernel> {
        let mut sets = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
                sets.push(I8Kernel::Vnni);
            }
            if has!("avx2") {
                sets.push(I8Kernel::Avx2);
            }
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            sets.push(I8Kernel::Sdot);
        }
        sets.push(I8Kernel::Scalar);
        sets
    }

    /// The set of this process: the widest, or the next narrower one `LAYA_CPU_KERNELS` names
    /// (`avx512f` on a CPU without VNNI gives the AVX2 set). Chosen once.
    pub fn detect() -> I8Kernel {
        static DETECTED: OnceLock<I8Kernel> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            let sets = I8Kernel::available();
            let forced = super::vector::forced();
            let order = ["avx512f", "fma", "neon", "scalar"];
            let from = forced.as_deref().and_then(|f| order.iter().position(|o| *o == f)).unwrap_or(0);
            sets.iter()
                .copied()
                .find(|k| order.iter().position(|o| *o == k.forced_by()).is_some_and(|p| p >= from))
                .unwrap_or(I8Kernel::Scalar)
        })
    }

    /// Whether the tokens are stored offset by 128 (as u8) for this set.
    fn offset(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self == I8Kernel::Vnni {
            return true;
        }
        false
    }

    /// `acc[t][r] = sum_d x[t][d] w[r][d]` over a panel (`k4 * MR * 4` bytes at `w`) and a
    /// tile (`k4 * NR * 4` bytes at `x`), both packed by [`pack`].
    fn tile(self, w: &[i8], x: &[i8], k4: usize, acc: &mut [[i32; MR]; NR]) {
        assert!(w.len() >= k4 * MR * 4 && x.len() >= k4 * NR * 4);
        match self {
            // SAFETY: `available` found AVX-512 F, BW and VNNI on this CPU before offering the
            // set, and the kernel reads `k4 * MR * 4` bytes of `w` and `k4 * NR * 4` of `x`
            // (asserted above), writing only `acc`.
            #[cfg(target_arch = "x86_64")]
            I8Kernel::Vnni => unsafe { tile_vnni(w.as_ptr(), x.as_ptr(), k4, acc) },
            // SAFETY: as above, with AVX2 found by `available`.
            #[cfg(target_arch = "x86_64")]
            I8Kernel::Avx2 => unsafe { tile_avx2(w.as_ptr(), x.as_ptr(), k4, acc) },
            // SAFETY: as above, with the dot-product extension found by `available`.
            #[cfg(target_arch = "aarch64")]
            I8Kernel::Sdot => unsafe { tile_sdot(w.as_ptr(), x.as_ptr(), k4, acc) },
            I8Kernel::Scalar => tile_scalar(w, x, k4, acc),
        }
    }
}

fn tile_scalar(w: &[i8], x: &[i8], k4: usize, acc: &mut [[i32; MR]; NR]) {
    *acc = [[0; MR]; NR];
    for k in 0..k4 {
        let (wk, xk) = (&w[k * MR * 4..(k + 1) * MR * 4], &x[k * NR * 4..(k + 1) * NR * 4]);
        for (t, a) in acc.iter_mut().enumerate() {
            let xt = &xk[t * 4..t * 4 + 4];
            for (r, s) in a.iter_mut().enumerate() {
                let wr = &wk[r * 4..r * 4 + 4];
                *s += (0..4).map(|i| i32::from(xt[i]) * i32::from(wr[i])).sum::<i32>();
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_vnni(w: *const i8, x: *const i8, k4: usize, acc: &mut [[i32; MR]; NR]) {
    use std::arch::x86_64::*;
    let mut a = [[_mm512_setzero_si512(); 2]; NR];
    for k in 0..k4 {
        // SAFETY: panel k's 128 bytes and tile k's 32 are inside the caller's buffers.
        unsafe {
            let wk = w.add(k * MR * 4);
            let w0 = _mm512_loadu_si512(wk.cast());
            let w1 = _mm512_loadu_si512(wk.add(64).cast());
            let xk = x.add(k * NR * 4).cast::<i32>();
            for (t, at) in a.iter_mut().enumerate() {
                let b = _mm512_set1_epi32(xk.add(t).read_unaligned());
                at[0] = _mm512_dpbusd_epi32(at[0], b, w0);
                at[1] = _mm512_dpbusd_epi32(at[1], b, w1);
            }
        }
    }
    for (at, out) in a.iter().zip(acc.iter_mut()) {
        // SAFETY: `out` is 32 i32s: two stores of 16.
        unsafe {
            _mm512_storeu_si512(out.as_mut_ptr().cast(), at[0]);
            _mm512_storeu_si512(out.as_mut_ptr().add(16).cast(), at[1]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tile_avx2(w: *const i8, x: *const i8, k4: usize, acc: &mut [[i32; MR]; NR]) {
    use std::arch::x86_64::*;
    let ones = _mm256_set1_epi16(1);
    for pair in 0..NR / 2 {
        let mut a = [[_mm256_setzero_si256(); 4]; 2];
        for k in 0..k4 {
            // SAFETY: panel k's 128 bytes and tile k's 32 are inside the caller's buffers.
            unsafe {
                let wk = w.add(k * MR * 4);
                let wv = [0, 32, 64, 96].map(|o| _mm256_loadu_si256(wk.add(o).cast()));
                for (j, aj) in a.iter_mut().enumerate() {
                    let xb = _mm256_set1_epi32(x.add((k * NR + pair * 2 + j) * 4).cast::<i32>().read_unaligned());
                    let xa = _mm256_abs_epi8(xb);
                    for (v, av) in aj.iter_mut().enumerate() {
                        let p = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(wv[v], xb));
                        *av = _mm256_add_epi32(*av, _mm256_madd_epi16(p, ones));
                    }
                }
            }
        }
        for (j, aj) in a.iter().enumerate() {
            for (v, av) in aj.iter().enumerate() {
                // SAFETY: 8 i32s at column 8v of the tile's row, inside its 32.
                unsafe { _mm256_storeu_si256(acc[pair * 2 + j].as_mut_ptr().add(8 * v).cast(), *av) };
            }
        }
    }
}

/// `acc += w . x[lane]` (`sdot`, by element: each i32 lane of `acc` gains the dot product of its
/// 4 bytes of `w` with the 4 bytes of `x`'s 32-bit lane `LANE`).
#[cfg(target_arch = "aarch64")]
macro_rules! sdot_lane {
    ($acc:expr, $w:expr, $x:expr, $lane:literal) => {
        // SAFETY: a register-only instruction of the dot-product extension, which the enclosing
        // function's target features enable.
        unsafe {
            std::arch::asm!(
                concat!("sdot {acc:v}.4s, {w:v}.16b, {x:v}.4b[", $lane, "]"),
                acc = inout(vreg) $acc,
                w = in(vreg) $w,
                x = in(vreg_low16) $x,
                options(pure, nomem, nostack)
            )
        }
    };
}

#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon,dotprod")]
unsafe fn tile_sdot(w: *const i8, x: *const i8, k4: usize, acc: &mut [[i32; MR]; NR]) {
    use std::arch::aarch64::*;
    // Sub-tiles of 16 channels by 4 tokens: 16 accumulators, 4 weight and 1 token register.
    for half in 0..2 {
        for quad in 0..2 {
            let mut a = [[vdupq_n_s32(0); 4]; 4];
            for k in 0..k4 {
                // SAFETY: the half panel's 64 bytes and the quad's 16 are inside the caller's
                // buffers (panel k is 128 bytes, tile k 32).
                let (wv, xv) = unsafe {
                    let wk = w.add(k * MR * 4 + half * 64);
                    ([0, 16, 32, 48].map(|o| vld1q_s8(wk.add(o))), vld1q_s8(x.add(k * NR * 4 + quad * 16)))
                };
                for v in 0..4 {
                    sdot_lane!(a[0][v], wv[v], xv, "0");
                    sdot_lane!(a[1][v], wv[v], xv, "1");
                    sdot_lane!(a[2][v], wv[v], xv, "2");
                    sdot_lane!(a[3][v], wv[v], xv, "3");
                }
            }
            for (t, at) in a.iter().enumerate() {
                for (v, av) in at.iter().enumerate() {
                    // SAFETY: 4 i32s at column 16 half + 4 v of the token's row, inside its 32.
                    unsafe { vst1q_s32(acc[quad * 4 + t].as_mut_ptr().add(half * 16 + 4 * v), *av) };
                }
            }
        }
    }
}

/// `round(v / scale)` for the row's or channel's `scale` (`max|v| / 127`, or 0 for a row of
/// zeros): -127..=127, NaN as 0.
fn quantise(v: f32, inv: f32) -> i8 {
    let q = v * inv;
    (q + 0.5f32.copysign(q)).clamp(-127.0, 127.0) as i8
}

/// The scale of a row or channel and its inverse.
fn scale_of(row: &[f32]) -> (f32, f32) {
    let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    if max > 0.0 && max.is_finite() { (max / 127.0, 127.0 / max) } else { (0.0, 0.0) }
}

/// Packs `rows` quantised rows of `depth` (row-major `q`) in groups of `width`: group `g`,
/// then depth quad `k`, then the group's rows, then the quad's 4 bytes (zeros past the ends).
fn pack(q: &[i8], rows: usize, depth: usize, width: usize, offset: bool) -> Vec<i8> {
    let k4 = depth.div_ceil(4);
    let fill = if offset { i8::MIN } else { 0 };
    let mut out = vec![fill; rows.div_ceil(width) * k4 * width * 4];
    for r in 0..rows {
        let (g, i) = (r / width, r % width);
        let base = g * k4 * width * 4 + i * 4;
        for (d, &v) in q[r * depth..(r + 1) * depth].iter().enumerate() {
            let at = base + (d / 4) * width * 4 + d % 4;
            out[at] = if offset { v ^ i8::MIN } else { v };
        }
        if offset {
            // The padding quad's bytes are 0 before the offset.
            for d in depth..k4 * 4 {
                out[base + (d / 4) * width * 4 + d % 4] = i8::MIN;
            }
        }
    }
    out
}

/// A `[rows, depth]` weight matrix quantised per row (output channel) and packed for one int8
/// kernel set.
#[derive(Clone)]
pub struct QuantWeights {
    kernel: I8Kernel,
    data: Arc<Vec<i8>>,
    /// Each channel's scale, padded to whole panels.
    scales: Arc<Vec<f32>>,
    /// Each channel's `128 * sum(q)`, for the VNNI offset; padded.
    offsets: Arc<Vec<i32>>,
    rows: usize,
    depth: usize,
}

impl QuantWeights {
    /// Quantises and packs a row-major `[rows, depth]` matrix.
    pub fn quantise(kernel: I8Kernel, w: &[f32], rows: usize, depth: usize) -> Result<QuantWeights, String> {
        if w.len() != rows * depth {
            return Err(format!("int8: {} weights for {rows} x {depth}", w.len()));
        }
        if depth > MAX_DEPTH {
            return Err(format!("int8: a depth of {depth} is more than the {MAX_DEPTH} an i32 sum holds exactly"));
        }
        let panels = rows.div_ceil(MR);
        let mut scales = vec![0f32; panels * MR];
        let mut offsets = vec![0i32; panels * MR];
        let mut q = vec![0i8; rows * depth];
        for r in 0..rows {
            let row = &w[r * depth..(r + 1) * depth];
            let (scale, inv) = scale_of(row);
            scales[r] = scale;
            let qr = &mut q[r * depth..(r + 1) * depth];
            for (d, v) in qr.iter_mut().zip(row) {
                *d = quantise(*v, inv);
            }
            offsets[r] = 128 * qr.iter().map(|&v| i32::from(v)).sum::<i32>();
        }
        let data = pack(&q, rows, depth, MR, false);
        Ok(QuantWeights {
            kernel,
            data: Arc::new(data),
            scales: Arc::new(scales),
            offsets: Arc::new(offsets),
            rows,
            depth,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// `dst[r * ld + i] += sum_d W[i, d] x[r * depth + d]` for every token `r < n`, through
    /// int8: each token's row quantised with its own scale. Panels run on rayon's pool when
    /// `threads` > 1.
    pub fn multiply_add(&self, x: &[f32], n: usize, dst: &mut [f32], ld: usize, threads: usize) {
        let (depth, kernel) = (self.depth, self.kernel);
        assert!(x.len() >= n * depth && ld >= self.rows && dst.len() >= n.saturating_sub(1) * ld + self.rows);
        if n == 0 || self.rows == 0 {
            return;
        }
        let k4 = depth.div_ceil(4);
        let mut sx = vec![0f32; n];
        let mut q = vec![0i8; n * depth];
        for r in 0..n {
            let row = &x[r * depth..(r + 1) * depth];
            let (scale, inv) = scale_of(row);
            sx[r] = scale;
            q[r * depth..(r + 1) * depth].iter_mut().zip(row).for_each(|(d, v)| *d = quantise(*v, inv));
        }
        let offset = kernel.offset();
        let tokens = pack(&q, n, depth, NR, offset);
        drop(q);
        let tile = |p: usize, t: usize, acc: &mut [[i32; MR]; NR]| {
            let panel = &self.data[p * k4 * MR * 4..(p + 1) * k4 * MR * 4];
            kernel.tile(panel, &tokens[t * k4 * NR * 4..(t + 1) * k4 * NR * 4], k4, acc);
        };
        let finish = |token: usize, c: usize, s: i32| {
            let sum = if offset { s - self.offsets[c] } else { s };
            sum as f32 * (sx[token] * self.scales[c])
        };
        each_block(self.rows, n, dst, ld, threads, TOKEN_BLOCK, tile, finish);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn byte(&mut self) -> i8 {
            self.next() as i8
        }
    }

    /// Makes one (weight, activation) pair.
    type Pair = Box<dyn Fn(&mut Rng) -> (i8, i8)>;

    /// Packs integer operands and runs every tile of every panel on `kernel`: the exact sums.
    fn products(kernel: I8Kernel, w: &[i8], x: &[i8], rows: usize, n: usize, depth: usize) -> Vec<i64> {
        let k4 = depth.div_ceil(4);
        let pw = pack(w, rows, depth, MR, false);
        let px = pack(x, n, depth, NR, kernel.offset());
        // The VNNI offset's correction, as `quantise` makes it.
        let offsets: Vec<i64> =
            (0..rows).map(|r| 128 * w[r * depth..(r + 1) * depth].iter().map(|&v| i64::from(v)).sum::<i64>()).collect();
        let mut out = vec![0i64; n * rows];
        let mut acc = [[0i32; MR]; NR];
        for p in 0..rows.div_ceil(MR) {
            for t in 0..n.div_ceil(NR) {
                kernel.tile(&pw[p * k4 * MR * 4..], &px[t * k4 * NR * 4..], k4, &mut acc);
                for (j, a) in acc.iter().enumerate().take(NR.min(n - t * NR)) {
                    for (i, &s) in a.iter().enumerate().take(MR.min(rows - p * MR)) {
                        let (c, s) = (p * MR + i, i64::from(s));
                        out[(t * NR + j) * rows + c] = if kernel.offset() { s - offsets[c] } else { s };
                    }
                }
            }
        }
        out
    }

    fn exact(w: &[i8], x: &[i8], rows: usize, n: usize, depth: usize) -> Vec<i64> {
        let mut out = vec![0i64; n * rows];
        for t in 0..n {
            for r in 0..rows {
                out[t * rows + r] = (0..depth).map(|d| i64::from(x[t * depth + d]) * i64::from(w[r * depth + d])).sum();
            }
        }
        out
    }

    #[test]
    fn every_int8_kernel_gives_the_exact_integer_products_on_random_and_extreme_inputs() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        // Weights are in -127..=127 (symmetric quantisation); activations anywhere in i8,
        // -128 included. Sizes across panel, tile and quad edges; the deepest is the longest
        // product a layer of the fixtures has.
        for (rows, n, depth) in [(1, 1, 1), (33, 9, 7), (64, 16, 256), (70, 13, 1027), (32, 8, 5248)] {
            let cases: [(&str, Pair); 4] = [
                ("random", Box::new(|r: &mut Rng| (r.byte().max(-127), r.byte()))),
                ("+127 x +127", Box::new(|_: &mut Rng| (127, 127))),
                ("-127 x -128", Box::new(|_: &mut Rng| (-127, -128))),
                ("+127 x -128", Box::new(|_: &mut Rng| (127, -128))),
            ];
            for (what, make) in &cases {
                let (mut w, mut x) = (vec![0i8; rows * depth], vec![0i8; n * depth]);
                for v in w.iter_mut() {
                    *v = make(&mut rng).0;
                }
                for v in x.iter_mut() {
                    *v = make(&mut rng).1;
                }
                let want = exact(&w, &x, rows, n, depth);
                for kernel in I8Kernel::available() {
                    let got = products(kernel, &w, &x, rows, n, depth);
                    assert!(got == want, "{} on {what} {rows}x{depth} by {n}", kernel.name());
                }
            }
        }
    }

    #[test]
    fn every_int8_kernel_set_this_cpu_has_is_offered_and_the_widest_or_the_forced_one_is_chosen() {
        let names: Vec<&str> = I8Kernel::available().iter().map(|k| k.name()).collect();
        #[cfg(target_arch = "x86_64")]
        let want: Vec<&str> = [
            (
                "avx512-vnni",
                std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512bw"),
            ),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("scalar", true),
        ]
        .into_iter()
        .filter_map(|(n, has)| has.then_some(n))
        .collect();
        #[cfg(target_arch = "aarch64")]
        let want: Vec<&str> = if std::arch::is_aarch64_feature_detected!("dotprod") {
            vec!["neon-sdot", "scalar"]
        } else {
            vec!["scalar"]
        };
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let want = vec!["scalar"];
        assert_eq!(names, want);
        match super::super::vector::forced().as_deref() {
            None => assert_eq!(I8Kernel::detect().name(), want[0]),
            Some("scalar") => assert_eq!(I8Kernel::detect(), I8Kernel::Scalar),
            Some(_) => {}
        }
    }

    #[test]
    fn the_int8_product_is_the_float_product_within_its_quantisation_error_on_every_kernel() {
        let (rows, depth, n) = (70, 300, 21);
        let mut rng = Rng(7);
        let mut f = |scale: f32| ((rng.next() % 20_001) as f32 / 10_000.0 - 1.0) * scale;
        let w: Vec<f32> = (0..rows * depth).map(|_| f(0.05)).collect();
        let x: Vec<f32> = (0..n * depth).map(|_| f(2.0)).collect();
        let init: Vec<f32> = (0..n * rows).map(|i| i as f32 * 0.01).collect();
        for kernel in I8Kernel::available() {
            let q = QuantWeights::quantise(kernel, &w, rows, depth).unwrap();
            for threads in [1, 2] {
                let mut got = init.clone();
                q.multiply_add(&x, n, &mut got, rows, threads);
                for t in 0..n {
                    let xs = x[t * depth..(t + 1) * depth].iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                    for r in 0..rows {
                        let wr = &w[r * depth..(r + 1) * depth];
                        let ws = wr.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                        let xr = &x[t * depth..(t + 1) * depth];
                        let want: f64 = init[t * rows + r] as f64
                            + wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>();
                        // Each rounding moves a product by at most half a step of either operand.
                        let bound: f64 = wr
                            .iter()
                            .zip(xr)
                            .map(|(a, b)| {
                                (a.abs() as f64 * xs as f64 + b.abs() as f64 * ws as f64) / 2.0 + (xs * ws) as f64 / 4.0
                            })
                            .sum();
                        let err = (got[t * rows + r] as f64 - want).abs();
                        assert!(err <= bound * 1.01 + 1e-5, "{}: {err} > {bound}", kernel.name());
                    }
                }
            }
        }
        // Only its columns of a wider output, and a zero row stays zero.
        let q = QuantWeights::quantise(I8Kernel::detect(), &w, rows, depth).unwrap();
        let mut dst = vec![3.0f32; 2 * (rows + 5)];
        let mut two = x[..2 * depth].to_vec();
        two[..depth].fill(0.0);
        q.multiply_add(&two, 2, &mut dst, rows + 5, 1);
        assert!(dst[..rows + 5].iter().all(|&v| v == 3.0), "a zero row adds nothing");
        assert!(dst[2 * rows + 5..].iter().all(|&v| v == 3.0), "the other columns are untouched");
        assert!(QuantWeights::quantise(I8Kernel::Scalar, &w, rows, depth + 1).is_err());
    }
}
