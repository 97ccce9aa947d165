//! The CPU reference model against laya 0.3.20's PyTorch forward on the fixture checkpoints:
//! raw logits and act probabilities within 1e-3, and so the same answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::support::{bundle, cases, f32s, laya_limits, model_dir};
use candle_core::{Device, Tensor};
use laya_edge::backend::cpu::encoder::{Packed, Positions};
use laya_edge::backend::cpu::{CpuModel, ModelError, masks};
use laya_edge::decide;
use laya_edge::prompt::{self, Row};
use laya_topics::Request;

fn model(name: &str) -> Arc<CpuModel> {
    static MODELS: OnceLock<Mutex<HashMap<String, Arc<CpuModel>>>> = OnceLock::new();
    let mut map = MODELS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    map.entry(name.to_owned())
        .or_insert_with(|| {
            Arc::new(CpuModel::load(&model_dir(name), &bundle(name).config).unwrap_or_else(|e| panic!("{name}: {e}")))
        })
        .clone()
}

#[test]
fn logits_and_act_probabilities_match_pytorch_within_a_thousandth() {
    let mut rows_compared = 0;
    let mut worst = 0.0f32;
    for case in cases() {
        if case.field("result").get("error").is_some() {
            continue;
        }
        let b = bundle(&case.model);
        let request = Request::from_value(case.field("request").clone()).unwrap();
        let prepared = prompt::prepare(&b.tokenizer, &request, laya_limits(&request, &b)).unwrap();
        let valid: Vec<(&str, &Row)> =
            prepared.iter().filter_map(|p| p.outcome.as_ref().ok().map(|(_, r)| (p.qid.as_str(), r))).collect();
        if valid.is_empty() {
            continue;
        }
        let rows: Vec<&Row> = valid.iter().map(|(_, r)| *r).collect();
        let out = model(&case.model).forward(&rows).unwrap_or_else(|e| panic!("{}: {e}", case.id));
        let forward = case.field("forward");
        for ((qid, _), o) in valid.iter().zip(&out) {
            let want = forward.get(qid).unwrap();
            let logits = f32s(want.get("logits").unwrap());
            let act = f32s(want.get("act_probs").unwrap());
            let ours_act = decide::act_probabilities(&o.act_logits);
            assert_eq!(o.logits.len(), logits.len(), "{} {qid}", case.id);
            for (a, b) in o.logits.iter().zip(&logits).chain(ours_act.iter().zip(&act)) {
                worst = worst.max((a - b).abs());
                assert!(
                    (a - b).abs() <= 1e-3,
                    "{} {qid}: ours {:?} / {:?}, laya {logits:?} / {act:?}",
                    case.id,
                    o.logits,
                    ours_act
                );
            }
            rows_compared += 1;
        }
    }
    assert!(rows_compared >= 500, "only {rows_compared} rows");
    eprintln!("largest difference from PyTorch: {worst:e}");
}

#[test]
fn a_checkpoint_with_a_wrong_tensor_is_refused_naming_it() {
    let dir = std::env::temp_dir().join(format!("laya-edge-bad-ckpt-{}", std::process::id()));
    let src = model_dir("bpe-small");
    copy_dir(&src, &dir);
    // Claim a different vocabulary: every tensor shaped by it no longer matches.
    let cfg = dir.join("encoder/config.json");
    let text = std::fs::read_to_string(&cfg).unwrap().replace("\"vocab_size\": 1100", "\"vocab_size\": 1200");
    std::fs::write(&cfg, text).unwrap();
    let err = CpuModel::load(&dir, &bundle("bpe-small").config).err().expect("refused");
    let msg = err.to_string();
    assert!(matches!(err, ModelError::Weights { .. }), "{msg}");
    assert!(msg.contains("encoder.embeddings.tok_embeddings.weight"), "{msg}");
    std::fs::remove_dir_all(&dir).ok();
}

