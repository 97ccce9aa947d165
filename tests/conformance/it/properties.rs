//! Arbitrary input never panics the host pipeline, and the JSON codec round-trips.

use crate::support::bundle;
use laya_edge::cli::jsonl;
use laya_edge::decide::{self, RowOutput, Temperatures};
use laya_edge::pipeline::limits_for;
use laya_edge::prompt;
use laya_topics::json::{self, ParseOptions, Style};
use laya_topics::{Map, Request, Value};
use proptest::prelude::*;

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::int),
        "-?[1-9][0-9]{18,30}".prop_map(|s| Value::Int(laya_topics::Integer::parse(&s).unwrap())),
        any::<f64>().prop_map(Value::Float),
        prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(-0.0), Just(1e-7), Just(1e16)].prop_map(Value::Float),
        ".{0,40}".prop_map(Value::Str),
        prop_oneof![
            Just("[MASK]"),
            Just("[SEP] x [CLS]"),
            Just("a\u{0}\u{1f}\"\\"),
            Just("choice"),
            Just("noul"),
            Just("score"),
            Just("true"),
            Just("FALSE")
        ]
        .prop_map(Value::from),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((".{0,8}", inner), 0..6).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Question definitions: mostly well-formed enough to reach the layout, sometimes anything.
fn question() -> impl Strategy<Value = Value> {
    let typ = prop_oneof![Just(Value::from("choice")), Just(Value::from("score")), Just(Value::from("noul")), leaf()];
    (typ, prop::option::of(value()), prop::option::of(value()), prop::option::of(value())).prop_map(
        |(t, ins, crit, labels)| {
            let mut m = Map::new();
            m.insert("type".into(), t);
            if let Some(i) = ins {
                m.insert("instructions".into(), i);
            }
            if let Some(c) = crit {
                m.insert("criteria".into(), c);
            }
            if let Some(l) = labels {
                m.insert("labels".into(), l);
            }
            Value::Object(m)
        },
    )
}

fn request() -> impl Strategy<Value = Request> {
    (
        value(),
        prop::collection::vec((".{0,6}", prop_oneof![question(), value()]), 0..5),
        prop::option::of(-20i64..600),
        prop::option::of(-20i64..300),
    )
        .prop_map(|(state, qs, max_len, head_max_len)| Request {
            id: None,
            state,
            questions: qs.into_iter().collect(),
            lang: None,
            max_len,
            head_max_len,
            deadline_ms: None,
            min_confidence: None,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_states_and_questions_never_panic_the_pipeline(request in request()) {
        for model in ["bpe-small", "wp-t4"] {
            let b = bundle(model);
            let prepared = prompt::prepare(&b.tokenizer, &request, limits_for(&request, b.config.limits)).unwrap();
            prop_assert_eq!(prepared.len(), request.questions.len());
            let outputs: Vec<RowOutput> = prepared
                .iter()
                .filter_map(|p| p.outcome.as_ref().ok())
                .map(|(_, row)| RowOutput { logits: row.marker_pos.iter().map(|&m| (m % 7) as f32 - 3.0).collect(), act_probs: vec![0.5, 0.5] })
                .collect();
            for (_, row) in prepared.iter().filter_map(|p| p.outcome.as_ref().ok()) {
                prop_assert!(row.marker_pos.iter().all(|&m| (m as usize) < row.input_ids.len()));
                prop_assert!(row.input_ids.len() as i64 <= request.max_len.unwrap_or(b.config.limits.max_len).max(0));
            }
            let result = decide::assemble(&prepared, &outputs, &Temperatures::default(), None).unwrap();
            prop_assert_eq!(result.answers.len(), request.questions.len());
        }
    }

    #[test]
    fn arbitrary_lines_get_an_answer_line(line in ".{0,200}") {
        let b = bundle("bpe-small");
        let out = jsonl::layout_line(&b, &line);
        prop_assert!(json::parse_str(&out, ParseOptions::default()).is_ok());
    }

    #[test]
    fn json_written_in_python_style_reads_back_to_the_same_document(v in value()) {
        let text = json::to_string(&v, Style::PYTHON);
        let back = json::parse_str(&text, ParseOptions { max_depth: 1000 }).unwrap();
        prop_assert_eq!(json::to_string(&back, Style::PYTHON), text);
    }
}
