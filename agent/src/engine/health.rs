//! The health call and the constant-output evidence, kept by the agent across workers.
//!
//! Every new worker answers two different, valid rows (laid out by `prompt` from a small fixed
//! request, so they fit any model) after it reports "loaded" and before any question: a runtime
//! that loads but cannot run is caught before a client waits on it, and the measured time seeds
//! the deadline. A runtime that returns the same output for every input (librknnrt 2.4.2 on NPU
//! driver 0.9.8) is caught by comparing outputs of different rows; the worker's own guard sees
//! only its own rows, so the agent keeps the last outputs of recent distinct rows across
//! restarts and checks every answer against them, the health call's included. What the message
//! blames depends on the backend that answered ([`ConstantOutput::message`]): on the CPU, which
//! has no runtime to blame, it is the model's weights.

use std::collections::VecDeque;

use crate::backend::RowResult;
use crate::prompt::{self, Limits, Row, Tokenizer};

/// The fixed request the health rows are laid out from.
const HEALTH_REQUEST: &str = r#"{"state": "laya-edge health check: is the model answering?", "questions": {
    "alive": {"type": "noul", "instructions": "Is this a health check?"},
    "kind": {"type": "choice", "instructions": "Which part is checked?", "criteria": {"npu": "the accelerator", "cpu": "the host"}}}}"#;

/// The two health rows for a model, laid out like any question (`prompt::prepare`).
pub fn rows(tokenizer: &Tokenizer, limits: Limits) -> Result<Vec<Row>, String> {
    let value = laya_topics::json::parse_str(HEALTH_REQUEST, Default::default()).map_err(|e| e.to_string())?;
    let request = laya_topics::Request::from_value(value).map_err(|e| e.to_string())?;
    let prepared = prompt::prepare(tokenizer, &request, limits).map_err(|e| e.to_string())?;
    let rows: Vec<Row> = prepared
        .into_iter()
        .map(|p| p.outcome.map(|(_, row)| row).map_err(|e| format!("health question {}: {e}", p.qid)))
        .collect::<Result<_, _>>()?;
    if rows.len() != 2 || rows[0].input_ids == rows[1].input_ids {
        return Err("the health request did not give two different rows".into());
    }
    Ok(rows)
}

/// How many recent distinct rows' outputs are remembered.
const KEEP: usize = 8;

/// The last outputs of recent distinct rows, across workers.
#[derive(Debug, Default)]
pub struct Evidence {
    seen: VecDeque<(Vec<u32>, Vec<u32>)>,
}

fn bits(r: &RowResult) -> Vec<u32> {
    r.logits.iter().chain(&r.act_logits).map(|v| v.to_bits()).collect()
}

/// Two different rows came back with bit-identical outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConstantOutput {
    /// The token counts of the remembered row and of the new one.
    pub tokens: (usize, usize),
}

impl ConstantOutput {
    /// What it means on `backend` (the name a worker announces: `cpu`, `rknn`, `qnn`, `null`).
    pub fn message(&self, backend: &str) -> String {
        let (a, b) = self.tokens;
        let what = format!(
            "constant output: two different rows ({a} and {b} tokens) came back with bit-identical logits on the {backend} backend"
        );
        let why = match backend {
            "cpu" => {
                "the model's weights give the same output for every input (the CPU computes them as they are, so the checkpoint is broken: e.g. a head whose weights are zeros or were not trained or exported); fix or replace the model"
            }
            "rknn" => "the runtime is broken (librknnrt 2.4.2 on NPU driver 0.9.8 does this)",
            "qnn" => {
                "the runtime or the bundle's context binaries are broken (a graph that lost its inputs in conversion, or a DSP that does not run it): check the bundle with `laya-edge probe` on this board"
            }
            "null" => "the null backend's `constant` fault (testing)",
            _ => "the backend is broken",
        };
        format!("{what}: {why}")
    }
}

impl Evidence {
    /// Checks a call's outputs against each other and against remembered rows; remembers them.
    /// An error if two different rows (token ids; the markers follow from them) came back
    /// bit-identical.
    pub fn check(&mut self, rows: &[Row], outputs: &[RowResult]) -> Result<(), ConstantOutput> {
        for (row, out) in rows.iter().zip(outputs) {
            let b = bits(out);
            let same = self.seen.iter().find(|(ids, seen)| *seen == b && *ids != row.input_ids);
            if let Some((ids, _)) = same {
                return Err(ConstantOutput { tokens: (ids.len(), row.input_ids.len()) });
            }
            self.seen.retain(|(ids, _)| *ids != row.input_ids);
            self.seen.push_back((row.input_ids.clone(), b));
            if self.seen.len() > KEEP {
                self.seen.pop_front();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::QType;

    fn row(ids: &[u32]) -> Row {
        Row { input_ids: ids.to_vec(), marker_pos: vec![0], qtype: QType::Noul, layout: None }
    }

    fn out(v: f32) -> RowResult {
        RowResult { logits: vec![v], act_logits: vec![0.5, 0.25] }
    }

    #[test]
    fn a_constant_runtime_is_caught_on_a_new_workers_first_row() {
        let mut e = Evidence::default();
        // The old worker answered two rows well...
        e.check(&[row(&[1, 2]), row(&[1, 3])], &[out(0.5), out(0.75)]).unwrap();
        // ...the new one answers its first, single row with the same bits as a different old row.
        let err = e.check(&[row(&[1, 4])], &[out(0.75)]).unwrap_err();
        assert_eq!(err, ConstantOutput { tokens: (2, 2) });
        assert!(err.message("rknn").contains("constant output"), "{}", err.message("rknn"));
    }

    #[test]
    fn constant_output_on_the_cpu_blames_the_models_weights_and_only_rknn_blames_librknnrt() {
        let err = ConstantOutput { tokens: (12, 17) };
        let cpu = err.message("cpu");
        assert!(cpu.starts_with("constant output: two different rows (12 and 17 tokens)"), "{cpu}");
        assert!(cpu.contains("on the cpu backend") && cpu.contains("the model's weights"), "{cpu}");
        let rknn = err.message("rknn");
        assert!(rknn.contains("librknnrt 2.4.2 on NPU driver 0.9.8"), "{rknn}");
        for backend in ["cpu", "qnn", "null", "something else"] {
            let m = err.message(backend);
            assert!(m.contains("constant output") && !m.contains("librknnrt"), "{backend}: {m}");
        }
    }

    #[test]
    fn the_same_row_again_and_different_outputs_pass() {
        let mut e = Evidence::default();
        e.check(&[row(&[1, 2]), row(&[1, 2])], &[out(0.5), out(0.5)]).unwrap();
        e.check(&[row(&[1, 3])], &[out(-0.0)]).unwrap();
        e.check(&[row(&[1, 4])], &[out(0.0)]).unwrap();
    }

    #[test]
    fn the_health_rows_are_two_different_valid_rows_of_the_model() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/laya-0.3.20/models/bpe-small");
        let bundle = crate::bundle::HostBundle::load(&dir).unwrap();
        let rows = rows(&bundle.tokenizer, bundle.config.limits).unwrap();
        assert_eq!(rows.len(), 2);
        // A noul question lays out its two options (yes, no); the choice here has two as well.
        assert_eq!((rows[0].marker_pos.len(), rows[1].marker_pos.len()), (2, 2));
        assert!(rows.iter().all(|r| r.input_ids.len() as i64 <= bundle.config.limits.max_len));
    }
}
