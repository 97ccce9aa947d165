//! Shape buckets and padding: how one question row becomes the graph's five fixed-shape tensors.
//!
//! An RKNN graph has one compiled shape, so every row is padded to it: a 65-token prompt still
//! costs a 512-token run. A bundle may therefore carry several graphs (say 128/256/512); a row
//! runs on the smallest that holds it. The padding is what the graph's masks ignore: `input_ids`
//! padded with the tokenizer's pad id and `attention_mask` 0 there, `marker_pos` padded with 0
//! and `marker_mask` 0 there (the graph writes -10000 into those logit slots).

use crate::prompt::Row;

/// Index of the graph (in `shapes`, as `(seq_len, marker_slots)`) that should run a row of
/// `len` tokens and `options` markers: the smallest `seq_len` that holds the row among the
/// graphs with enough marker slots. `None` if no graph holds it.
pub fn choose_graph(shapes: &[(usize, usize)], len: usize, options: usize) -> Option<usize> {
    shapes
        .iter()
        .enumerate()
        .filter(|(_, (l, s))| *l >= len && *s >= options)
        .min_by_key(|(_, (l, _))| *l)
        .map(|(i, _)| i)
}

/// The five input tensors of one graph, allocated once and refilled for every row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Padded {
    pub input_ids: Vec<i64>,
    pub attention_mask: Vec<i64>,
    pub marker_pos: Vec<i64>,
    pub marker_mask: Vec<i64>,
    pub qtype: Vec<i64>,
}

impl Padded {
    pub fn new(seq_len: usize, marker_slots: usize) -> Padded {
        Padded {
            input_ids: vec![0; seq_len],
            attention_mask: vec![0; seq_len],
            marker_pos: vec![0; marker_slots],
            marker_mask: vec![0; marker_slots],
            qtype: vec![0; 1],
        }
    }

    /// Lays `row` out over the compiled shape. The row must fit (checked by the caller, which
    /// chose this graph with [`choose_graph`]).
    pub fn fill(&mut self, row: &Row, pad_id: u32) {
        let n = row.input_ids.len();
        let k = row.marker_pos.len();
        debug_assert!(n <= self.input_ids.len() && k <= self.marker_pos.len());
        for (i, (id, mask)) in self.input_ids.iter_mut().zip(self.attention_mask.iter_mut()).enumerate() {
            (*id, *mask) = match row.input_ids.get(i) {
                Some(&t) => (i64::from(t), 1),
                None => (i64::from(pad_id), 0),
            };
        }
        for (j, (pos, mask)) in self.marker_pos.iter_mut().zip(self.marker_mask.iter_mut()).enumerate() {
            (*pos, *mask) = match row.marker_pos.get(j) {
                Some(&p) => (i64::from(p), 1),
                None => (0, 0),
            };
        }
        self.qtype[0] = row.qtype.index() as i64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::QType;

    #[test]
    fn a_row_runs_on_the_smallest_graph_that_holds_it() {
        let shapes = [(512, 64), (128, 64), (256, 64)];
        assert_eq!(choose_graph(&shapes, 65, 3), Some(1));
        assert_eq!(choose_graph(&shapes, 128, 3), Some(1));
        assert_eq!(choose_graph(&shapes, 129, 3), Some(2));
        assert_eq!(choose_graph(&shapes, 512, 64), Some(0));
        assert_eq!(choose_graph(&shapes, 513, 3), None);
        assert_eq!(choose_graph(&shapes, 10, 65), None);
        // Marker slots count too: a short row with many options needs the graph that has them.
        assert_eq!(choose_graph(&[(128, 8), (512, 64)], 20, 9), Some(1));
    }

    #[test]
    fn padding_masks_everything_past_the_row() {
        let row = Row { input_ids: vec![5, 6, 7], marker_pos: vec![1, 2], qtype: QType::Noul, layout: None };
        let mut p = Padded::new(5, 4);
        p.fill(&row, 99);
        assert_eq!(p.input_ids, [5, 6, 7, 99, 99]);
        assert_eq!(p.attention_mask, [1, 1, 1, 0, 0]);
        assert_eq!(p.marker_pos, [1, 2, 0, 0]);
        assert_eq!(p.marker_mask, [1, 1, 0, 0]);
        assert_eq!(p.qtype, [2]);
        // Refilling with a shorter row leaves nothing of the previous one behind.
        p.fill(&Row { input_ids: vec![8], marker_pos: vec![0], qtype: QType::Choice, layout: None }, 99);
        assert_eq!(p.input_ids, [8, 99, 99, 99, 99]);
        assert_eq!(p.marker_mask, [1, 0, 0, 0]);
        assert_eq!(p.qtype, [0]);
    }
}
