//! The CPU model on a checkpoint with laya 0.4.15's parallel option layout (`option_layout:
//! "parallel"`) against laya 0.4.15's own forward (transformers 5.17.0):
//! `tests/fixtures/laya-0.4.15-parallel-probe.json`, recorded by
//! `tools/fixtures/parallel_probe.py` on bpe-t5 with the key added to its config. Raw logits within
//! 1e-4; reordering a parallel row's options only permutes its logits, a sequential row's not; a
//! sequential row batched with parallel ones keeps its outputs to the bit.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::support::{bundle, f32s, ints, model_dir, read_json};
use laya_edge::backend::cpu::CpuModel;
use laya_edge::bundle::HostBundle;
use laya_edge::prompt::parallel::{ParallelLayout, row_layout};
use laya_edge::prompt::{self, QType, Row};
use laya_topics::{Request, Value};

/// The recorded forward passes, one per `Agent.predict` call.
struct Call {
    name: String,
    request: Value,
    rows: Vec<Recorded>,
}

struct Recorded {
    qid: String,
    row: Row,
    logits: Vec<f32>,
    act_logits: Vec<f32>,
}

fn u32s(v: &Value) -> Vec<u32> {
    ints(v).into_iter().map(|i| u32::try_from(i).expect("a u32")).collect()
}

fn probe() -> &'static [Call] {
    static CALLS: OnceLock<Vec<Call>> = OnceLock::new();
    CALLS.get_or_init(|| {
        let path = test_kit::workspace().join("tests/fixtures/laya-0.4.15-parallel-probe.json");
        let probe = read_json(&path);
        assert_eq!(probe.get("laya").and_then(Value::as_str), Some("0.4.15"));
        assert_eq!(probe.get("transformers").and_then(Value::as_str), Some("5.17.0"));
        let calls = probe.get("calls").and_then(Value::as_array).expect("calls");
        calls
            .iter()
            .map(|c| {
                let rows = c.get("rows").and_then(Value::as_array).expect("rows");
                let rows = rows
                    .iter()
                    .map(|r| {
                        let field = |k: &str| r.get(k).unwrap_or_else(|| panic!("no {k}"));
                        let qtype = match field("qtype").as_i64() {
                            Some(0) => QType::Choice,
                            Some(1) => QType::Score,
                            Some(2) => QType::Noul,
                            other => panic!("qtype {other:?}"),
                        };
                        let row = Row {
                            input_ids: u32s(field("input_ids")),
                            marker_pos: u32s(field("marker_pos")),
                            qtype,
                            layout: Some(ParallelLayout {
                                position_ids: u32s(field("position_ids")),
                                option_ids: u32s(field("option_ids")),
                            }),
                        };
                        Recorded {
                            qid: field("qid").as_str().expect("qid").to_owned(),
                            row,
                            logits: f32s(field("logits")),
                            act_logits: f32s(field("act_logits")),
                        }
                    })
                    .collect();
                Call {
                    name: c.get("name").and_then(Value::as_str).expect("name").to_owned(),
                    request: c.get("request").expect("request").clone(),
                    rows,
                }
            })
            .collect()
    })
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let to = dst.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), to).unwrap();
        }
    }
}

/// bpe-t5 with `"option_layout": "parallel"` in its rl_agent_config.json, as the probe made it.
/// `tag` keeps the copies of tests running at once apart.
fn parallel_checkpoint(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("laya-edge-parallel-bpe-t5-{tag}-{}", std::process::id()));
    copy_dir(&model_dir("bpe-t5"), &dir);
    let cfg = dir.join("rl_agent_config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let (open, rest) = text.split_once('{').expect("a JSON object");
    std::fs::write(&cfg, format!("{open}{{\n  \"option_layout\": \"parallel\",{rest}")).unwrap();
    dir
}

struct Loaded {
    bundle: Arc<HostBundle>,
    model: CpuModel,
}

/// The CPU model loaded from the parallel copy (its encoder config and weights), with the agent
/// config and tokenizer of bpe-t5 itself: they are the copy's but for `option_layout`, which
/// `bundle::AgentConfig::load` refuses (`"parallel"` is not yet accepted there; the CPU model
/// does not read the key: a row's layout says how to run it).
fn loaded() -> &'static Loaded {
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    LOADED.get_or_init(|| {
        let dir = &parallel_checkpoint("model");
        let bundle = bundle("bpe-t5");
        let model = CpuModel::load(dir, &bundle.config).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        // Everything is in memory now (the weights are read into buffers of their own).
        std::fs::remove_dir_all(dir).ok();
        Loaded { bundle, model }
    })
}

