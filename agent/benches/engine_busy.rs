//! How busy the backend stays under saturation: a fixed-latency backend (the `null` worker with
//! `sleep=20`) and many concurrent requests, each tokenized on the host first, as `serve` does.
//! busy fraction = (calls x backend latency) / wall time. Target >= 97%. Not a test: see
//! BENCHMARKS.md.
//!
//!     cargo bench --bench engine_busy

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use laya_edge::bundle::HostBundle;
use laya_edge::engine::Policy;
use laya_edge::engine::{Engine, EngineConfig, WorkerSpec};
use laya_edge::pipeline::limits_for;
use laya_edge::prompt;
use laya_topics::json::{self, ParseOptions};
use laya_topics::{Request, Value};

const LATENCY_MS: u64 = 20;
const CALLS: usize = 300;
const CONCURRENCY: usize = 16;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/laya-0.3.20");
    let model = root.join("models/bpe-t5");
    let bundle = Arc::new(HostBundle::load(&model).expect("bundle"));
    let cases = std::fs::read_to_string(root.join("cases.jsonl")).expect("cases");
    let requests: Vec<Request> = cases
        .lines()
        .filter_map(|l| json::parse_str(l, ParseOptions { max_depth: 10_000 }).ok())
        .filter(|c| c.get("model") == Some(&Value::from("bpe-t5")))
        .filter_map(|c| Request::from_value(c.get("request")?.clone()).ok())
        .filter(|r| !r.questions.is_empty())
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async move {
        let args: Vec<OsString> = vec![
            "worker".into(),
            "--backend".into(),
            "null".into(),
            "--model".into(),
            model.as_os_str().to_owned(),
            "--faults".into(),
            format!("sleep={LATENCY_MS}").into(),
        ];
        let worker = WorkerSpec { program: Path::new(env!("CARGO_BIN_EXE_laya-edge")).to_owned(), args, env: Vec::new() };
        let engine = Engine::start(EngineConfig::new(Policy::default(), worker));
        // Warm up (worker start).
        let warm = prompt::Row { input_ids: vec![1, 2], marker_pos: vec![0], qtype: prompt::QType::Noul, layout: None };
        engine.run(vec![warm], None).await.expect("warm-up");
        let sem = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..CALLS {
            let permit = sem.clone().acquire_owned().await.expect("permit");
            let (engine, bundle, request) = (engine.clone(), bundle.clone(), requests[i % requests.len()].clone());
            tasks.push(tokio::spawn(async move {
                let b = bundle.clone();
                let rows = tokio::task::spawn_blocking(move || {
                    let prepared = prompt::prepare(&b.tokenizer, &request, limits_for(&request, b.config.limits)).expect("prepare");
                    prepared.into_iter().filter_map(|p| p.outcome.ok().map(|(_, r)| r)).collect::<Vec<_>>()
                })
                .await
                .expect("prepare task");
                let ran = !rows.is_empty();
                if ran {
                    engine.run(rows, None).await.expect("run");
                }
                drop(permit);
                ran
            }));
        }
        let mut ran = 0;
        for t in tasks {
            if t.await.expect("task") {
                ran += 1;
            }
        }
        let wall = start.elapsed();
        let busy = Duration::from_millis(LATENCY_MS) * ran as u32;
        println!(
            "{{\"bench\": \"engine_busy\", \"calls\": {ran}, \"latency_ms\": {LATENCY_MS}, \"concurrency\": {CONCURRENCY}, \"wall_s\": {:.3}, \"busy_fraction\": {:.4}}}",
            wall.as_secs_f64(),
            busy.as_secs_f64() / wall.as_secs_f64()
        );
    });
}
