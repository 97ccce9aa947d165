//! The encoder's attention over each row's own tokens: RoPE, scores, softmax and the weighted
//! values in one op, a block of queries at a time, never a whole `[B, H, L, L]` score matrix.
//!
//! Why not candle's batched matmul with additive biases (as [`super::Encoder::encode`] does, the
//! way the NPU graph computes): that pads every row to the batch's longest, materialises the
//! scores and the probabilities of every head (16 MiB each for one 512-token row at 16 heads),
//! and multiplies the keys a sliding window masks anyway. Here the rows are packed end to end
//! (no padding), a block of [`QUERY_BLOCK`] queries is multiplied only with the keys its mask can
//! let through (for a sliding layer of a sequential row, the block's window: at 512 tokens and a
//! window of 64 either side, 192 keys instead of 512), and a block's scores live in one buffer of
//! `QUERY_BLOCK x keys` floats. The masked keys left inside a block get laya's `f32::MIN` bias, so
//! the softmax gives them exactly 0, as it does in the padded computation; the result is the same
//! sums in a different order (the fixture tolerances hold; `encoder` tests compare the two). The
//! softmax is the vectorised one (`vector::softmax`: its `exp` within 2 ulps of libm's).
//!
//! The blocks of every row and head are independent: they run on rayon's pool, each block's
//! multiplies single-threaded, which keeps both cores busy even for short rows.

use std::borrow::Cow;
use std::ops::Range;

use candle_core::{CpuStorage, CustomOp1, Layout, Shape};
use rayon::prelude::*;

use super::dense::contiguous_f32;
use super::masks::MASKED;
use super::panels::Out;
use super::vector;

/// Queries per block.
pub const QUERY_BLOCK: usize = 64;

/// Which keys a query of a row may attend to, besides its own row's tokens.
#[derive(Debug, Clone, Copy)]
pub enum Mask<'a> {
    /// A sequential row (laya 0.3.20's layout): every key (a global layer) or those at most
    /// `window` positions away (a sliding layer).
    Sequential { window: Option<usize> },
    /// laya 0.4.15's parallel option layout: each token's `(position id, option id)`, packed like
    /// the tokens. A key of a different option is masked; with `window`, so is a key more than
    /// `window` apart in position id (`masks::parallel_attention_biases`).
    Parallel { tokens: &'a [(u32, u32)], window: Option<usize> },
}

/// RoPE (where given), then attention, over packed `[T, 3 * heads * head_dim]` fused query/key/value
/// projections; the output is `[T, heads * head_dim]`.
pub struct Attention<'a> {
    /// Each row's tokens in the packed batch.
    pub rows: &'a [Range<usize>],
    pub heads: usize,
    pub head_dim: usize,
    /// `[T, head_dim / 2]` cos and sin of each token's rotary angles (the encoder's RoPE), or
    /// none (the decision head's attention, which has no positions).
    pub rope: Option<(&'a [f32], &'a [f32])>,
    pub mask: Mask<'a>,
}

/// One task: a block of queries of one row and one head, and the keys they can see at all.
#[derive(Debug, Clone, Copy)]
struct Block {
    row: usize,
    head: usize,
    /// Row-relative.
    queries: (usize, usize),
    keys: (usize, usize),
}

