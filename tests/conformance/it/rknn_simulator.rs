//! The fake librknnrt (`tests/fake-rknn`) against Rockchip's own toolchain.
//!
//! `tests/fixtures/rknn/demo` holds the demo model (`models/demo`) exported by `tools/rknn` with
//! the RK3588 card's graph interface, built by RKNN-Toolkit2 2.3.2 (rk3588, fp16) into
//! `demo.rknn`, and `demo.sim.json`: 12 probe rows laid out by laya 0.3.20's own
//! `Agent._encode_state` from held-out requests and 2 synthetic edge rows (all 512 tokens with all
//! 64 options; 3 tokens with one option), the five padded tensors they were given to Rockchip's x86 simulator, the
//! simulator's 64 logits, and laya's own float logits. Here the same rows go through the
//! production RKNN backend onto the fake runtime, which records (`FAKE_RKNN_DUMP`) the tensors it
//! received and the 64 logits it returned, and both are held against the simulator's:
//!
//! - the backend pads exactly as the simulator's inputs were padded (the same 1x512 and 1x64
//!   int64 tensors, element for element);
//! - every slot past the real options is -10000 in the fake as in the simulator (exactly);
//! - the real options' logits agree within the fp16 tolerance ([`fp16_tolerance`]).
//!
//! So the fake's semantics are grounded on Rockchip's toolchain, not on our reading of the card.
//! A second test starts from the held-out requests themselves: laya-edge's own layout gives the
//! rows laya laid out for the simulator, and the whole agent path answers them like it.

use std::path::{Path, PathBuf};

use crate::support::{f32s, ints, json_str, read_json, test_path};
use laya_edge::backend::Backend;
use laya_edge::backend::npu::rknn::{RknnBackend, RknnConfig, RknnGraph};
use laya_edge::bundle::HostBundle;
use laya_edge::pipeline;
use laya_edge::prompt::{QType, Row};
use laya_topics::{Request, Value};

const CHILD: &str = "LAYA_RKNN_SIM_TEST_CHILD";
const FAKE_LIB: &str = "LAYA_RKNN_SIM_TEST_FAKE_LIB";
const DUMP: &str = "LAYA_RKNN_SIM_TEST_DUMP";

/// How far the fake's option logits may be from the simulator's, for a row of `tokens` tokens.
/// The fake computes in float32 (it is laya's float model: within 1e-3 of laya's PyTorch logits,
/// checked below); the .rknn runs weights and activations in float16 (11 significant bits), and
/// its error is absolute, growing with the keys each attention sums over: on the 12 real rows
/// (33-183 tokens) the simulator was at most 0.025 from PyTorch, on the synthetic row that fills
/// all 512 positions 0.10 (`summary` and rows in demo.sim.json). So: 0.05 up to 256 tokens (every
/// row the demo model's `max_len` lets the agent send), twice the worst measured, and 0.15 beyond,
/// 1.5 times the full row's. Both stay below what a masking error does: a fake that ignores the
/// attention mask (runs the padding as tokens) is 0.19 off on the first real row; a wrong qtype
/// is 17 off.
fn fp16_tolerance(tokens: usize) -> f32 {
    if tokens <= 256 { 0.05 } else { 0.15 }
}

/// What the graph writes into the slots past the real options (model card; laya's masked_fill).
const MISSING: f32 = -10000.0;

fn fixture(name: &str) -> PathBuf {
    test_kit::workspace().join("tests/fixtures").join("rknn").join("demo").join(name)
}

fn demo_dir() -> PathBuf {
    test_kit::workspace().join("models").join("demo")
}

fn fake_library() -> &'static Path {
    crate::support::cached_fake_library(FAKE_LIB, "fake-rknn", "fake_rknn")
}

/// A fake graph file for the demo checkpoint with the shape the real .rknn's sidecar declares.
fn fake_graph(seq_len: usize, marker_slots: usize) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("rknn-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("demo.fake.rknn");
    let ckpt = std::path::absolute(demo_dir()).unwrap();
    let text = format!(
        r#"{{"fake_rknn_graph": 1, "checkpoint": {}, "seq_len": {seq_len}, "marker_slots": {marker_slots}}}"#,
        json_str(&ckpt.to_string_lossy())
    );
    std::fs::write(&file, text).unwrap();
    file
}

fn usize_of(v: &Value, key: &str) -> usize {
    v.get(key).and_then(Value::as_i64).unwrap_or_else(|| panic!("no integer {key:?}")) as usize
}

