//! The host pipeline against laya 0.3.20 itself: every fixture request's validation, token
//! layout and decoded answers must be exactly what laya produced (tests/fixtures/laya-0.3.20).

use std::collections::HashMap;

use crate::support::{
    Case, assert_validation, assert_whole_request_refusal, bundle, cases, f32s, fixtures_dir, ints, laya_error,
    laya_limits, model_dir, read_json, text,
};
use laya_edge::bundle::HostBundle;
use laya_edge::decide::{self, RowOutput, answer::probabilities, numpy};
use laya_edge::prompt::{self, QuestionErrorKind};
use laya_topics::json::{self, ParseOptions, Style};
use laya_topics::{Request, Value, pyfloat};

fn request_of(case: &Case) -> Request {
    Request::from_value(case.field("request").clone()).unwrap_or_else(|e| panic!("{}: {e}", case.id))
}

fn prepared_of(case: &Case) -> Vec<prompt::Prepared> {
    let b = bundle(&case.model);
    let request = request_of(case);
    prompt::prepare(&b.tokenizer, &request, laya_limits(&request, &b)).unwrap_or_else(|e| panic!("{}: {e}", case.id))
}

#[test]
fn every_fixture_model_has_enough_cases() {
    for model in ["bpe-t5", "wp-t4", "bpe-small"] {
        let n = cases().iter().filter(|c| c.model == model).count();
        assert!(n >= 100, "{model} has only {n} cases");
    }
    assert!(cases().len() >= 200);
}

#[test]
fn question_validation_gives_lavas_verdicts_and_messages() {
    let checked: usize = cases().iter().map(|case| assert_validation(case, &prepared_of(case))).sum();
    assert!(checked >= 50, "only {checked} invalid questions in the fixtures");
}

#[test]
fn token_layout_is_identical_to_lavas_build_sequence() {
    // Own bundles, so the memo counts are this test's alone.
    let bundles: HashMap<&str, HostBundle> = ["bpe-t5", "wp-t4", "bpe-small"]
        .into_iter()
        .map(|m| (m, HostBundle::load(&model_dir(m)).unwrap_or_else(|e| panic!("{m}: {e}"))))
        .collect();
    let mut rows = 0;
    let mut after_first_pass = HashMap::new();
    // Twice: the second time every instruction and option comes from the tokenizer's memo.
    for pass in [1, 2] {
        for case in cases() {
            let b = &bundles[case.model.as_str()];
            let request = request_of(case);
            let prepared = prompt::prepare(&b.tokenizer, &request, laya_limits(&request, b))
                .unwrap_or_else(|e| panic!("{}: {e}", case.id));
            rows += check_layout(case, &prepared);
        }
        if pass == 1 {
            after_first_pass = bundles.iter().map(|(m, b)| (*m, b.tokenizer.memo_stats())).collect();
        }
    }
    assert!(rows >= 1000, "only {rows} rows compared");
    for (model, b) in &bundles {
        let (first, now) = (after_first_pass[model], b.tokenizer.memo_stats());
        // Each model's distinct texts fit in one memo generation, so none has aged out.
        assert!(first.misses > 0, "{model}: nothing went through the memo");
        assert_eq!(now.misses, first.misses, "{model}: the second pass tokenized again: {now:?}");
        assert!(now.hits >= first.hits + first.misses, "{model}: {first:?} -> {now:?}");
    }
}

