//! Rows/second of the CPU reference backend on the benchmark requests: the fixture requests of
//! model bpe-t5 whose questions are all valid (the same set tools/bench/laya_rows_per_sec.py
//! runs through PyTorch). Not a test: see BENCHMARKS.md for recorded numbers.
//!
//!     LAYA_BENCH_MODEL=/tmp/laya-mid LAYA_BENCH_REQUESTS=10 cargo bench --bench cpu_rows

use std::path::PathBuf;
use std::time::Instant;

use laya_edge::backend::cpu::CpuBackend;
use laya_edge::bundle::HostBundle;
use laya_edge::pipeline;
use laya_topics::json::{self, ParseOptions};
use laya_topics::{Request, Value};

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/laya-0.3.20");
    let model = std::env::var_os("LAYA_BENCH_MODEL").map(PathBuf::from).unwrap_or_else(|| root.join("models/bpe-t5"));
    let limit: usize = std::env::var("LAYA_BENCH_REQUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(40);
    let passes: usize = std::env::var("LAYA_BENCH_PASSES").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let cases = std::fs::read_to_string(root.join("cases.jsonl")).expect("fixture cases");
    let requests: Vec<Request> = cases
        .lines()
        .map(|l| json::parse_str(l, ParseOptions { max_depth: 10_000 }).expect("fixture json"))
        .filter(|c| c.get("model") == Some(&Value::from("bpe-t5")))
        .filter(|c| c.get("predict_all").and_then(|p| p.get("error")).is_none())
        .filter_map(|c| Request::from_value(c.get("request")?.clone()).ok())
        .filter(|r| !r.questions.is_empty())
        .take(limit)
        .collect();
    let rows: usize = requests.iter().map(|r| r.questions.len()).sum();
    let bundle = HostBundle::load(&model).expect("model bundle");
    let mut backend = CpuBackend::load(&model, &bundle.config, bundle.tokenizer.pad.id).expect("model");
    for r in &requests {
        pipeline::answer(&bundle, &mut backend, r).expect("warm-up");
    }
    let start = Instant::now();
    for _ in 0..passes {
        for r in &requests {
            pipeline::answer(&bundle, &mut backend, r).expect("answer");
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{{\"impl\": \"laya-edge-cpu\", \"threads\": {}, \"requests\": {}, \"rows\": {}, \"seconds\": {:.3}, \"rows_per_second\": {:.2}}}",
        rayon::current_num_threads(),
        requests.len(),
        rows * passes,
        secs,
        (rows * passes) as f64 / secs
    );
}
