//! What the model behind a bundle can take, so that no request asks more.
//!
//! laya lets a request raise `max_len` and `head_max_len` to anything, and a ModernBERT encoder
//! runs whatever length it is given: a `max_len` of a million over a 200 KB state made the CPU
//! worker allocate 25 GB. Here a request may lower the model's budget but never raise it, and
//! an NPU bundle's budget is at most its longest graph, so the state is cut (as laya cuts it for
//! that `max_len`) to rows the graphs run. A row that still does not fit (more options than any
//! graph's marker slots) gets `too_large` in its question's place; the other questions are
//! answered.

use laya_topics::Request;

use super::layout::{Limits, Row};
use super::pyrepr::repr_str;
use super::question::{QuestionError, QuestionErrorKind};

/// One shape of row a backend runs: an NPU graph compiled for `seq_len` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowShape {
    pub seq_len: usize,
    /// Option marker slots (RKNN graphs); `None` where the options are not part of the graph
    /// (QNN runs the head on the host).
    pub marker_slots: Option<usize>,
}

/// The most a request may ask of this model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    /// The budget a request gets when it names none, and the most it may name: the checkpoint's
    /// (or the manifest's), for an NPU bundle at most its longest usable graph.
    pub limits: Limits,
    /// The rows the backend can run; `None` for a checkpoint (any row within `limits.max_len`).
    pub shapes: Option<Vec<RowShape>>,
}

impl Capacity {
    /// A checkpoint's capacity: its budget, any row within it.
    pub fn of_checkpoint(limits: Limits) -> Capacity {
        Capacity { limits, shapes: None }
    }

    /// An NPU bundle's capacity: `declared` (checkpoint or manifest) cut to the longest of
    /// `shapes`, the graphs that can run rows.
    pub fn of_graphs(declared: Limits, shapes: Vec<RowShape>) -> Capacity {
        let longest = shapes.iter().map(|s| i64::try_from(s.seq_len).unwrap_or(i64::MAX)).max();
        let max_len = longest.map_or(declared.max_len, |l| declared.max_len.min(l));
        Capacity { limits: Limits { max_len, ..declared }, shapes: Some(shapes) }
    }

    /// The budget of `request`: its `max_len` and `head_max_len` where it lowers them, the
    /// model's otherwise. laya's layout then cuts the state for that budget exactly as laya
    /// would; a value below what the options need gets laya's own error for the question.
    pub fn limits_for(&self, request: &Request) -> Limits {
        let lower = |asked: Option<i64>, model: i64| asked.map_or(model, |a| a.min(model));
        Limits {
            max_len: lower(request.max_len, self.limits.max_len),
            head_max_len: lower(request.head_max_len, self.limits.head_max_len),
        }
    }

    /// Whether the backend can run `row` (question `qid`): `too_large`, naming the limit, if no
    /// shape holds both its tokens and its options.
    pub fn check(&self, qid: &str, row: &Row) -> Result<(), QuestionError> {
        let Some(shapes) = &self.shapes else { return Ok(()) };
        let (n, k) = (row.input_ids.len(), row.marker_pos.len());
        let holds = |s: &RowShape| s.seq_len >= n && s.marker_slots.is_none_or(|m| m >= k);
        if shapes.iter().any(holds) {
            return Ok(());
        }
        let most_slots = shapes.iter().map(|s| s.marker_slots.unwrap_or(usize::MAX)).max();
        let message = match most_slots {
            None => format!("question {} cannot run: this bundle has no graph usable for its rows", repr_str(qid)),
            Some(m) if m < k => format!(
                "question {} has {k} options; this bundle's graphs have at most {m} option slots (marker_slots)",
                repr_str(qid)
            ),
            Some(_) => {
                let have: Vec<String> = shapes
                    .iter()
                    .map(|s| match s.marker_slots {
                        Some(m) => format!("{} tokens x {m} options", s.seq_len),
                        None => format!("{} tokens", s.seq_len),
                    })
                    .collect();
                format!(
                    "question {}: its row of {n} tokens and {k} options fits no graph of this bundle ({})",
                    repr_str(qid),
                    have.join(", ")
                )
            }
        };
        Err(QuestionError { kind: QuestionErrorKind::ExceedsBackend, message })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::QType;
    use laya_topics::Value;

    fn request(max_len: Option<i64>, head_max_len: Option<i64>) -> Request {
        Request {
            id: None,
            state: Value::Str(String::new()),
            questions: Default::default(),
            lang: None,
            max_len,
            head_max_len,
            deadline_ms: None,
            min_confidence: None,
        }
    }

    fn row(n: usize, k: usize) -> Row {
        Row { input_ids: vec![1; n], marker_pos: (0..k as u32).collect(), qtype: QType::Choice, layout: None }
    }

    #[test]
    fn a_request_may_lower_the_budget_but_never_raise_it() {
        let c = Capacity::of_checkpoint(Limits { max_len: 512, head_max_len: 192 });
        assert_eq!(c.limits_for(&request(None, None)), Limits { max_len: 512, head_max_len: 192 });
        assert_eq!(c.limits_for(&request(Some(1_000_000), Some(i64::MAX))), c.limits);
        assert_eq!(c.limits_for(&request(Some(128), Some(40))), Limits { max_len: 128, head_max_len: 40 });
        // Below what any row needs stays as asked: laya's own error answers the question.
        assert_eq!(c.limits_for(&request(Some(-3), Some(i64::MIN))).max_len, -3);
    }

    #[test]
    fn an_npu_bundle_budget_stops_at_its_longest_graph() {
        let declared = Limits { max_len: 512, head_max_len: 192 };
        let shapes = vec![RowShape { seq_len: 128, marker_slots: None }, RowShape { seq_len: 256, marker_slots: None }];
        assert_eq!(Capacity::of_graphs(declared, shapes).limits, Limits { max_len: 256, head_max_len: 192 });
        let small = Limits { max_len: 96, head_max_len: 48 };
        assert_eq!(Capacity::of_graphs(small, vec![RowShape { seq_len: 512, marker_slots: Some(64) }]).limits, small);
    }

    #[test]
    fn a_row_with_more_options_than_marker_slots_is_too_large_for_its_question_alone() {
        let c = Capacity::of_graphs(
            Limits::default(),
            vec![RowShape { seq_len: 128, marker_slots: Some(8) }, RowShape { seq_len: 512, marker_slots: Some(64) }],
        );
        assert!(c.check("q", &row(500, 64)).is_ok());
        assert!(c.check("q", &row(20, 9)).is_ok(), "the long graph has the slots");
        let e = c.check("many", &row(30, 65)).unwrap_err();
        assert_eq!((e.kind, e.code()), (QuestionErrorKind::ExceedsBackend, "too_large"));
        assert_eq!(
            e.message,
            "question 'many' has 65 options; this bundle's graphs have at most 64 option slots (marker_slots)"
        );
        let odd = Capacity::of_graphs(
            Limits::default(),
            vec![RowShape { seq_len: 512, marker_slots: Some(8) }, RowShape { seq_len: 128, marker_slots: Some(64) }],
        );
        let e = odd.check("q", &row(300, 20)).unwrap_err();
        assert!(e.message.contains("300 tokens and 20 options fits no graph"), "{}", e.message);
        assert!(Capacity::of_checkpoint(Limits::default()).check("q", &row(5000, 500)).is_ok());
        let none = Capacity::of_graphs(Limits::default(), Vec::new());
        assert!(none.check("q", &row(3, 1)).unwrap_err().message.contains("no graph usable"));
    }
}