/// Compares each question's row with laya's `build_sequence`; returns how many rows matched.
fn check_layout(case: &Case, prepared: &[prompt::Prepared]) -> usize {
    let mut rows = 0;
    let layout = case.field("layout").as_object().expect("layout is an object");
    for p in prepared {
        let Some(want) = layout.get(&p.qid) else {
            assert!(p.outcome.is_err(), "{} {}: laya rejected it before layout", case.id, p.qid);
            continue;
        };
        if let Some(err) = want.get("error") {
            let (kind, message) = laya_error(err);
            let got = p.outcome.as_ref().err().unwrap_or_else(|| panic!("{} {}: laya: {message}", case.id, p.qid));
            if kind == "ValueError" {
                assert_eq!(got.kind, QuestionErrorKind::DoesNotFit, "{} {}", case.id, p.qid);
                assert_eq!(got.message, message, "{} {}", case.id, p.qid);
            }
            continue;
        }
        let (_, row) = p.outcome.as_ref().unwrap_or_else(|e| panic!("{} {}: {e}", case.id, p.qid));
        let ids: Vec<i64> = row.input_ids.iter().map(|&i| i64::from(i)).collect();
        assert_eq!(ids, ints(want.get("input_ids").unwrap()), "{} {}: input_ids", case.id, p.qid);
        let markers: Vec<i64> = row.marker_pos.iter().map(|&i| i64::from(i)).collect();
        assert_eq!(markers, ints(want.get("marker_pos").unwrap()), "{} {}: marker_pos", case.id, p.qid);
        assert_eq!(Some(row.qtype.index() as i64), want.get("qtype").and_then(Value::as_i64));
        rows += 1;
    }
    rows
}

#[test]
fn decoding_lavas_logits_reproduces_lavas_answers_exactly() {
    let mut compared = 0;
    for case in cases() {
        let result = case.field("result");
        if result.get("error").is_some() {
            continue;
        }
        let prepared = prepared_of(case);
        let forward = case.field("forward");
        let outputs: Vec<RowOutput> = prepared
            .iter()
            .filter(|p| p.outcome.is_ok())
            .map(|p| {
                let f = forward.get(&p.qid).unwrap_or_else(|| panic!("{} {}: no forward record", case.id, p.qid));
                RowOutput { logits: f32s(f.get("logits").unwrap()), act_probs: f32s(f.get("act_probs").unwrap()) }
            })
            .collect();
        let b = bundle(&case.model);
        let request = request_of(case);
        let ours = decide::assemble(&prepared, &outputs, &b.config.temperatures, request.lang.as_deref())
            .unwrap_or_else(|e| panic!("{}: {e}", case.id));
        // laya answered the valid questions only; invalid ones carry our errors in their place.
        let mut ours = ours.to_value();
        if let Value::Object(m) = &mut ours
            && let Some(Value::Object(answers)) = m.get_mut("answers")
        {
            answers.retain(|_, a| a.get("error").is_none());
        }
        assert_eq!(text(&ours), text(result), "{}", case.id);
        compared += 1;
    }
    assert!(compared >= 400, "only {compared} results compared");
}

#[test]
fn a_whole_request_fails_where_laya_fails_with_the_same_first_message() {
    let verdicts: Vec<bool> =
        cases().iter().filter_map(|case| assert_whole_request_refusal(case, &prepared_of(case))).collect();
    let (failed, messages) = (verdicts.len(), verdicts.iter().filter(|v| **v).count());
    // The fixtures hold 153 requests laya refused as a whole, 142 of them with a ValueError.
    assert!(failed >= 150 && messages >= 140, "only {failed} failed requests, {messages} messages compared");
}

#[test]
fn the_act_softmax_matches_torch_within_a_millionth() {
    let mut rows = 0;
    for case in cases() {
        let Some(forward) = case.field("forward").as_object() else { continue };
        for (qid, f) in forward {
            let ours = decide::act_probabilities(&f32s(f.get("act_logits").unwrap()));
            let torch = f32s(f.get("act_probs").unwrap());
            assert_eq!(ours.len(), torch.len(), "{} {qid}", case.id);
            for (a, b) in ours.iter().zip(&torch) {
                assert!((a - b).abs() <= 1e-6, "{} {qid}: {ours:?} vs {torch:?}", case.id);
            }
            rows += 1;
        }
    }
    // 1157 forward rows in the fixtures.
    assert!(rows >= 1150, "only {rows} rows compared");
}

fn vectors(name: &str) -> Value {
    read_json(&fixtures_dir().join("vectors").join(name))
}

fn bits_f32(v: &Value) -> f32 {
    f32::from_bits(u32::try_from(v.as_i64().expect("bits")).expect("u32 bits"))
}

fn hex_f64(v: &Value) -> f64 {
    f64::from_bits(u64::from_str_radix(v.as_str().expect("hex"), 16).expect("hex bits"))
}

