//! The CPU reference model against laya 0.3.20's PyTorch forward on the fixture checkpoints:
//! raw logits and act probabilities within 1e-3, and so the same answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::support::{bundle, cases, f32s, laya_limits, model_dir};
use laya_edge::backend::cpu::{CpuModel, ModelError};
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
        let out = model(&case.model).forward(&rows, b.tokenizer.pad.id).unwrap_or_else(|e| panic!("{}: {e}", case.id));
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
            .or_insert_with(|| CpuBackend::load(&model_dir(&case.model), &b.config, b.tokenizer.pad.id).unwrap());
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