fn forward(rows: &[&Row]) -> Vec<laya_edge::backend::cpu::HeadOutput> {
    let l = loaded();
    l.model.forward(rows).unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn sequential(row: &Row) -> Row {
    Row { layout: None, ..row.clone() }
}

#[test]
fn the_probe_covers_what_the_parallel_layout_changes() {
    let calls = probe();
    let rows: Vec<&Recorded> = calls.iter().flat_map(|c| &c.rows).collect();
    assert!(rows.len() >= 8, "{} rows", rows.len());
    let window = 8; // bpe-t5: local_attention 16 (the probe records laya's sliding_window: 8)
    assert!(rows.iter().all(|r| r.row.input_ids.len() > 4 * window), "every state is longer than the window");
    assert!(calls.iter().any(|c| c.rows.len() >= 3), "a batch of several rows");
    let uneven = rows.iter().any(|r| {
        let o = &r.row.layout.as_ref().unwrap().option_ids;
        let span = |s: u32| o.iter().filter(|&&x| x == s).count();
        let spans: Vec<usize> = (1..=r.row.marker_pos.len() as u32).map(span).collect();
        spans.len() >= 3 && spans.iter().min() != spans.iter().max()
    });
    assert!(uneven, "a row whose options have different lengths");
}

#[test]
fn our_layout_of_the_probes_requests_is_laya_0415s() {
    let l = loaded();
    for call in probe() {
        let request = Request::from_value(call.request.clone()).unwrap();
        let limits = prompt::Limits {
            max_len: request.max_len.unwrap_or(l.bundle.config.limits.max_len),
            head_max_len: request.head_max_len.unwrap_or(l.bundle.config.limits.head_max_len),
        };
        let prepared = prompt::prepare(&l.bundle.tokenizer, &request, limits).unwrap();
        assert_eq!(prepared.len(), call.rows.len(), "{}", call.name);
        for (p, want) in prepared.iter().zip(&call.rows) {
            assert_eq!(p.qid, want.qid);
            let (_, row) = p.outcome.as_ref().unwrap_or_else(|e| panic!("{} {}: {e:?}", call.name, p.qid));
            assert_eq!(row.input_ids, want.row.input_ids, "{} {}", call.name, p.qid);
            assert_eq!(row.marker_pos, want.row.marker_pos, "{} {}", call.name, p.qid);
            // head_len: one past the [SEP] that closes the options (no option of the probe holds
            // a [SEP] of its own), as build_row knows it.
            let last = *row.marker_pos.last().unwrap() as usize;
            let sep = l.bundle.tokenizer.sep.id;
            let head_len = last + row.input_ids[last..].iter().position(|&t| t == sep).unwrap() + 1;
            let laid_out = row_layout(&row.marker_pos, head_len, row.input_ids.len());
            assert_eq!(Some(laid_out), want.row.layout, "{} {}", call.name, p.qid);
        }
    }
}

#[test]
fn logits_on_a_parallel_checkpoint_match_laya_0415_within_a_ten_thousandth() {
    let mut worst = 0.0f32;
    let mut compared = 0;
    for call in probe() {
        // As laya ran them: the request's rows in one batch, padded to the longest.
        let rows: Vec<&Row> = call.rows.iter().map(|r| &r.row).collect();
        let out = forward(&rows);
        for (want, got) in call.rows.iter().zip(&out) {
            let d = max_abs_diff(&got.logits, &want.logits).max(max_abs_diff(&got.act_logits, &want.act_logits));
            assert!(
                d <= 1e-4,
                "{} {}: ours {:?} / {:?}, laya {:?} / {:?}",
                call.name,
                want.qid,
                got.logits,
                got.act_logits,
                want.logits,
                want.act_logits
            );
            worst = worst.max(d);
            compared += 1;
        }
    }
    assert!(compared >= 8);
    eprintln!("{compared} parallel rows, largest difference from laya 0.4.15: {worst:e}");
}

/// The probe's one question asked twice, its options in laya's order and in the order
/// `[2, 0, 3, 1]` (slot s of the second holds option `order[s]` of the first).
fn reordered_pair() -> (&'static Row, &'static Row, [usize; 4]) {
    let calls = probe();
    let a = calls.iter().find(|c| c.name == "four options of different lengths over a long state").unwrap();
    let b = calls.iter().find(|c| c.name == "the same question with its options in another order").unwrap();
    (&a.rows[0].row, &b.rows[0].row, [2, 0, 3, 1])
}

#[test]
fn reordering_a_parallel_rows_options_only_permutes_its_logits() {
    let (a, b, order) = reordered_pair();
    assert_ne!(a.input_ids, b.input_ids);
    let (la, lb) = (&forward(&[a])[0].logits, &forward(&[b])[0].logits);
    let permuted: Vec<f32> = order.iter().map(|&i| la[i]).collect();
    let d = max_abs_diff(lb, &permuted);
    eprintln!("parallel: logits {la:?} reordered {lb:?}, largest difference from a permutation {d:e}");
    assert!(d <= 1e-4, "{la:?} permuted by {order:?} is not {lb:?}");
    // The act head reads the sorted probabilities and position 0, which see the options as a set.
    let (aa, ab) = (&forward(&[a])[0].act_logits, &forward(&[b])[0].act_logits);
    assert!(max_abs_diff(aa, ab) <= 1e-4, "{aa:?} vs {ab:?}");
}

#[test]
fn reordering_a_sequential_rows_options_does_more_than_permute_its_logits() {
    let (a, b, order) = reordered_pair();
    let (a, b) = (sequential(a), sequential(b));
    let (la, lb) = (&forward(&[&a])[0].logits, &forward(&[&b])[0].logits);
    let permuted: Vec<f32> = order.iter().map(|&i| la[i]).collect();
    let d = max_abs_diff(lb, &permuted);
    eprintln!("sequential: logits {la:?} reordered {lb:?}, largest difference from a permutation {d:e}");
    assert!(d > 1e-2, "the same rows without their layout should not permute: {la:?} / {lb:?}");
}

#[test]
fn a_sequential_row_batched_with_parallel_rows_keeps_its_outputs_to_the_bit() {
    let call = probe().iter().find(|c| c.rows.len() >= 3).unwrap();
    let parallel: Vec<&Row> = call.rows.iter().map(|r| &r.row).collect();
    let plain = sequential(parallel[1]);
    // The same shapes either way: the sequential row beside the parallel rows, and beside their
    // sequential copies.
    let copies: Vec<Row> = parallel.iter().map(|r| sequential(r)).collect();
    let mixed: Vec<&Row> = vec![parallel[0], &plain, parallel[2]];
    let alone: Vec<&Row> = vec![&copies[0], &plain, &copies[2]];
    let (m, s) = (forward(&mixed), forward(&alone));
    assert_eq!(m[1], s[1], "the sequential row changed in a mixed batch");
    // And the parallel rows of the mixed batch are laya's.
    for (got, want) in [(&m[0], &call.rows[0]), (&m[2], &call.rows[2])] {
        assert!(max_abs_diff(&got.logits, &want.logits) <= 1e-4, "{}: {:?} vs {:?}", want.qid, got.logits, want.logits);
    }
}

#[test]
fn a_layout_of_the_wrong_length_is_refused_as_the_rows_fault() {
    let mut row = probe()[0].rows[0].row.clone();
    if let Some(layout) = &mut row.layout {
        layout.option_ids.pop();
    }
    let l = loaded();
    let err = l.model.forward(&[&row]).expect_err("refused");
    assert!(err.is_input(), "{err}");
}

#[test]
fn a_worker_carries_the_layout_to_the_cpu_backend_and_answers_like_laya() {
    use laya_edge::backend::Backend;
    use laya_edge::backend::cpu::CpuBackend;
    use laya_edge::engine::protocol::{FromWorker, ToWorker, read_frame};
    let call = probe().iter().find(|c| c.rows.len() >= 3).unwrap();
    let rows: Vec<Row> = call.rows.iter().map(|r| r.row.clone()).collect();
    let mut input = ToWorker::Run { call: 1, rows }.encode();
    input.extend(ToWorker::Shutdown.encode());
    let dir = parallel_checkpoint("worker");
    let b = bundle("bpe-t5");
    let load = || -> Result<Box<dyn Backend>, laya_edge::backend::LoadError> {
        let backend = CpuBackend::load(&dir, &b.config).map_err(|e| e.to_string())?;
        Ok(Box::new(backend))
    };
    let mut out = Vec::new();
    laya_edge::engine::worker::serve(load, input.as_slice(), &mut out).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let mut bytes = out.as_slice();
    let mut done = None;
    while let Some(payload) = read_frame(&mut bytes).unwrap() {
        if let FromWorker::Done { rows, .. } = FromWorker::decode(&payload).unwrap() {
            done = Some(rows);
        }
    }
    let got = done.expect("a Done frame");
    for (got, want) in got.iter().zip(&call.rows) {
        let d = max_abs_diff(&got.logits, &want.logits).max(max_abs_diff(&got.act_logits, &want.act_logits));
        assert!(d <= 1e-4, "{}: {:?} vs {:?}", want.qid, got.logits, want.logits);
    }
}
