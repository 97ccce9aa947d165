//! The linear layers' product `W x^T`, with the weights packed once, at load, into the panel
//! layout the `gemm` crate's microkernels read, and only the tokens packed per call.
//!
//! Why not a plain `gemm::gemm` call (what [`super::dense`] made before): `gemm` packs both
//! operands on every call, and the weights are the large one: for a call of ~100-300 tokens,
//! packing a 5248 x 1024 feed-forward weight again was 23% of the whole CPU model's time
//! (`perf`, BENCHMARKS.md). Here the loop nest around the microkernels is ours (the usual
//! blocked one: depth blocks of [`DEPTH_BLOCK`], token blocks of [`TOKEN_BLOCK`]), and each
//! microkernel call is `gemm`'s own (`gemm_f32::microkernel`: the float arithmetic stays in the
//! maintained library); row blocks of [`ROW_BLOCK`] keep the output's share of a block in L2
//! across the depth blocks. The kernel set is picked at run time as `gemm` picks it: AVX-512
//! kernels on an x86-64 with AVX-512F, FMA (AVX2-width) kernels on one with FMA, NEON kernels on
//! aarch64, the portable scalar ones elsewhere.
//!
//! Layout of the packed weights: the depth is cut in blocks of [`DEPTH_BLOCK`]; within a block,
//! the rows are cut in panels of `mr` (the microkernel's register-block height, zero-padded at
//! the end), each panel stored depth-major (`mr` floats of one depth, then the next), panels one
//! after the other. The tokens are packed the same way per call, in tiles of `nr` tokens, each
//! tile depth-major with its `nr` tokens contiguous. A product then reads both operands as
//! contiguous streams, the weights' panel of a depth block from L1 and the tokens' block from L2.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use gemm_common::microkernel::MicroKernelFn;
use rayon::prelude::*;

/// Depth (input features) of one block: a weight panel of one block is `mr x 256` floats
/// (16 KiB at `mr` = 16), which stays in L1 while every token tile of the block passes it.
pub const DEPTH_BLOCK: usize = 256;

/// Tokens of one block: the packed tokens of one depth block (`192 x 256` floats, 192 KiB) stay
/// in L2 while every weight panel passes them. A multiple of every kernel set's tile width.
pub const TOKEN_BLOCK: usize = 192;

/// Output features (weight rows) of one block: the block's share of the output, `128 x 192`
/// floats (96 KiB), stays in L2 while every depth block adds to it, instead of the whole output
/// being read and written again from memory once per depth block.
pub const ROW_BLOCK: usize = 128;

/// One set of `gemm`'s f32 microkernels: the tallest register block of its architecture, at
/// every tile width.
#[derive(Clone, Copy)]
pub struct Kernel {
    /// The set's name, for reports (`avx512f`, `fma`, `neon`, `scalar`).
    pub name: &'static str,
    /// Rows of a weight panel: the kernel's register-block height.
    mr: usize,
    /// `by_width[w - 1]` multiplies a panel by a tile of `w` tokens (`1..=nr`).
    by_width: &'static [MicroKernelFn<f32>],
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use gemm_f32::microkernel::avx512f::f32 as k;
    /// The tallest AVX-512 kernels (4 vectors of 16 floats), by tile width.
    pub static TALLEST: [super::MicroKernelFn<f32>; k::NR] = k::UKR[k::MR_DIV_N - 1];
    /// Floats in one AVX-512 register.
    pub const MR: usize = k::MR_DIV_N * 16;
    const _: () = assert!(super::TOKEN_BLOCK.is_multiple_of(k::NR));
}

#[cfg(target_arch = "x86_64")]
mod fma {
    use gemm_f32::microkernel::fma::f32 as k;
    /// The tallest FMA kernels (2 vectors of 8 floats), by tile width.
    pub static TALLEST: [super::MicroKernelFn<f32>; k::NR] = k::UKR[k::MR_DIV_N - 1];
    /// Floats in one AVX register.
    pub const MR: usize = k::MR_DIV_N * 8;
    const _: () = assert!(super::TOKEN_BLOCK.is_multiple_of(k::NR));
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use gemm_f32::microkernel::neon::f32 as k;
    /// The tallest NEON kernels (4 vectors of 4 floats), by tile width.
    pub static TALLEST: [super::MicroKernelFn<f32>; k::NR] = k::UKR[k::MR_DIV_N - 1];
    /// Floats in one NEON register.
    pub const MR: usize = k::MR_DIV_N * 4;
    const _: () = assert!(super::TOKEN_BLOCK.is_multiple_of(k::NR));
}

