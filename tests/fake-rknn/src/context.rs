//! One fake context: the checkpoint on the CPU reference, the inputs last set, the last output.
//!
//! A run computes what the real graph computes: the row is recovered from the padded tensors
//! (the tokens under `attention_mask`, the markers under `marker_mask`) and run through
//! `CpuModel::forward` unpadded, which is equivalent because the graph's attention masks the
//! padding; the `marker_slots` logits hold -10000 past the real options. The fake checks its
//! inputs more strictly than the real runtime (masks must be a run of 1s then 0s, markers inside
//! the row), so a padding bug in the backend shows up as `RKNN_ERR_INPUT_INVALID`.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use laya_edge::backend::cpu::CpuModel;
use laya_edge::backend::cpu::head::MISSING_MARKER_LOGIT;
use laya_edge::bundle::AgentConfig;
use laya_edge::prompt::{QType, Row};

use crate::abi;
use crate::graph::FakeGraph;
use crate::knobs::Knobs;

/// Runs so far in this process (what `FAKE_RKNN_HANG_ON_RUN`/`FAIL_ON_RUN` count).
static RUNS: AtomicU64 = AtomicU64::new(0);
/// What `FAKE_RKNN_CONSTANT_OUTPUT` answers in option slot `i`, whatever the input, from the
/// first run of every process: a real 2.4.2 runtime on driver 0.9.8 is constant from its first
/// run, so no process ever gives a legitimate answer. The values are fixed (not the model's),
/// distinct per slot and exact in float16.
pub fn constant_logit(i: usize) -> f32 {
    1.5 - 0.25 * (i % 16) as f32
}

/// What `FAKE_RKNN_SPANS` times runs from: the process's first run.
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// The RK3588's three NPU cores, each busy while a run holds its lock.
static CORES: [Mutex<()>; 3] = [Mutex::new(()), Mutex::new(()), Mutex::new(())];

/// Occupies the cores of `mask` for one run, in core order (so two runs never wait for each
/// other crosswise). A single-core mask takes that core; a multi-core mask (`0x3`, `0x7`,
/// `0xFFFF`: all) takes every core in it, since the Laya graph's attention stays on core 0 and
/// a run is no faster on three cores (the model card); auto (0) takes the first idle core, else
/// waits for core 0.
fn occupy(mask: u32) -> Vec<MutexGuard<'static, ()>> {
    let lock = |c: &'static Mutex<()>| c.lock().unwrap_or_else(|e| e.into_inner());
    if mask == abi::CORE_AUTO {
        return match CORES.iter().find_map(|c| c.try_lock().ok()) {
            Some(g) => vec![g],
            None => vec![lock(&CORES[0])],
        };
    }
    CORES.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, c)| lock(c)).collect()
}

/// The graph's inputs, in this order (the index `rknn_query(INPUT_ATTR)` reports).
pub const INPUTS: [&str; 5] = ["input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype"];

pub struct Context {
    pub graph: FakeGraph,
    pub knobs: Knobs,
    /// Shared with the contexts duplicated from this one (`rknn_dup_context`).
    model: Arc<CpuModel>,
    /// The last `rknn_set_core_mask` (auto until then).
    pub core_mask: u32,
    /// Indexed like [`INPUTS`]; set by `rknn_inputs_set`.
    inputs: Option<[Vec<i64>; 5]>,
    /// The last run's logits.
    output: Option<Vec<f32>>,
    /// Buffers handed out by `rknn_outputs_get` without `is_prealloc`, freed on release.
    pub handed_out: Vec<Box<[f32]>>,
}

impl Context {
    /// Loads the checkpoint the graph file names.
    pub fn load(graph: FakeGraph, knobs: Knobs) -> Result<Context, String> {
        let config = AgentConfig::load(&graph.checkpoint).map_err(|e| e.to_string())?;
        let model = CpuModel::load(&graph.checkpoint, &config).map_err(|e| e.to_string())?;
        Ok(Context {
            graph,
            knobs,
            model: Arc::new(model),
            core_mask: abi::CORE_AUTO,
            inputs: None,
            output: None,
            handed_out: Vec::new(),
        })
    }

    /// A context of the same graph sharing the weights, with nothing set (`rknn_dup_context`).
    pub fn dup(&self) -> Context {
        Context {
            graph: self.graph.clone(),
            knobs: self.knobs.clone(),
            model: Arc::clone(&self.model),
            core_mask: abi::CORE_AUTO,
            inputs: None,
            output: None,
            handed_out: Vec::new(),
        }
    }

    /// Element count of input `i`.
    pub fn input_len(&self, i: usize) -> usize {
        match i {
            0 | 1 => self.graph.seq_len,
            2 | 3 => self.graph.marker_slots,
            _ => 1,
        }
    }

    /// The attribute `rknn_query(INPUT_ATTR)` reports for input `i`.
    pub fn input_attr(&self, i: usize) -> abi::TensorAttr {
        let mut a = abi::TensorAttr::for_index(i as u32);
        a.set_name(INPUTS[i]);
        let shape: &[u32] = match i {
            4 => &[1],
            _ => &[1, self.input_len(i) as u32],
        };
        a.n_dims = shape.len() as u32;
        a.dims[..shape.len()].copy_from_slice(shape);
        a.n_elems = self.input_len(i) as u32;
        a.size = a.n_elems * 8;
        a.size_with_stride = a.size;
        a.fmt = abi::FORMAT_UNDEFINED;
        a.type_ = abi::TENSOR_INT64;
        a.qnt_type = abi::QNT_NONE;
        a.scale = 1.0;
        a
    }