/// One probe row of demo.sim.json: the unpadded row (the first `tokens` ids, the first `options`
/// markers), the simulator's padded inputs and its logits, and laya's float logits.
struct SimRow {
    /// Not from a request: the rows rknn_rows.py --edge-rows adds (all 512 tokens and 64 options;
    /// one option), which no request of the demo model reaches.
    synthetic: bool,
    request: String,
    qid: String,
    name: String,
    row: Row,
    inputs: Vec<(&'static str, Vec<i64>)>,
    simulator: Vec<f32>,
    torch: Vec<f32>,
}

const INPUTS: [&str; 5] = ["input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype"];

fn sim_rows() -> Vec<SimRow> {
    let doc = read_json(&fixture("demo.sim.json"));
    let rows = doc.get("rows").and_then(Value::as_array).expect("rows");
    rows.iter()
        .map(|r| {
            let input = r.get("inputs").expect("inputs");
            let inputs: Vec<_> = INPUTS.iter().map(|&n| (n, ints(input.get(n).expect(n)))).collect();
            let (n, k) = (usize_of(r, "tokens"), usize_of(r, "options"));
            let qtype = match inputs[4].1[0] {
                0 => QType::Choice,
                1 => QType::Score,
                2 => QType::Noul,
                q => panic!("qtype {q}"),
            };
            let row = Row {
                input_ids: inputs[0].1[..n].iter().map(|&t| t as u32).collect(),
                marker_pos: inputs[2].1[..k].iter().map(|&p| p as u32).collect(),
                qtype,
                layout: None,
            };
            let request = r.get("request").and_then(Value::as_str).unwrap().to_owned();
            let qid = r.get("qid").and_then(Value::as_str).unwrap().to_owned();
            let name = format!("{request}:{qid}");
            let simulator = f32s(r.get("simulator_logits").expect("simulator_logits"));
            let torch = f32s(r.get("torch_logits").expect("torch_logits"));
            let synthetic = r.get("synthetic").is_some_and(|v| *v == Value::Bool(true));
            SimRow { synthetic, request, qid, name, row, inputs, simulator, torch }
        })
        .collect()
}

#[test]
fn the_fake_runtime_answers_the_probe_rows_like_rockchips_simulator() {
    let dump = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("rknn-sim-dump-{}.jsonl", std::process::id()));
    if std::env::var_os(CHILD).is_none() {
        let _ = std::fs::remove_file(&dump);
    }
    let test = "the_fake_runtime_answers_the_probe_rows_like_rockchips_simulator";
    let dump_env = dump.to_str().unwrap().to_owned();
    crate::support::in_child(
        CHILD,
        FAKE_LIB,
        fake_library(),
        &test_path(module_path!(), test),
        &[("FAKE_RKNN_DUMP", &dump_env), (DUMP, &dump_env)],
        || {
            let dump = PathBuf::from(std::env::var(DUMP).unwrap());
            let sidecar = read_json(&fixture("demo.json"));
            let (seq_len, slots) = (usize_of(&sidecar, "seq_len"), usize_of(&sidecar, "marker_slots"));
            assert_eq!((seq_len, slots), (512, 64), "the card's shape");
            let bundle = HostBundle::load(&demo_dir()).unwrap();
            let pad_id = bundle.tokenizer.pad.id;
            assert_eq!(usize_of(&sidecar, "pad_token_id"), pad_id as usize, "the export's pad id is the tokenizer's");
            let graph = RknnGraph { file: fake_graph(seq_len, slots), seq_len, marker_slots: slots };
            let mut backend = RknnBackend::load(&[graph], &RknnConfig::new(fake_library()), pad_id).unwrap();

            let rows = sim_rows();
            let qtypes: std::collections::BTreeSet<usize> = rows.iter().map(|r| r.row.qtype.index()).collect();
            assert!(rows.len() >= 8 && qtypes.len() == 3, "{} rows, qtypes {qtypes:?}", rows.len());
            let mut answers = Vec::new();
            for r in &rows {
                answers.push(backend.run(&[&r.row]).unwrap_or_else(|e| panic!("{}: {e}", r.name)).remove(0).logits);
            }

            let text = std::fs::read_to_string(&dump).unwrap();
            let runs: Vec<Value> =
                text.lines().map(|l| laya_topics::json::parse_str(l, Default::default()).unwrap()).collect();
            assert_eq!(runs.len(), rows.len(), "one run per row");
            let (mut worst_sim, mut worst_torch) = (0.0f32, 0.0f32);
            for ((r, run), answer) in rows.iter().zip(&runs).zip(&answers) {
                let k = r.row.marker_pos.len();
                // Padding: the tensors the backend set are the ones the simulator was given.
                for (name, want) in &r.inputs {
                    let got = ints(run.get(name).unwrap());
                    assert_eq!(got.len(), want.len(), "{} {name}: length", r.name);
                    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
                        panic!("{} {name}[{i}]: the backend set {}, the simulator got {}", r.name, got[i], want[i]);
                    }
                }
                // Slot filling: all 64 logits, -10000 past the options exactly as in the simulator.
                let fake = f32s(run.get("logits").unwrap());
                assert_eq!((fake.len(), r.simulator.len()), (slots, slots), "{}", r.name);
                for (j, (f, s)) in fake.iter().zip(&r.simulator).enumerate().skip(k) {
                    assert_eq!(*s, MISSING, "{} slot {j}: the simulator's fill", r.name);
                    assert_eq!(f, s, "{} slot {j}: fake vs simulator past the options", r.name);
                }
                // Values: the options within the fp16 tolerance; the backend hands out exactly those.
                let tol = fp16_tolerance(r.row.input_ids.len());
                assert_eq!(answer.as_slice(), &fake[..k], "{}: the backend's answer is the runtime's logits", r.name);
                for (j, ((f, s), t)) in fake.iter().zip(&r.simulator).zip(&r.torch).take(k).enumerate() {
                    let d = (f - s).abs();
                    assert!(d <= tol, "{} option {j}: fake {f} vs simulator {s} (|d| = {d} > {tol})", r.name);
                    worst_sim = worst_sim.max(d);
                    worst_torch = worst_torch.max((f - t).abs());
                }
                // The chosen option, wherever the simulator's top two are further apart than the tolerance.
                let mut order: Vec<usize> = (0..k).collect();
                order.sort_by(|&a, &b| r.simulator[b].total_cmp(&r.simulator[a]));
                if k < 2 || r.simulator[order[0]] - r.simulator[order[1]] > 2.0 * tol {
                    let best = (0..k).max_by(|&a, &b| fake[a].total_cmp(&fake[b])).unwrap();
                    assert_eq!(best, order[0], "{}: the chosen option", r.name);
                }
            }
            // The fake is laya's float model: the fp16 deviation above is the simulator's, not ours.
            assert!(worst_torch <= 1e-3, "largest |fake - laya's PyTorch| = {worst_torch}");
            eprintln!(
                "{} rows: largest |fake - simulator| = {worst_sim}, |fake - laya PyTorch| = {worst_torch:e}",
                rows.len()
            );
        },
    );
    if std::env::var_os(CHILD).is_none() {
        std::fs::remove_file(&dump).ok();
    }
}