impl Attention<'_> {
    /// Runs over `qkv` (`tokens` rows of `3 d` floats); errors on inconsistent sizes.
    pub fn run(&self, qkv: &[f32], tokens: usize) -> candle_core::Result<Vec<f32>> {
        let (heads, hd) = (self.heads, self.head_dim);
        let d = heads * hd;
        let half = hd / 2;
        let angles = self.rope.map(|(cos, sin)| (cos.len(), sin.len()));
        if qkv.len() != tokens * 3 * d || angles.is_some_and(|(c, s)| c != tokens * half || s != tokens * half) {
            candle_core::bail!("attention: {} projections and {angles:?} angles for {tokens} tokens", qkv.len());
        }
        if (self.rope.is_some() && hd % 2 != 0) || self.rows.iter().any(|r| r.start > r.end || r.end > tokens) {
            candle_core::bail!("attention: rows {:?} of {tokens} tokens, head dim {hd}", self.rows);
        }
        if let Mask::Parallel { tokens: t, .. } = self.mask
            && t.len() != tokens
        {
            candle_core::bail!("attention: a parallel layout of {} tokens for {tokens}", t.len());
        }
        let mut blocks = Vec::new();
        for (row, r) in self.rows.iter().enumerate() {
            for start in (0..r.len()).step_by(QUERY_BLOCK) {
                let queries = (start, (start + QUERY_BLOCK).min(r.len()));
                let keys = self.keys(r, queries);
                blocks.extend((0..heads).map(|head| Block { row, head, queries, keys }));
            }
        }
        // Each block writes its queries' values of its head straight into the output.
        let mut out = vec![0f32; tokens * d];
        let dst = Out(out.as_mut_ptr());
        blocks.par_iter().for_each(|b| self.block(*b, qkv, dst));
        Ok(out)
    }

    /// Rows `first..first + count` of one head (at column `col`) of the queries (`part` 0) or
    /// the keys (`part` 1), as floats and their row stride: rotated, as transformers'
    /// `apply_rotary_pos_emb` does (the halves of the head: `x1 cos - x2 sin`, `x2 cos + x1
    /// sin`; vectorised, the same floats: `vector::rotate`), into a buffer of the block's own where
    /// the encoder's RoPE applies; read where they
    /// are in `qkv` otherwise. Rotating a block's keys (again for each block that reads them)
    /// keeps no rotated `[T, d]` copy of the queries and the keys alive.
    fn part<'q>(&self, qkv: &'q [f32], part: usize, first: usize, count: usize, col: usize) -> (Cow<'q, [f32]>, usize) {
        let (hd, d) = (self.head_dim, self.heads * self.head_dim);
        let Some((cos, sin)) = self.rope else {
            return (Cow::Borrowed(&qkv[first * 3 * d + part * d + col..]), 3 * d);
        };
        let half = hd / 2;
        let mut rotated = vec![0f32; count * hd];
        let angles = first * half..(first + count) * half;
        let x = &qkv[first * 3 * d + part * d + col..];
        vector::rotate(&mut rotated, x, 3 * d, &cos[angles.clone()], &sin[angles], hd);
        (Cow::Owned(rotated), hd)
    }

    /// The keys (row-relative) a block of queries can see at all: the first and the last any
    /// of them may attend to. A sequential row's sliding block sees its window; a parallel row's
    /// range is found by looking (for a row without options it is the same window, so such a
    /// row gets the same sums in either kind of batch).
    fn keys(&self, row: &Range<usize>, (q0, q1): (usize, usize)) -> (usize, usize) {
        let len = row.len();
        match self.mask {
            Mask::Sequential { window: Some(w) } => (q0.saturating_sub(w), (q1 + w).min(len)),
            Mask::Sequential { window: None } => (0, len),
            Mask::Parallel { .. } => {
                let seen = |j: usize| (q0..q1).any(|i| self.allowed(row.start + i, row.start + j));
                let first = (0..len).find(|&j| seen(j)).unwrap_or(0);
                let last = (first..len).rev().find(|&j| seen(j)).map_or(len, |j| j + 1);
                (first, last)
            }
        }
    }

    /// Whether query `i` may attend to key `j` (packed indices, same row).
    fn allowed(&self, i: usize, j: usize) -> bool {
        match self.mask {
            Mask::Sequential { window } => window.is_none_or(|w| i.abs_diff(j) <= w),
            Mask::Parallel { tokens, window } => super::masks::may_attend(tokens[i], tokens[j], window),
        }
    }

    /// One block: its queries' values of its head, written into `out` (`[T, d]`) at their rows
    /// and the head's columns, which no other block writes.
    fn block(&self, b: Block, qkv: &[f32], out: Out) {
        let (hd, d) = (self.head_dim, self.heads * self.head_dim);
        let row = &self.rows[b.row];
        let (k0, k1) = b.keys;
        let (m, n) = (b.queries.1 - b.queries.0, k1 - k0);
        let (first_q, first_k) = (row.start + b.queries.0, row.start + k0);
        let col = b.head * hd;
        let (q, q_stride) = self.part(qkv, 0, first_q, m, col);
        let (k, k_stride) = self.part(qkv, 1, first_k, n, col);
        let mut scores = vec![0f32; m * n];
        let scale = (hd as f32).powf(-0.5);
        // SAFETY: an m x hd lhs (element (i, a) at i * q_stride + a, inside `q`: a rotated m x hd
        // buffer, or `qkv` from query first_q's row at the head's column, with m - 1 more rows of
        // 3d floats and hd more inside it since first_q + m <= row.end <= T and col + hd <= d), an
        // hd x n rhs (the keys transposed: element (a, c) at c * k_stride + a, inside `k`
        // likewise) and an m x n row-major destination inside `scores`' m * n floats. Only
        // `scores` is written, a buffer of its own; all outlive the single-threaded call.
        unsafe {
            gemm::gemm(
                m,
                n,
                hd,
                scores.as_mut_ptr(),
                1,
                n as isize,
                false,
                q.as_ptr(),
                1,
                q_stride as isize,
                k.as_ptr(),
                k_stride as isize,
                1,
                0.0,
                scale,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        };
        for (i, s) in scores.chunks_exact_mut(n).enumerate() {
            match self.mask {
                // A sequential row's keys are masked outside the window only: the scores on
                // either side of it get the bias, the rest are left as they are (the same sums as
                // asking `allowed` for each, without a call per score).
                Mask::Sequential { window } => {
                    let query = first_q + i;
                    let (lo, hi) = window.map_or((0, n), |w| {
                        let lo = query.saturating_sub(w).saturating_sub(first_k).min(n);
                        (lo, (query + w + 1).saturating_sub(first_k).clamp(lo, n))
                    });
                    let (before, rest) = s.split_at_mut(lo);
                    before.iter_mut().chain(&mut rest[hi - lo..]).for_each(|v| *v += MASKED);
                }
                Mask::Parallel { .. } => {
                    for (c, v) in s.iter_mut().enumerate() {
                        if !self.allowed(first_q + i, first_k + c) {
                            *v += MASKED;
                        }
                    }
                }
            }
            vector::softmax(s);
        }
        // SAFETY: an m x n lhs (`scores`, row-major), an n x hd rhs (the values: element (c, a)
        // at (first_k + c) * 3d + 2d + col + a, inside `qkv`'s T * 3d floats as for the keys)
        // and an m x hd destination with rows d apart at out(first_q, col): rows first_q + i <
        // row.end <= T and columns col + a < d of the `[T, d]` output, which `run` holds mutably
        // borrowed until every block is done. No other block writes these elements (blocks own
        // distinct queries of a head), and this one only once.
        unsafe {
            gemm::gemm(
                m,
                hd,
                n,
                out.at(first_q * d + col),
                1,
                d as isize,
                false,
                scores.as_ptr(),
                1,
                n as isize,
                qkv.as_ptr().add(first_k * 3 * d + 2 * d + col),
                1,
                3 * d as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        };
    }
}

impl CustomOp1 for Attention<'_> {
    fn name(&self) -> &'static str {
        "packed-attention"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let data = contiguous_f32(s, l, "attention: input")?;
        let (tokens, width) = l.shape().dims2()?;
        if width != 3 * self.heads * self.head_dim {
            candle_core::bail!(
                "attention: {width} projections per token for {} heads of {}",
                self.heads,
                self.head_dim
            );
        }
        let out = self.run(data, tokens)?;
        Ok((CpuStorage::F32(out), Shape::from((tokens, self.heads * self.head_dim))))
    }
}
