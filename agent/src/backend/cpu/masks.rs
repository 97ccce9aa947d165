//! The additive attention biases of a padded batch: 0 where a query may attend to a key, the
//! lowest f32 where it may not (what transformers uses; `-inf` would turn a padded row's
//! all-masked softmax into NaN, and NaN times a zero weight still poisons real rows).
//!
//! Global layers mask padding keys; sliding layers also mask keys further than
//! `local_attention / 2` positions away. The QNN host step builds the same tensors for the NPU.
//!
//! Rows with a parallel option layout (`prompt::parallel`) get laya 0.4.15's
//! `parallel_option_masks` instead ([`parallel_attention_biases`]).

/// The value of a masked position.
pub const MASKED: f32 = f32::MIN;

/// `[B, L, L]` biases (row-major) for rows of the given lengths padded to `l`.
pub fn attention_biases(lengths: &[usize], l: usize, window: Option<usize>) -> Vec<f32> {
    let mut out = vec![MASKED; lengths.len() * l * l];
    for (b, &len) in lengths.iter().enumerate() {
        for i in 0..l {
            let row = &mut out[(b * l + i) * l..(b * l + i + 1) * l];
            for (j, v) in row.iter_mut().enumerate().take(len.min(l)) {
                if window.is_none_or(|w| i.abs_diff(j) <= w) {
                    *v = 0.0;
                }
            }
        }
    }
    out
}

/// One row of a batch as [`parallel_attention_biases`] sees it: its length, and each token's
/// position id and option id (`len` of each; a sequential row is positions `0..len`, options 0).
#[derive(Debug, Clone, Copy)]
pub struct LaidOut<'a> {
    pub position_ids: &'a [u32],
    pub option_ids: &'a [u32],
}

/// `[B, L, L]` biases of laya 0.4.15's `parallel_option_masks` for rows padded to `l`: a query
/// may attend to every real key except those of a *different* option (both option ids above 0
/// and unequal), in global and sliding layers alike; with `window`, sliding layers also mask keys
/// more than `window` apart in position id (not in index: options share positions, so an index
/// window would let the first option see more of the state than the last).
///
/// laya pads position and option ids with 0 (`collate_items`); a padding query attends as a
/// shared token at position 0. No real token reads a padding query's output, and padding keys
/// are masked for every query.
pub fn parallel_attention_biases(rows: &[LaidOut<'_>], l: usize, window: Option<usize>) -> Vec<f32> {
    let mut out = vec![MASKED; rows.len() * l * l];
    for (b, row) in rows.iter().enumerate() {
        let len = row.position_ids.len().min(row.option_ids.len()).min(l);
        let at = |i: usize| if i < len { (row.position_ids[i], row.option_ids[i]) } else { (0, 0) };
        for i in 0..l {
            let (pi, oi) = at(i);
            let biases = &mut out[(b * l + i) * l..(b * l + i + 1) * l];
            for (j, v) in biases.iter_mut().enumerate().take(len) {
                if may_attend((pi, oi), at(j), window) {
                    *v = 0.0;
                }
            }
        }
    }
    out
}

/// laya 0.4.15's rule for a query and a key of one row, each `(position id, option id)`: not a
/// key of a *different* option (both ids above 0 and unequal) and, with `window`, not more than
/// `window` apart in position id. [`parallel_attention_biases`] and the packed attention op
/// both apply it.
pub fn may_attend((pi, oi): (u32, u32), (pj, oj): (u32, u32), window: Option<usize>) -> bool {
    let other_option = oi > 0 && oj > 0 && oi != oj;
    !other_option && window.is_none_or(|w| pi.abs_diff(pj) as usize <= w)
}

/// `[B, L]` key-padding biases for the decision head (PyTorch's `src_key_padding_mask`).
pub fn key_padding_biases(lengths: &[usize], l: usize) -> Vec<f32> {
    lengths.iter().flat_map(|&len| (0..l).map(move |j| if j < len { 0.0 } else { MASKED })).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sliding_biases_combine_the_window_and_padding() {
        let g = attention_biases(&[3], 4, None);
        assert_eq!(&g[..4], &[0.0, 0.0, 0.0, MASKED]);
        let s = attention_biases(&[4], 4, Some(1));
        assert_eq!(&s[..4], &[0.0, 0.0, MASKED, MASKED]);
        assert_eq!(&s[4..8], &[0.0, 0.0, 0.0, MASKED]);
        let s = attention_biases(&[2], 4, Some(1));
        assert_eq!(&s[8..12], &[MASKED, 0.0, MASKED, MASKED]);
    }

    const M: f32 = MASKED;

    #[test]
    fn parallel_biases_keep_each_option_from_the_others_but_not_from_shared_tokens() {
        // [CLS] [SEP] | [MASK] a | [MASK] b b | [SEP] state, laid out by parallel_layout([2, 4], 7, 8).
        let row = LaidOut { position_ids: &[0, 1, 2, 3, 2, 3, 4, 5], option_ids: &[0, 0, 1, 1, 2, 2, 2, 0] };
        let g = parallel_attention_biases(&[row], 9, None);
        let q = |i: usize| &g[i * 9..(i + 1) * 9];
        assert_eq!(q(0), &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, M], "a shared token sees every real token");
        assert_eq!(q(2), &[0.0, 0.0, 0.0, 0.0, M, M, M, 0.0, M], "option 1 does not see option 2");
        assert_eq!(q(5), &[0.0, 0.0, M, M, 0.0, 0.0, 0.0, 0.0, M], "option 2 does not see option 1");
        assert_eq!(q(8), &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, M], "padding: a shared token at position 0");
    }

    #[test]
    fn parallel_sliding_biases_measure_the_window_in_position_ids() {
        let row = LaidOut { position_ids: &[0, 1, 2, 3, 2, 3, 4, 5], option_ids: &[0, 0, 1, 1, 2, 2, 2, 0] };
        let s = parallel_attention_biases(&[row], 8, Some(2));
        let q = |i: usize| &s[i * 8..(i + 1) * 8];
        // Index 7 (position 5) is 3 indices from index 4 (position 2) but its window is in
        // positions: 5 - 2 = 3 > 2.
        assert_eq!(q(7), &[M, M, M, 0.0, M, 0.0, 0.0, 0.0]);
        // Index 4 (option 2, position 2) sees positions 0..=4 of its own option and shared tokens.
        assert_eq!(q(4), &[0.0, 0.0, M, M, 0.0, 0.0, 0.0, M]);
    }

    #[test]
    fn a_sequential_layout_gives_the_sequential_biases_of_real_queries() {
        let (len, l, w) = (6, 8, Some(2));
        let positions: Vec<u32> = (0..len as u32).collect();
        let row = LaidOut { position_ids: &positions, option_ids: &[0; 6] };
        for window in [None, w] {
            let p = parallel_attention_biases(&[row], l, window);
            let s = attention_biases(&[len], l, window);
            assert_eq!(&p[..len * l], &s[..len * l], "{window:?}");
        }
    }
}