    /// The attribute of the one output: `logits`, `1 x marker_slots`, float16 as in the FP16 graph.
    pub fn output_attr(&self) -> abi::TensorAttr {
        let mut a = abi::TensorAttr::for_index(0);
        a.set_name("logits");
        a.n_dims = 2;
        a.dims[0] = 1;
        a.dims[1] = self.graph.marker_slots as u32;
        a.n_elems = self.graph.marker_slots as u32;
        a.size = a.n_elems * 2;
        a.size_with_stride = a.size;
        a.fmt = abi::FORMAT_UNDEFINED;
        a.type_ = abi::TENSOR_FLOAT16;
        a.qnt_type = abi::QNT_NONE;
        a.scale = 1.0;
        a
    }

    pub fn set_inputs(&mut self, inputs: [Vec<i64>; 5]) {
        self.inputs = Some(inputs);
        self.output = None;
    }

    pub fn output(&self) -> Option<&[f32]> {
        self.output.as_deref()
    }

    /// One `rknn_run`, with the knobs applied. Returns an RKNN status code.
    pub fn run(&mut self) -> i32 {
        let n = RUNS.fetch_add(1, Ordering::SeqCst) + 1;
        if self.knobs.hang_on_run == Some(n) {
            // A hung NPU job: never returns (park can wake spuriously, hence the loop).
            loop {
                std::thread::park();
            }
        }
        let epoch = *EPOCH.get_or_init(Instant::now);
        {
            let _cores = (self.knobs.latency_ms > 0).then(|| occupy(self.core_mask));
            let start = epoch.elapsed();
            std::thread::sleep(Duration::from_millis(self.knobs.latency_ms));
            self.span(start, epoch.elapsed());
        }
        if let Some(code) = self.knobs.failure_for(n) {
            return code;
        }
        let Some(row) = self.inputs.as_ref().and_then(|i| self.recover_row(i)) else {
            return abi::RKNN_ERR_INPUT_INVALID;
        };
        let Ok(out) = self.model.forward(&[&row]) else {
            return abi::RKNN_ERR_INPUT_INVALID;
        };
        let mut logits = vec![MISSING_MARKER_LOGIT; self.graph.marker_slots];
        let options = out[0].logits.len();
        if self.knobs.constant_output {
            // The broken runtime: the same vector for every input; the slots past the options
            // keep -10000 as in a real run (the graph's marker mask).
            for (i, l) in logits[..options].iter_mut().enumerate() {
                *l = constant_logit(i);
            }
        } else {
            logits[..options].copy_from_slice(&out[0].logits);
        }
        self.trace(&format!(
            "run={n} seq_len={} tokens={} options={}",
            self.graph.seq_len,
            row.input_ids.len(),
            row.marker_pos.len()
        ));
        if let Some(inputs) = &self.inputs {
            self.dump(inputs, &logits);
        }
        self.output = Some(logits);
        abi::RKNN_SUCC
    }

    /// Appends the run's inputs and logits to `FAKE_RKNN_DUMP`, if set, as one JSON line
    /// (`{"input_ids": [...], ..., "qtype": [...], "logits": [...]}`; floats in Rust's shortest
    /// round-trip form, so they read back as the same `f32`). Best effort.
    fn dump(&self, inputs: &[Vec<i64>; 5], logits: &[f32]) {
        let Some(path) = &self.knobs.dump else { return };
        let list = |v: &mut dyn Iterator<Item = String>| v.collect::<Vec<_>>().join(",");
        let mut line = String::from("{");
        for (name, values) in INPUTS.iter().zip(inputs) {
            line += &format!("\"{name}\":[{}],", list(&mut values.iter().map(i64::to_string)));
        }
        line += &format!("\"logits\":[{}]}}", list(&mut logits.iter().map(f32::to_string)));
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{line}");
        }
    }

    /// Appends the run's span to `FAKE_RKNN_SPANS`, if set: while it held its cores (best effort).
    fn span(&self, start: Duration, end: Duration) {
        if let Some(path) = &self.knobs.spans
            && let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path)
        {
            let _ = writeln!(f, "mask={:#x} start_us={} end_us={}", self.core_mask, start.as_micros(), end.as_micros());
        }
    }

    /// Appends a line to `FAKE_RKNN_TRACE`, if set (best effort).
    pub fn trace(&self, line: &str) {
        if let Some(path) = &self.knobs.trace
            && let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }

    /// The unpadded row behind the padded tensors, if they are well-formed.
    fn recover_row(&self, inputs: &[Vec<i64>; 5]) -> Option<Row> {
        let [ids, mask, pos, pmask, qtype] = inputs;
        let len = prefix_len(mask)?;
        let k = prefix_len(pmask)?;
        if len == 0 {
            return None;
        }
        let input_ids = ids[..len].iter().map(|&t| u32::try_from(t).ok()).collect::<Option<Vec<u32>>>()?;
        let marker_pos = pos[..k]
            .iter()
            .map(|&p| u32::try_from(p).ok().filter(|&p| (p as usize) < len))
            .collect::<Option<Vec<u32>>>()?;
        let qtype = match qtype[0] {
            0 => QType::Choice,
            1 => QType::Score,
            2 => QType::Noul,
            _ => return None,
        };
        Some(Row { input_ids, marker_pos, qtype, layout: None })
    }
}

/// The length of a mask of the form `1..1 0..0`; `None` for any other mask.
fn prefix_len(mask: &[i64]) -> Option<usize> {
    let n = mask.iter().take_while(|&&m| m == 1).count();
    mask[n..].iter().all(|&m| m == 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::prefix_len;

    #[test]
    fn only_ones_then_zeros_is_a_mask() {
        assert_eq!(prefix_len(&[1, 1, 0]), Some(2));
        assert_eq!(prefix_len(&[0, 0]), Some(0));
        assert_eq!(prefix_len(&[1, 0, 1]), None);
        assert_eq!(prefix_len(&[2]), None);
    }
}