fn copy_dir(src: &std::path::Path, dst: &std::path::Path) {
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

#[test]
fn predict_on_the_cpu_gives_lavas_answers_and_usage() {
    use laya_edge::backend::cpu::CpuBackend;
    use laya_edge::pipeline;
    let mut backends: HashMap<String, CpuBackend> = HashMap::new();
    let mut compared = 0;
    for case in cases() {
        let laya = case.field("result");
        if laya.get("error").is_some() {
            continue;
        }
        let b = bundle(&case.model);
        let backend = backends
            .entry(case.model.clone())
            .or_insert_with(|| CpuBackend::load(&model_dir(&case.model), &b.config).unwrap());
        let request = Request::from_value(case.field("request").clone()).unwrap();
        if pipeline::limits_for(&request, b.capacity.limits) != laya_limits(&request, &b) {
            // It asks more than the model's budget: laya-edge answers it at the model's own
            // (request_limits.rs), laya at the request's.
            continue;
        }
        let ours = pipeline::answer(&b, backend, &request).unwrap_or_else(|e| panic!("{}: {e}", case.id)).to_value();
        let laya_answers = laya.get("answers").and_then(|a| a.as_object()).unwrap();
        let ours_answers = ours.get("answers").and_then(|a| a.as_object()).unwrap();
        for (qid, a) in ours_answers {
            match laya_answers.get(qid) {
                Some(want) => test_kit::assert_like_laya(&case.id, qid, a, want, 1e-3),
                // laya answered only the valid questions; the fixture's check/layout has the error.
                None => assert!(a.get("error").is_some(), "{} {qid}: laya had no answer", case.id),
            }
        }
        assert_eq!(ours.get("usage"), laya.get("usage"), "{}", case.id);
        compared += 1;
    }
    assert!(compared >= 400);
}

/// Rows of these lengths (blocks of queries: one partial, exactly one, one and a bit, several),
/// token ids spread over the vocabulary.
fn rows_of(lengths: &[usize], vocab: usize) -> Vec<Vec<u32>> {
    lengths
        .iter()
        .enumerate()
        .map(|(r, &len)| (0..len).map(|i| ((i * 31 + r * 17 + 5) % vocab) as u32).collect())
        .collect()
}

/// The largest difference of the packed output's rows from the padded output's real tokens.
fn packed_vs_padded(packed: &Tensor, padded: &Tensor, rows: &[std::ops::Range<usize>]) -> f32 {
    let mut worst = 0f32;
    for (r, span) in rows.iter().enumerate() {
        let a = packed.narrow(0, span.start, span.len()).unwrap();
        let b = padded.get(r).unwrap().narrow(0, 0, span.len()).unwrap();
        let d: f32 = (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap();
        worst = worst.max(d);
    }
    worst
}

/// `[B, L]` ids padded with 0, the packed `[T]` ids and each row's span.
fn batch(rows: &[Vec<u32>]) -> (Tensor, Tensor, Vec<std::ops::Range<usize>>) {
    let l = rows.iter().map(Vec::len).max().unwrap();
    let mut padded = vec![0u32; rows.len() * l];
    let (mut packed, mut spans) = (Vec::new(), Vec::new());
    for (r, row) in rows.iter().enumerate() {
        padded[r * l..r * l + row.len()].copy_from_slice(row);
        spans.push(packed.len()..packed.len() + row.len());
        packed.extend_from_slice(row);
    }
    let t = packed.len();
    (
        Tensor::from_vec(padded, (rows.len(), l), &Device::Cpu).unwrap(),
        Tensor::from_vec(packed, (1, t), &Device::Cpu).unwrap(),
        spans,
    )
}

#[test]
fn the_packed_encoder_gives_each_row_what_the_padded_encoder_with_bias_matrices_gives_it() {
    // The padded computation is the NPU graph's (candle's matmuls, `[B, 1, L, L]` biases); the
    // packed one runs a row's own tokens, its sliding layers only over the window's blocks.
    let lengths = [1, 9, 64, 65, 200, 130];
    for name in ["bpe-small", "bpe-t5", "wp-t4"] {
        let m = model(name);
        let enc = &m.encoder;
        let (padded_ids, packed_ids, spans) = batch(&rows_of(&lengths, enc.config.vocab_size));
        let l = lengths.iter().copied().max().unwrap();
        let bias = |w| {
            Tensor::from_vec(masks::attention_biases(&lengths, l, w), (lengths.len(), 1, l, l), &Device::Cpu).unwrap()
        };
        let want = enc
            .encode(&enc.embed(&padded_ids).unwrap(), &bias(None), &bias(Some(enc.config.sliding_window())))
            .unwrap();
        let positions: Vec<u32> = lengths.iter().flat_map(|&n| 0..n as u32).collect();
        let packed = Packed { rows: &spans, positions: &positions, layout: None };
        let got = enc.encode_packed(enc.embed(&packed_ids).unwrap().squeeze(0).unwrap(), &packed, &mut |_| {}).unwrap();
        let worst = packed_vs_padded(&got, &want, &spans);
        assert!(worst < 1e-5, "{name}: the packed encoder differs by {worst:e}");
    }
}

#[test]
fn the_packed_encoder_keeps_a_parallel_layouts_options_apart_as_the_bias_matrices_do() {
    // Rows of shared tokens then options side by side at the same positions: 3 options of 40
    // tokens after 30 shared ones (a block of queries spans two options), and a row without options.
    let layout = |shared: u32, options: u32, each: u32| -> Vec<(u32, u32)> {
        let mut t: Vec<(u32, u32)> = (0..shared).map(|p| (p, 0)).collect();
        for o in 1..=options {
            t.extend((0..each).map(|i| (shared + i, o)));
        }
        t
    };
    let layouts = [layout(30, 3, 40), layout(70, 0, 0), layout(5, 2, 61)];
    let lengths: Vec<usize> = layouts.iter().map(Vec::len).collect();
    for name in ["bpe-t5", "wp-t4"] {
        let m = model(name);
        let enc = &m.encoder;
        let (padded_ids, packed_ids, spans) = batch(&rows_of(&lengths, enc.config.vocab_size));
        let l = lengths.iter().copied().max().unwrap();
        let split: Vec<(Vec<u32>, Vec<u32>)> = layouts.iter().map(|t| t.iter().copied().unzip()).collect();
        let views: Vec<masks::LaidOut<'_>> =
            split.iter().map(|(p, o)| masks::LaidOut { position_ids: p, option_ids: o }).collect();
        let bias = |w| {
            Tensor::from_vec(masks::parallel_attention_biases(&views, l, w), (lengths.len(), 1, l, l), &Device::Cpu)
                .unwrap()
        };
        let mut padded_positions = vec![0u32; lengths.len() * l];
        for (r, (p, _)) in split.iter().enumerate() {
            padded_positions[r * l..r * l + p.len()].copy_from_slice(p);
        }
        let embeds = enc.embed(&padded_ids).unwrap();
        let window = Some(enc.config.sliding_window());
        let want = enc
            .encode_at(&embeds, &bias(None), &bias(window), Positions::PerRow(&padded_positions), &mut |_| {})
            .unwrap();
        let tokens: Vec<(u32, u32)> = layouts.concat();
        let positions: Vec<u32> = tokens.iter().map(|t| t.0).collect();
        let packed = Packed { rows: &spans, positions: &positions, layout: Some(&tokens) };
        let got = enc.encode_packed(enc.embed(&packed_ids).unwrap().squeeze(0).unwrap(), &packed, &mut |_| {}).unwrap();
        let worst = packed_vs_padded(&got, &want, &spans);
        assert!(worst < 1e-5, "{name}: the packed encoder differs by {worst:e}");
    }
}