mod scalar {
    use gemm_f32::microkernel::scalar::f32 as k;
    /// The tallest scalar kernels, by tile width.
    pub static TALLEST: [super::MicroKernelFn<f32>; k::NR] = k::UKR[k::MR_DIV_N - 1];
    pub const MR: usize = k::MR_DIV_N;
    const _: () = assert!(super::TOKEN_BLOCK.is_multiple_of(k::NR));
}

impl Kernel {
    /// The widest kernel set this CPU runs, chosen once per process (as `gemm` chooses), or the
    /// one `LAYA_CPU_KERNELS` names where this CPU runs it (`vector`'s module doc).
    pub fn detect() -> Kernel {
        static DETECTED: OnceLock<Kernel> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            let sets = Kernel::available();
            let forced = super::vector::forced();
            let pick = sets.iter().find(|k| forced.as_deref() == Some(k.name)).or(sets.first());
            pick.copied().unwrap_or_else(Kernel::scalar)
        })
    }

    /// Every kernel set this CPU can run, widest first (the tests hold each to the same results).
    pub fn available() -> Vec<Kernel> {
        let mut sets = Vec::new();
        // gemm's AVX-512 kernels ask for AVX-512F alone (`gemm_common`'s dispatch does the same).
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            sets.push(Kernel { name: "avx512f", mr: avx512::MR, by_width: &avx512::TALLEST });
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("fma") {
            sets.push(Kernel { name: "fma", mr: fma::MR, by_width: &fma::TALLEST });
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            sets.push(Kernel { name: "neon", mr: neon::MR, by_width: &neon::TALLEST });
        }
        sets.push(Kernel::scalar());
        sets
    }

    fn scalar() -> Kernel {
        Kernel { name: "scalar", mr: scalar::MR, by_width: &scalar::TALLEST }
    }

    /// Tokens of one tile.
    fn nr(&self) -> usize {
        self.by_width.len()
    }
}

/// The depth range of block `kb` of a `depth`-deep operand.
fn depth_block(kb: usize, depth: usize) -> Range<usize> {
    kb * DEPTH_BLOCK..((kb + 1) * DEPTH_BLOCK).min(depth)
}

/// A `[rows, depth]` weight matrix packed for one kernel set (see the module doc), or some of
/// its rows: views share the packed floats.
#[derive(Clone)]
pub struct PackedWeights {
    kernel: Kernel,
    data: Arc<Vec<f32>>,
    /// Panels per depth block in `data` (of the whole packed matrix, not of this view).
    stride_panels: usize,
    /// This view's first panel.
    first_panel: usize,
    rows: usize,
    depth: usize,
}

impl PackedWeights {
    /// Packs a row-major `[rows, depth]` matrix for `kernel`.
    pub fn pack(kernel: Kernel, weights: &[f32], rows: usize, depth: usize) -> PackedWeights {
        debug_assert_eq!(weights.len(), rows * depth);
        let data = pack_panels(kernel.mr, weights, rows, depth);
        PackedWeights {
            kernel,
            data: Arc::new(data),
            stride_panels: rows.div_ceil(kernel.mr),
            first_panel: 0,
            rows,
            depth,
        }
    }

    /// Rows of the matrix.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Element `(row, d)` of this view.
    fn element(&self, row: usize, d: usize) -> f32 {
        let (mr, kb) = (self.kernel.mr, d / DEPTH_BLOCK);
        self.data[self.panel_start(kb, row / mr) + (d - kb * DEPTH_BLOCK) * mr + row % mr]
    }

    /// Rows `range` of this view: shared where the range starts on a panel, packed anew
    /// otherwise. `None` when the range is not inside the view.
    pub fn select(&self, range: Range<usize>) -> Option<PackedWeights> {
        if range.start > range.end || range.end > self.rows {
            return None;
        }
        if range.start.is_multiple_of(self.kernel.mr) {
            return Some(PackedWeights {
                first_panel: self.first_panel + range.start / self.kernel.mr,
                rows: range.len(),
                ..self.clone()
            });
        }
        // Read back in plain rows, then packed from there: a load-time path only (the head's
        // split is on a panel boundary).
        let depth = self.depth;
        let plain: Vec<f32> =
            range.clone().flat_map(|row| (0..depth).map(move |d| (row, d))).map(|(r, d)| self.element(r, d)).collect();
        Some(PackedWeights::pack(self.kernel, &plain, range.len(), depth))
    }