/// The held-out request `id` of tests/fixtures/demo/heldout.jsonl.
fn heldout_request(id: &str) -> Request {
    let path = test_kit::workspace().join("tests/fixtures").join("demo").join("heldout.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .map(|l| laya_topics::json::parse_str(l, Default::default()).unwrap())
        .map(|v| v.get("request").cloned().unwrap_or(v))
        .find(|r| r.get("id").and_then(Value::as_str) == Some(id))
        .map(|r| Request::from_value(r).unwrap())
        .unwrap_or_else(|| panic!("no held-out request {id}"))
}

#[test]
fn the_agents_own_layout_of_the_held_out_requests_reaches_the_simulators_answers() {
    let sidecar = read_json(&fixture("demo.json"));
    let (seq_len, slots) = (usize_of(&sidecar, "seq_len"), usize_of(&sidecar, "marker_slots"));
    let bundle = HostBundle::load(&demo_dir()).unwrap();
    let graph = RknnGraph { file: fake_graph(seq_len, slots), seq_len, marker_slots: slots };
    let mut backend = RknnBackend::load(&[graph], &RknnConfig::new(fake_library()), bundle.tokenizer.pad.id).unwrap();
    let max_tokens = laya_edge::config::Limits::default().max_request_tokens;
    let rows = sim_rows();
    let real: Vec<&SimRow> = rows.iter().filter(|r| !r.synthetic).collect();
    assert!(real.len() >= 8, "{} rows from requests", real.len());
    for r in real {
        // laya-edge's layout of the request gives the row laya's Agent._encode_state gave.
        let prepared = pipeline::prepare(&bundle, &heldout_request(&r.request), max_tokens).unwrap();
        let ours = prepared
            .questions
            .iter()
            .find(|p| p.qid == r.qid)
            .unwrap_or_else(|| panic!("{}: no such question", r.name));
        let (_, row) = ours.outcome.as_ref().unwrap_or_else(|e| panic!("{}: {e}", r.name));
        assert_eq!(row, &r.row, "{}: laya-edge's row vs laya's", r.name);
        // And the backend answers it like the simulator.
        let logits = backend.run(&[row]).unwrap().remove(0).logits;
        assert_eq!(logits.len(), r.row.marker_pos.len(), "{}", r.name);
        for (j, (f, s)) in logits.iter().zip(&r.simulator).enumerate() {
            let tol = fp16_tolerance(row.input_ids.len());
            assert!((f - s).abs() <= tol, "{} option {j}: fake {f} vs simulator {s}", r.name);
        }
    }
}
