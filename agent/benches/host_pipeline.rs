//! What laya-edge does around the model for one request, per request, on the benchmark requests
//! (the fixture requests of model bpe-t5 whose questions are all valid, the set `cpu_rows` and
//! tools/bench/laya_rows_per_sec.py use): decode the payload (compact JSON), parse the request,
//! validate, tokenize and lay out every question (`pipeline::prepare`), then, with the model's
//! logits given (zeros, as tools/bench/laya_host_pipeline.py gives laya: the model call is
//! excluded on both sides), the act softmax, the decisions (`decide::assemble`) and the encoded
//! reply. Issue #16 item 4c; the Python side is tools/bench/laya_host_pipeline.py. Not a test:
//! see BENCHMARKS.md for recorded numbers.
//!
//!     cargo bench --bench host_pipeline                 # LAYA_BENCH_PASSES (20)
//!
//! Two figures: a `fresh` pass on a newly loaded tokenizer (its memo of recurring instruction and
//! option texts, `prompt::tokenizer`, starts empty; texts that recur within the pass still hit
//! it) and the `warm` passes after it (what a service answering an application's fixed questions
//! does).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use laya_edge::bundle::HostBundle;
use laya_edge::decide::{self, RowOutput};
use laya_edge::pipeline;
use laya_topics::json::{self, ParseOptions};
use laya_topics::wire::{Encoding, Reply, Timing};
use laya_topics::{Request, Value};

#[derive(Default, Clone, Copy)]
struct Stages {
    decode: Duration,
    prepare: Duration,
    decide: Duration,
    encode: Duration,
}

impl Stages {
    fn total(&self) -> Duration {
        self.decode + self.prepare + self.decide + self.encode
    }
}

/// One request from its payload to its reply's bytes, the model's logits being zeros.
fn answer(bundle: &HostBundle, payload: &[u8], max_tokens: usize, s: &mut Stages) -> Vec<u8> {
    let t0 = Instant::now();
    let doc = Encoding::Json.decode(payload, 64).expect("payload");
    let id = doc.get("id").cloned();
    let request = Request::from_value(doc).expect("request");
    let t1 = Instant::now();
    let prepared = pipeline::prepare(bundle, &request, max_tokens).expect("prepare");
    let t2 = Instant::now();
    // The model's place: one row of zero logits per laid-out question, zero act logits.
    let outputs: Vec<RowOutput> = prepared
        .questions
        .iter()
        .filter_map(|p| p.outcome.as_ref().ok())
        .map(|(_, row)| RowOutput {
            logits: vec![0.0; row.marker_pos.len()],
            act_probs: decide::act_probabilities(&[0.0, 0.0]),
        })
        .collect();
    let result = decide::assemble(&prepared.questions, &outputs, &bundle.config.temperatures, request.lang.as_deref())
        .expect("assemble");
    let t3 = Instant::now();
    let reply = Reply {
        id,
        device: "bench".into(),
        backend: "cpu".into(),
        serving: laya_topics::wire::Role::Primary,
        result,
        timing: Timing::default(),
    };
    let bytes = Encoding::Json.encode(&reply.to_value());
    let t4 = Instant::now();
    s.decode += t1 - t0;
    s.prepare += t2 - t1;
    s.decide += t3 - t2;
    s.encode += t4 - t3;
    bytes
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/laya-0.3.20");
    let model = root.join("models/bpe-t5");
    let passes: usize = std::env::var("LAYA_BENCH_PASSES").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let cases = std::fs::read_to_string(root.join("cases.jsonl")).expect("fixture cases");
    let payloads: Vec<Vec<u8>> = cases
        .lines()
        .map(|l| json::parse_str(l, ParseOptions { max_depth: 10_000 }).expect("fixture json"))
        .filter(|c| c.get("model") == Some(&Value::from("bpe-t5")))
        .filter(|c| c.get("predict_all").and_then(|p| p.get("error")).is_none())
        .filter_map(|c| c.get("request").cloned())
        .filter(|r| r.get("questions").is_some_and(|q| matches!(q, Value::Object(m) if !m.is_empty())))
        .map(|r| json::to_string(&r, json::Style::COMPACT).into_bytes())
        .collect();
    let questions: usize = payloads
        .iter()
        .map(|p| match Encoding::Json.decode(p, 64).expect("payload").get("questions") {
            Some(Value::Object(m)) => m.len(),
            _ => 0,
        })
        .sum();
    let max_tokens = laya_edge::config::Limits::default().max_request_tokens;
    let n = payloads.len() as f64;
    let us = |d: Duration, reqs: f64| d.as_secs_f64() * 1e6 / reqs;

    let fresh_bundle = HostBundle::load(&model).expect("model bundle");
    let mut fresh = Stages::default();
    let mut replies = Vec::new();
    for p in &payloads {
        replies.extend(answer(&fresh_bundle, p, max_tokens, &mut fresh));
    }
    let reply_bytes = replies.len();
    // The same digest as laya_host_pipeline.py's when both sides wrote the same replies.
    let digest: String =
        ring::digest::digest(&ring::digest::SHA256, &replies).as_ref().iter().map(|b| format!("{b:02x}")).collect();
    // The warm passes run on the bundle the fresh pass filled.
    let mut warm = Stages::default();
    for _ in 0..passes {
        for p in &payloads {
            std::hint::black_box(answer(&fresh_bundle, p, max_tokens, &mut warm));
        }
    }
    let w = n * passes as f64;
    println!(
        "{{\"impl\": \"laya-edge\", \"requests\": {}, \"questions\": {questions}, \"passes\": {passes}, \
         \"payload_bytes\": {}, \"reply_bytes\": {reply_bytes}, \"replies_sha256\": \"{digest}\", \
         \"fresh_us_per_request\": {:.1}, \"warm_us_per_request\": {:.1}, \
         \"warm_stages_us\": {{\"decode\": {:.1}, \"prepare\": {:.1}, \"decide\": {:.1}, \"encode\": {:.1}}}, \
         \"fresh_stages_us\": {{\"decode\": {:.1}, \"prepare\": {:.1}, \"decide\": {:.1}, \"encode\": {:.1}}}}}",
        payloads.len(),
        payloads.iter().map(Vec::len).sum::<usize>(),
        us(fresh.total(), n),
        us(warm.total(), w),
        us(warm.decode, w),
        us(warm.prepare, w),
        us(warm.decide, w),
        us(warm.encode, w),
        us(fresh.decode, n),
        us(fresh.prepare, n),
        us(fresh.decide, n),
        us(fresh.encode, n),
    );
}