#[test]
fn exp_is_bit_identical_to_numpy_float32() {
    let v = vectors("numpy_exp_f32.json");
    let (xs, ys) = (v.get("x").unwrap().as_array().unwrap(), v.get("y").unwrap().as_array().unwrap());
    assert!(xs.len() > 10_000);
    for (x, y) in xs.iter().zip(ys) {
        let (x, y) = (bits_f32(x), bits_f32(y));
        let got = numpy::exp(x);
        assert!(got.to_bits() == y.to_bits() || (got.is_nan() && y.is_nan()), "exp({x:e}) = {got:e}, numpy {y:e}");
    }
}

#[test]
fn softmax_is_bit_identical_to_lavas_numpy_decoder() {
    let v = vectors("numpy_softmax.json");
    for case in v.get("cases").unwrap().as_array().unwrap() {
        let logits: Vec<f32> = case.get("logits").unwrap().as_array().unwrap().iter().map(bits_f32).collect();
        let want: Vec<f32> = case.get("p").unwrap().as_array().unwrap().iter().map(bits_f32).collect();
        let t = match case.get("t").unwrap() {
            Value::Float(f) => *f,
            Value::Int(i) => i.to_f64(),
            other => panic!("{other:?}"),
        };
        let got = probabilities(&logits, t);
        let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same && got.len() == want.len(), "k={} t={t}: {got:?} vs numpy {want:?}", logits.len());
    }
}

#[test]
fn round_to_four_places_is_pythons_round() {
    let v = vectors("python_round4.json");
    for pair in v.get("pairs").unwrap().as_array().unwrap() {
        let [x, r] = pair.as_array().unwrap() else { panic!("a pair") };
        let (x, want) = (hex_f64(x), hex_f64(r));
        let got = pyfloat::round(x, 4);
        assert_eq!(got.to_bits(), want.to_bits(), "round({x:e}, 4) = {got:e}, Python {want:e}");
    }
}

#[test]
fn float_repr_is_pythons_repr() {
    let v = vectors("python_float_repr.json");
    for pair in v.get("pairs").unwrap().as_array().unwrap() {
        let [x, r] = pair.as_array().unwrap() else { panic!("a pair") };
        let x = hex_f64(x);
        assert_eq!(pyfloat::repr(x), r.as_str().unwrap(), "repr of bits {:016x}", x.to_bits());
    }
}

#[test]
fn json_dumps_and_repr_match_python() {
    let v = vectors("python_json_dumps.json");
    for pair in v.get("json_dumps").unwrap().as_array().unwrap() {
        let [value, want] = pair.as_array().unwrap() else { panic!("a pair") };
        assert_eq!(json::to_string(value, Style::PYTHON), want.as_str().unwrap(), "json.dumps({value:?})");
        // And what Python wrote, we read back to the same value.
        let back = json::parse_str(want.as_str().unwrap(), ParseOptions { max_depth: 10_000 }).unwrap();
        assert_eq!(text(&back), text(value));
    }
    for pair in v.get("python_repr").unwrap().as_array().unwrap() {
        let [value, want] = pair.as_array().unwrap() else { panic!("a pair") };
        assert_eq!(prompt::pyrepr::repr(value), want.as_str().unwrap(), "repr({value:?})");
    }
}

#[test]
fn a_cbor_request_lays_out_exactly_like_its_json_twin() {
    let mut questions = 0;
    for case in cases() {
        let json_request = case.field("request");
        let cbor = laya_topics::cbor::encode(json_request);
        let decoded = laya_topics::cbor::decode(&cbor, 1000).unwrap_or_else(|e| panic!("{}: {e}", case.id));
        assert_eq!(text(&decoded), text(json_request), "{}", case.id);
        let b = bundle(&case.model);
        let request = Request::from_value(decoded).unwrap();
        let from_cbor = prompt::prepare(&b.tokenizer, &request, laya_limits(&request, &b)).unwrap();
        let from_json = prepared_of(case);
        assert_eq!(from_cbor.len(), from_json.len(), "{}", case.id);
        for (p, q) in from_cbor.iter().zip(from_json) {
            assert_eq!(p.outcome.as_ref().map(|(_, r)| r), q.outcome.as_ref().map(|(_, r)| r), "{} {}", case.id, p.qid);
            questions += 1;
        }
    }
    assert!(questions >= 1000, "only {questions} questions compared");
}