    /// Where panel `p` of this view starts in depth block `kb`, as an index into `data`.
    fn panel_start(&self, kb: usize, p: usize) -> usize {
        let (mr, block) = (self.kernel.mr, depth_block(kb, self.depth));
        block.start * self.stride_panels * mr + (self.first_panel + p) * block.len() * mr
    }

    /// `dst[r * ld + i] += sum_d W[i, d] x[r * depth + d]` for every token `r < n` and row `i`
    /// of this view: the product added to a row-major `[n, ld]` output whose first `rows`
    /// columns it fills. The panels run on rayon's pool when `threads` > 1.
    pub fn multiply_add(&self, x: &[f32], n: usize, dst: &mut [f32], ld: usize, threads: usize) {
        let (kernel, depth) = (self.kernel, self.depth);
        let (mr, nr) = (kernel.mr, kernel.nr());
        assert!(x.len() >= n * depth && ld >= self.rows && dst.len() >= n.saturating_sub(1) * ld + self.rows);
        if n == 0 || self.rows == 0 {
            return;
        }
        let tiles = n.div_ceil(nr);
        let tokens = pack_panels(nr, x, n, depth);
        let panels = self.rows.div_ceil(mr);
        // Contiguous runs of panels, one task each: with one thread, one task.
        let tasks = if threads > 1 { (threads * 2).min(panels) } else { 1 };
        let per_task = panels.div_ceil(tasks);
        let out = Out(dst.as_mut_ptr());
        let block_panels = (ROW_BLOCK / mr).max(1);
        let run = |task: usize| {
            let mine = task * per_task..((task + 1) * per_task).min(panels);
            for first_tile in (0..tiles).step_by(TOKEN_BLOCK / nr) {
                let block_tiles = first_tile..(first_tile + TOKEN_BLOCK / nr).min(tiles);
                for first_panel in mine.clone().step_by(block_panels) {
                    let block_panels = first_panel..(first_panel + block_panels).min(mine.end);
                    for kb in 0..depth.div_ceil(DEPTH_BLOCK) {
                        let block = depth_block(kb, depth);
                        let token_base = block.start * tiles * nr;
                        for p in block_panels.clone() {
                            let lhs = self.data[self.panel_start(kb, p)..].as_ptr();
                            let height = mr.min(self.rows - p * mr);
                            for t in block_tiles.clone() {
                                let width = nr.min(n - t * nr);
                                let rhs = tokens[token_base + t * block.len() * nr..].as_ptr();
                                let ukr = kernel.by_width[width - 1];
                                // SAFETY: the microkernel reads `block.len()` depths of an
                                // `mr`-row panel (`lhs`: `block.len() * mr` floats inside
                                // `self.data`, as `pack_panels` laid them out) and of an `nr`-token
                                // tile (`rhs`: `block.len() * nr` floats inside `tokens`), and adds
                                // its `height x width` result to dst(i, r) at (t nr + r) ld + p mr
                                // + i: rows p mr + i < self.rows <= ld and tokens t nr + r < n,
                                // inside `dst` (asserted above). Tasks own disjoint panels, so no
                                // two threads write the same floats, and `dst` outlives the tasks
                                // (`for_each` returns when all are done).
                                unsafe {
                                    ukr(
                                        height,
                                        width,
                                        block.len(),
                                        out.at(t * nr * ld + p * mr),
                                        lhs,
                                        rhs,
                                        ld as isize,
                                        1,
                                        mr as isize,
                                        nr as isize,
                                        1,
                                        1.0,
                                        1.0,
                                        1,
                                        false,
                                        false,
                                        false,
                                        lhs,
                                    )
                                };
                            }
                        }
                    }
                }
            }
        };
        if tasks > 1 {
            (0..tasks).into_par_iter().for_each(run);
        } else {
            run(0);
        }
    }
}

/// An output pointer shared by parallel tasks that each write their own disjoint elements of it
/// (`multiply_add`'s panels, attention's blocks).
#[derive(Clone, Copy)]
pub(super) struct Out(pub(super) *mut f32);

