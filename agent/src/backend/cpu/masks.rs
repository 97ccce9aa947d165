//! The additive attention biases of a padded batch: 0 where a query may attend to a key, the
//! lowest f32 where it may not (what transformers uses; `-inf` would turn a padded row's
//! all-masked softmax into NaN, and NaN times a zero weight still poisons real rows).
//!
//! Global layers mask padding keys; sliding layers also mask keys further than
//! `local_attention / 2` positions away. The QNN host step builds the same tensors for the NPU.

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
}
