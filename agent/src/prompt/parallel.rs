//! laya 0.4.15's parallel option layout (`option_layout: "parallel"` in a checkpoint's
//! `rl_agent_config.json`): position ids and option ids that make the encoder blind to the order
//! of a question's options.
//!
//! In the sequential layout (laya 0.3.20, and every checkpoint without the key) option `s` sits
//! at positions after option `s - 1` and attends to every other option, so where an option is
//! listed changes its embedding. In the parallel layout every option starts at the same position
//! (the one after the instructions' `[SEP]`), the head's closing `[SEP]` and the state continue
//! after the longest option, and the backend's attention masks stop a token of one option from
//! attending to another option's tokens (`backend::cpu::masks::parallel_attention_biases`).
//! Reordering the options then only reorders the marker embeddings, and the decision head, which
//! has no positional encoding, permutes its logits with them.
//!
//! The token ids do not change: a parallel row is a sequential row plus its [`ParallelLayout`].
//! This module knows markers and lengths only, not rows: `layout` builds the row and asks for its
//! layout ([`row_layout`]), so the two depend one way.

/// One row's parallel layout, one entry per token of the row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParallelLayout {
    /// The position RoPE rotates each token by (sequential rows use `0..len`).
    pub position_ids: Vec<u32>,
    /// 0 for shared tokens (`[CLS]`, the instructions, the closing `[SEP]`s, the state), `s + 1`
    /// for the tokens of option slot `s`, from its `[MASK]` up to the next marker (the last slot
    /// up to the head's closing `[SEP]`).
    pub option_ids: Vec<u32>,
}

impl ParallelLayout {
    /// The layout of a row without options, as laya lays it out: `0..len`, no option.
    pub fn sequential(len: usize) -> ParallelLayout {
        ParallelLayout { position_ids: (0..len as u32).collect(), option_ids: vec![0; len] }
    }

    /// Python's `v[:len]` on both lists (laya's `build_sequence` cuts the layout as it cuts the ids).
    pub fn truncate(&mut self, len: usize) {
        self.position_ids.truncate(len);
        self.option_ids.truncate(len);
    }

    /// Entries (both lists have this many).
    pub fn len(&self) -> usize {
        self.position_ids.len()
    }

    /// Whether it has no entry.
    pub fn is_empty(&self) -> bool {
        self.position_ids.is_empty()
    }
}

/// laya's `parallel_layout(markers, head_len, length)`, exactly.
///
/// `markers`: the `[MASK]` index of each option slot, in slot order (all of them, before any cut
/// to `max_len`). `head_len`: the length of the head, `[CLS] instructions [SEP] options [SEP]`,
/// so `head_len - 1` is the index of the `[SEP]` that closes the options and `head_len` that of
/// the first state token (laya's `len(build_head(...)[0])`). `length`: the row's length before
/// the cut to `max_len`.
///
/// As laya's, the result has `length` entries, but for a `length` shorter than the option spans
/// (`head_len - 1`), when it has one entry for each token up to the end of the last span; laya's
/// `build_sequence` never asks that, and cuts the result to `max_len` either way
/// ([`ParallelLayout::truncate`]).
pub fn parallel_layout(markers: &[u32], head_len: usize, length: usize) -> ParallelLayout {
    let Some(&first) = markers.first() else {
        return ParallelLayout::sequential(length);
    };
    let start = first as usize;
    let ends = markers.iter().skip(1).map(|&m| m as usize).chain(std::iter::once(head_len.saturating_sub(1)));
    let spans: Vec<(usize, usize)> = markers.iter().map(|&m| m as usize).zip(ends).collect();
    let mut position_ids: Vec<u32> = (0..start as u32).collect();
    let mut option_ids: Vec<u32> = vec![0; start];
    for (s, &(a, b)) in spans.iter().enumerate() {
        // Python's range(start, start + b - a): empty when b <= a.
        let n = b.saturating_sub(a);
        position_ids.extend((start..start + n).map(|p| p as u32));
        option_ids.extend(std::iter::repeat_n(s as u32 + 1, n));
    }
    // `max(b - a)` in Python can be negative; it is only used through `range`, where a negative
    // length and 0 are the same, and as the start of the state's positions.
    let widest = spans.iter().map(|&(a, b)| b as i64 - a as i64).max().unwrap_or(0);
    let after = start as i64 + widest;
    let rest = length.saturating_sub(position_ids.len());
    position_ids.extend((0..rest as i64).map(|k| (after + k).max(0) as u32));
    option_ids.extend(std::iter::repeat_n(0, rest));
    ParallelLayout { position_ids, option_ids }
}