// SAFETY: its users write disjoint elements through it from each task (each its own panels'
// rows, each attention block its own queries of one head) while the slice it points into is
// mutably borrowed for the whole parallel section.
unsafe impl Send for Out {}
// SAFETY: as for Send: shared only among tasks writing disjoint elements.
unsafe impl Sync for Out {}

impl Out {
    /// The pointer `offset` floats further (no access happens here).
    pub(super) fn at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

/// The loop nest the quantised modes share (`int8`, `bf16`): `dst[r * ld + c] += finish(r, c,
/// sum)` for every token `r < n` and channel `c < rows`, the sums coming in `MR x NR` blocks
/// from `tile(panel, tile, acc)` (panel `p`: channels `p MR..`, tile `t`: tokens `t NR..`; a
/// block's unused lanes are ignored). The panels are split over tasks, two per thread on
/// rayon's pool when `threads` > 1, each task its own panels, so no two tasks write one
/// element; within a task the tokens go in blocks of `token_block` (a multiple of `NR`), so a
/// block's packed tokens stay in cache while every panel of the task passes them.
///
/// Panics if `dst` cannot hold `[n, ld]` rows of `rows` channels.
#[allow(clippy::too_many_arguments)]
pub(super) fn each_block<A, const MR: usize, const NR: usize>(
    rows: usize,
    n: usize,
    dst: &mut [f32],
    ld: usize,
    threads: usize,
    token_block: usize,
    tile: impl Fn(usize, usize, &mut [[A; MR]; NR]) + Sync,
    finish: impl Fn(usize, usize, A) -> f32 + Sync,
) where
    A: Copy + Default,
{
    assert!(ld >= rows && dst.len() >= n.saturating_sub(1) * ld + rows && token_block.is_multiple_of(NR));
    if n == 0 || rows == 0 {
        return;
    }
    let (panels, tiles, tiles_per_block) = (rows.div_ceil(MR), n.div_ceil(NR), (token_block / NR).max(1));
    let tasks = if threads > 1 { (threads * 2).min(panels) } else { 1 };
    let per_task = panels.div_ceil(tasks);
    let out = Out(dst.as_mut_ptr());
    let run = |task: usize| {
        let mut acc = [[A::default(); MR]; NR];
        let mine = task * per_task..((task + 1) * per_task).min(panels);
        for first_tile in (0..tiles).step_by(tiles_per_block) {
            for p in mine.clone() {
                let height = MR.min(rows - p * MR);
                for t in first_tile..(first_tile + tiles_per_block).min(tiles) {
                    tile(p, t, &mut acc);
                    for (j, a) in acc.iter().enumerate().take(NR.min(n - t * NR)) {
                        let token = t * NR + j;
                        let row = out.at(token * ld + p * MR);
                        for (i, &s) in a.iter().enumerate().take(height) {
                            let value = finish(token, p * MR + i, s);
                            // SAFETY: element (token, p MR + i) of the `[n, ld]` output: token
                            // < n and p MR + i < rows <= ld, inside `dst` (asserted above).
                            // Tasks own disjoint panels (channels), and `dst` is borrowed
                            // mutably until every task is done.
                            unsafe { *row.add(i) += value };
                        }
                    }
                }
            }
        }
    };
    if tasks > 1 {
        (0..tasks).into_par_iter().for_each(run);
    } else {
        run(0);
    }
}

/// A row-major `[rows, depth]` matrix packed in panels of `width` rows per depth block (see the
/// module doc), the last panel zero-padded: the weights' layout with `width` = `mr` (once, at
/// load), the tokens' with `width` = `nr` (every call: each row's block is copied as a slice).
fn pack_panels(width: usize, x: &[f32], rows: usize, depth: usize) -> Vec<f32> {
    let panels = rows.div_ceil(width);
    let mut packed = vec![0f32; panels * width * depth];
    for kb in 0..depth.div_ceil(DEPTH_BLOCK) {
        let block = depth_block(kb, depth);
        let base = block.start * panels * width;
        for p in 0..panels {
            let panel = &mut packed[base + p * block.len() * width..][..block.len() * width];
            for i in 0..width.min(rows - p * width) {
                let row = &x[(p * width + i) * depth..][block.clone()];
                for (v, at) in row.iter().zip((i..).step_by(width)) {
                    panel[at] = *v;
                }
            }
        }
    }
    packed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 7919 + seed * 104_729) % 2000) as f32 / 1000.0 - 1.0).collect()
    }

    /// The product in f64, row by row: `dst[r][i] = init + sum_d w[i][d] x[r][d]`.
    fn reference(w: &[f32], x: &[f32], rows: usize, depth: usize, n: usize, init: &[f32]) -> Vec<f32> {
        let mut out = init.to_vec();
        for r in 0..n {
            for i in 0..rows {
                let sum: f64 = (0..depth).map(|d| w[i * depth + d] as f64 * x[r * depth + d] as f64).sum();
                out[r * rows + i] = (init[r * rows + i] as f64 + sum) as f32;
            }
        }
        out
    }

    #[test]
    fn every_kernel_set_adds_the_product_at_every_edge_of_its_panels_tiles_and_blocks() {
        // Rows across panel edges, depths across block edges, tokens across tile and block
        // edges, one and two threads.
        for kernel in Kernel::available() {
            for (rows, depth, n) in [(1, 1, 1), (17, 300, 7), (35, 257, 193), (64, 512, 200), (5, 1000, 3)] {
                let (w, x, init) = (values(rows * depth, 1), values(n * depth, 2), values(n * rows, 3));
                let want = reference(&w, &x, rows, depth, n, &init);
                let packed = PackedWeights::pack(kernel, &w, rows, depth);
                for threads in [1, 2] {
                    let mut got = init.clone();
                    packed.multiply_add(&x, n, &mut got, rows, threads);
                    let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                    assert!(worst < 1e-3, "{} {rows}x{depth} by {n} tokens, {threads} threads: {worst}", kernel.name);
                }
            }
        }
    }

    #[test]
    fn every_kernel_set_this_cpu_has_is_offered_widest_first_and_the_widest_is_chosen() {
        let names: Vec<&str> = Kernel::available().iter().map(|k| k.name).collect();
        #[cfg(target_arch = "x86_64")]
        let want: Vec<&str> = [
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("scalar", true),
        ]
        .into_iter()
        .filter_map(|(name, has)| has.then_some(name))
        .collect();
        #[cfg(target_arch = "aarch64")]
        let want = vec!["neon", "scalar"];
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let want = vec!["scalar"];
        assert_eq!(names, want);
        // The widest, unless the process was told a narrower one this CPU has.
        let forced = crate::backend::cpu::vector::forced().filter(|name| want.contains(&name.as_str()));
        assert_eq!(Kernel::detect().name, forced.as_deref().unwrap_or(want[0]));
    }

    #[test]
    fn a_selection_of_rows_multiplies_as_those_rows_alone_whether_it_starts_on_a_panel_or_not() {
        let kernel = Kernel::detect();
        let (rows, depth, n) = (70, 300, 9);
        let (w, x) = (values(rows * depth, 4), values(n * depth, 5));
        let packed = PackedWeights::pack(kernel, &w, rows, depth);
        for range in [0..kernel.mr, 0..kernel.mr + 3, kernel.mr..rows, 3..40, 69..70, 10..10] {
            let alone = PackedWeights::pack(kernel, &w[range.start * depth..range.end * depth], range.len(), depth);
            let Some(selected) = packed.select(range.clone()) else { panic!("{range:?} is inside") };
            let (mut a, mut b) = (vec![0.5; n * range.len()], vec![0.5; n * range.len()]);
            alone.multiply_add(&x, n, &mut a, range.len(), 1);
            selected.multiply_add(&x, n, &mut b, range.len(), 1);
            assert_eq!(a, b, "rows {range:?}");
        }
        assert!(packed.select(60..71).is_none());
    }

    #[test]
    fn the_product_fills_only_its_columns_of_a_wider_output() {
        let kernel = Kernel::detect();
        let (rows, depth, n, ld) = (20, 40, 5, 33);
        let (w, x) = (values(rows * depth, 6), values(n * depth, 7));
        let mut dst = vec![7.0f32; n * ld];
        PackedWeights::pack(kernel, &w, rows, depth).multiply_add(&x, n, &mut dst, ld, 2);
        for r in 0..n {
            assert!(dst[r * ld + rows..(r + 1) * ld].iter().all(|&v| v == 7.0), "token {r}'s other columns");
            assert!(dst[r * ld..r * ld + rows].iter().any(|&v| v != 7.0), "token {r}'s product");
        }
    }
}