/// The parallel layout laya 0.4.15's `build_sequence(..., return_layout=True)` gives a row of
/// `len` tokens with its options' `[MASK]`s at `marker_pos`: [`parallel_layout`] over the markers,
/// cut to the row's length.
///
/// `head_len` is the length of the row's head, `[CLS] instructions [SEP] ([MASK] option)* [SEP]`:
/// the index of the first state token, one past the `[SEP]` that closes the options (in
/// `build_row`, `ids.len()` right after that `[SEP]` is pushed). It cannot be read back from the
/// row: an option's text may itself tokenize to `[SEP]`.
///
/// Exact for every row `build_row` returns: it has every option's marker (a row that lost one
/// to `max_len` is an error, not a row), and laying out at the full length then cutting (what
/// laya does) gives the same first entries as laying out at the cut length then cutting, since
/// an entry depends only on the markers, `head_len` and its own index.
pub fn row_layout(marker_pos: &[u32], head_len: usize, len: usize) -> ParallelLayout {
    let mut layout = parallel_layout(marker_pos, head_len, len);
    layout.truncate(len);
    layout
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(position_ids: &[u32], option_ids: &[u32]) -> ParallelLayout {
        ParallelLayout { position_ids: position_ids.to_vec(), option_ids: option_ids.to_vec() }
    }

    // Every expected value below was printed by laya 0.4.15 itself (transformers 5.17.0):
    // `tools/fixtures/parallel_probe.py --layouts` in /work/venvs/l415, which calls
    // `laya.common.parallel_layout` and `laya.common.build_sequence(..., return_layout=True)`.

    #[test]
    fn a_row_without_options_keeps_sequential_positions_and_no_option() {
        // parallel_layout([], 0, 5)
        assert_eq!(parallel_layout(&[], 0, 5), layout(&[0, 1, 2, 3, 4], &[0, 0, 0, 0, 0]));
    }

    #[test]
    fn one_option_changes_no_position_and_marks_its_span() {
        // parallel_layout([5], 9, 12)
        assert_eq!(
            parallel_layout(&[5], 9, 12),
            layout(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], &[0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0])
        );
    }

    #[test]
    fn every_option_starts_at_the_first_markers_position_and_the_state_follows_the_longest() {
        // parallel_layout([4, 7, 13], 18, 25)
        assert_eq!(
            parallel_layout(&[4, 7, 13], 18, 25),
            layout(
                &[0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 8, 9, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15, 16, 17],
                &[0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0]
            )
        );
        // parallel_layout([2, 3], 6, 6)
        assert_eq!(parallel_layout(&[2, 3], 6, 6), layout(&[0, 1, 2, 2, 3, 4], &[0, 0, 1, 2, 2, 0]));
    }

    #[test]
    fn a_length_shorter_than_the_options_gives_one_entry_per_option_token_as_laya_does() {
        // parallel_layout([3, 5, 11], 15, 9): 14 entries for a length of 9.
        assert_eq!(
            parallel_layout(&[3, 5, 11], 15, 9),
            layout(&[0, 1, 2, 3, 4, 3, 4, 5, 6, 7, 8, 3, 4, 5], &[0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3, 3])
        );
    }

    #[test]
    fn a_built_row_gets_the_layout_build_sequence_returns() {
        // build_sequence(tok, "The parcel never arrived and I was charged twice.", <choice "Which team?",
        // ["billing", "shipping and delivery of parcels", "tech"]>, 512, 192, return_layout=True) on
        // bpe-t5's tokenizer; head_len = len(build_head(tok, q, 192)[0]) = 30.
        let ids = [
            1, 303, 364, 357, 30, 225, 59, 76, 495, 266, 73, 69, 81, 35, 2, 4, 821, 4, 710, 758, 552, 606, 279, 327,
            533, 87, 4, 266, 430, 2, 56, 76, 73, 279, 327, 533, 333, 322, 271, 86, 330, 299, 72, 758, 225, 45, 747,
            361, 327, 799, 266, 91, 326, 18, 2,
        ];
        let got = row_layout(&[15, 17, 26], 30, ids.len());
        let want = layout(
            &[
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 15, 16, 17, 18, 19, 20, 21, 22, 23, 15, 16,
                17, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48,
                49,
            ],
            &[
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 0, 0, 0, 0, 0,
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ],
        );
        assert_eq!(got, want);
    }

    #[test]
    fn a_row_cut_by_max_len_gets_the_layout_laid_out_before_the_cut_then_cut() {
        // build_sequence(..., max_len=40, head_max_len=192, return_layout=True): the state cut.
        let ids = [
            1, 303, 364, 357, 30, 225, 59, 76, 495, 266, 73, 69, 81, 35, 2, 4, 821, 4, 710, 758, 552, 606, 279, 327,
            533, 87, 4, 266, 430, 2, 56, 76, 73, 279, 327, 533, 333, 322, 271, 2,
        ];
        let got = row_layout(&[15, 17, 26], 30, ids.len());
        let want = layout(
            &[
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 15, 16, 17, 18, 19, 20, 21, 22, 23, 15, 16,
                17, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34,
            ],
            &[
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 0, 0, 0, 0, 0,
                0, 0, 0, 0, 0, 0,
            ],
        );
        assert_eq!(got, want);

        // build_sequence(..., max_len=24, head_max_len=10, return_layout=True): the options cut
        // to 4 tokens each (head_len 20) and the state to 3 tokens.
        let ids = [1, 303, 364, 357, 30, 225, 59, 76, 495, 2, 4, 821, 4, 710, 758, 552, 4, 266, 430, 2, 56, 76, 73, 2];
        let got = row_layout(&[10, 12, 16], 20, ids.len());
        let want = layout(
            &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 10, 11, 12, 13, 10, 11, 12, 14, 15, 16, 17, 18],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 0, 0, 0, 0, 0],
        );
        assert_eq!(got, want);
    }

    #[test]
    fn a_head_longer_than_max_len_is_laid_out_whole_then_cut() {
        // build_sequence(..., max_len=24, head_max_len=192, return_layout=True): the third
        // option's marker (26) is past max_len, so laya drops it from the markers (and
        // `_encode_state` refuses the question); the layout was laid out with all three.
        let mut got = parallel_layout(&[15, 17, 26], 30, 55);
        got.truncate(24);
        let want = layout(
            &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 15, 16, 17, 18, 19, 20, 21],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 2],
        );
        assert_eq!(got, want);
    }
}
