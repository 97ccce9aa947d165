//! Keeping the NPU busy (issue #16, item 3), through the fake runtimes' latency knobs: questions
//! per second and the NPU's busy fraction, the new design against the serial one. Not a test:
//! see BENCHMARKS.md.
//!
//! - RK3588: the RKNN backend with one context (the serial design) and with three contexts
//!   pinned to cores 0x1/0x2/0x4, on calls of 1, 3 and 6 questions, the fake sleeping
//!   `LAYA_BENCH_RKNN_MS` (default 500, the model card's 512-token run) per run while holding its
//!   context's core. Busy fraction = runs x latency / (wall time x 3 cores).
//! - QCS6490: the QNN backend on a checkpoint of the board model's head dimensions, the fake NPU
//!   sleeping `LAYA_BENCH_QNN_MS` (default 100) per `graphExecute` and returning zeros
//!   (`FAKE_QNN_NO_COMPUTE`: a real NPU costs the host nothing), the real head on the host.
//!   Serial: one question per call (encode, then head); pipelined: one call of
//!   `LAYA_BENCH_ROWS` questions (default 8), the head of question i beside the NPU's question
//!   i+1. The bound is 1 / max(NPU stage, head).
//!
//! Run:
//!
//!     python tools/bench/make_checkpoint.py --out /tmp/laya-1024 \
//!         --hidden 1024 --layers 1 --heads 16 --intermediate 2624 --local-attention 128
//!     LAYA_FAKE_LIB_DIR=target/debug LAYA_BENCH_MODEL=/tmp/laya-1024 \
//!         cargo bench -p laya-edge --features qnn,rknn --bench npu_overlap
//!
//! - RK3588 through the Engine (`LAYA_BENCH_PART=engine`): N clients, each asking one question
//!   at a time (the next when the answer is back), against `serve`'s engine for `backend =
//!   "rknn"` (a worker process, `engine::EngineConfig::from_config`): one context, three contexts with
//!   calls run one at a time (the supervisor before merging), three contexts with queued calls
//!   merged into one batch. Questions per second over `LAYA_BENCH_ROUNDS` (default 4) questions
//!   per client.
//! - The CPU (`LAYA_BENCH_PART=cpu`), which the engine does not merge: the same one-question
//!   rows run one call each, and merged four at a time in arrival order (padded to the longest
//!   of the four), rows of equal and of mixed lengths, on `LAYA_BENCH_MODEL`.
//!
//! The fake runtimes are built by the bench itself (`cargo build -p fake-rknn -p fake-qnn`, in
//! the bench's profile, cold with LTO), or taken from `LAYA_FAKE_LIB_DIR` (after
//! `cargo build -p fake-rknn -p fake-qnn`). Without LAYA_BENCH_MODEL the QNN part runs on the fixture bpe-t5 (d=64).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use laya_edge::backend::Backend;
use laya_edge::backend::cpu::CpuModel;
use laya_edge::backend::npu::qnn::{QnnBackend, QnnConfig};
use laya_edge::backend::npu::rknn::{RknnBackend, RknnConfig, RknnGraph};
use laya_edge::bundle::HostBundle;
use laya_edge::engine::Engine;
use laya_edge::prompt::{QType, Row};

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn json_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// A synthetic row of `n` tokens (ids inside the vocabulary) with `k` option markers.
fn row(n: usize, k: usize, vocab: u32, seed: u32) -> Row {
    Row {
        input_ids: (0..n as u32).map(|i| 5 + (i * 7919 + seed * 31) % (vocab - 5)).collect(),
        marker_pos: (0..k as u32).map(|j| 1 + 8 * j).collect(),
        qtype: QType::Choice,
        layout: None,
    }
}

fn rknn(fixtures: &Path, scratch: &Path, latency_ms: u64) {
    let lib = test_kit::build_fake_library("fake-rknn", "fake_rknn");
    let ckpt = std::path::absolute(fixtures.join("models/bpe-small")).expect("path");
    let file = scratch.join("bench-512.fake.rknn");
    std::fs::write(
        &file,
        format!(
            r#"{{"fake_rknn_graph": 1, "checkpoint": {}, "seq_len": 512, "marker_slots": 64}}"#,
            json_str(&ckpt.to_string_lossy())
        ),
    )
    .expect("graph file");
    let graphs = [RknnGraph { file, seq_len: 512, marker_slots: 64 }];
    println!("## RKNN: fake run latency {latency_ms} ms, one 512-token graph, checkpoint bpe-small");
    println!("| questions per call | contexts | calls | wall | questions/s | NPU busy (of 3 cores) | vs 1 context |");
    println!("|---|---|---|---|---|---|---|");
    for q in [1usize, 3, 6] {
        let rows: Vec<Row> = (0..q).map(|i| row(40 + 10 * i, 3, 1000, i as u32)).collect();
        let refs: Vec<&Row> = rows.iter().collect();
        let calls = 3;
        let mut base = None;
        for contexts in [1usize, 3] {
            let config = RknnConfig { contexts, ..RknnConfig::new(&lib) };
            let mut b = RknnBackend::load(&graphs, &config, 0).expect("rknn backend");
            b.run(&refs).expect("warm-up");
            let t = Instant::now();
            for _ in 0..calls {
                b.run(&refs).expect("run");
            }
            let wall = t.elapsed();
            let qps = (q * calls) as f64 / wall.as_secs_f64();
            let busy = (q * calls) as f64 * latency_ms as f64 / 1e3 / (wall.as_secs_f64() * 3.0);
            let ratio = base.map(|b: f64| format!("{:.2}x", qps / b)).unwrap_or_else(|| "1.00x".into());
            base.get_or_insert(qps);
            println!(
                "| {q} | {contexts} | {calls} | {:.0} ms | {qps:.2} | {:.0}% | {ratio} |",
                wall.as_secs_f64() * 1e3,
                100.0 * busy
            );
        }
    }
}

/// N concurrent one-question clients through the engine `serve` runs for `backend = "rknn"`.
fn rknn_engine(fixtures: &Path, scratch: &Path, latency_ms: u64, rounds: usize) {
    let lib = test_kit::build_fake_library("fake-rknn", "fake_rknn");
    let ckpt = std::path::absolute(fixtures.join("models/bpe-small")).expect("path");
    let dir = scratch.join("rknn-bundle");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(
        dir.join("g512.fake.rknn"),
        format!(
            r#"{{"fake_rknn_graph": 1, "checkpoint": {}, "seq_len": 512, "marker_slots": 64}}"#,
            json_str(&ckpt.to_string_lossy())
        ),
    )
    .expect("graph file");
    std::fs::write(
        dir.join("laya-bundle.json"),
        format!(
            r#"{{"backend": "rknn", "checkpoint": {}, "graphs": [{{"file": "g512.fake.rknn", "seq_len": 512, "marker_slots": 64}}]}}"#,
            json_str(&ckpt.to_string_lossy())
        ),
    )
    .expect("manifest");
    let host = HostBundle::load(&dir).expect("bundle");
    let program = Path::new(env!("CARGO_BIN_EXE_laya-edge"));
    println!();
    println!(
        "## RKNN through the engine: N clients, one question each at a time, {rounds} questions per client, fake run latency {latency_ms} ms"
    );
    println!("| clients | design | wall | questions/s | NPU busy (of 3 cores) | vs 1 context |");
    println!("|---|---|---|---|---|---|");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    for clients in [1usize, 3, 6, 12] {
        let mut base = None;
        for (design, contexts, merge) in [
            ("1 context", 1, true),
            ("3 contexts, one call at a time", 3, false),
            ("3 contexts, calls merged", 3, true),
        ] {
            let mut config = laya_edge::config::Config::default();
            config.model.dir = dir.to_path_buf();
            config.engine.backend = laya_edge::config::BackendKind::Rknn;
            config.rknn.library = Some(lib.to_path_buf());
            config.rknn.contexts = contexts;
            let mut engine_config =
                laya_edge::engine::EngineConfig::from_config(program, &config, &host).expect("engine config");
            if !merge {
                engine_config.policy.merge_rows = 1;
            }
            let wall = rt.block_on(async {
                let engine = Engine::start(engine_config);
                engine.run(vec![row(30, 3, 1000, 999)], None).await.expect("warm-up");
                let t = Instant::now();
                let tasks: Vec<_> = (0..clients)
                    .map(|c| {
                        let engine = engine.clone();
                        tokio::spawn(async move {
                            for q in 0..rounds {
                                let r = row(40 + 10 * ((c + q) % 6), 3, 1000, (c * 100 + q) as u32);
                                engine.run(vec![r], None).await.expect("answered");
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.expect("client");
                }
                t.elapsed()
            });
            let n = clients * rounds;
            let qps = n as f64 / wall.as_secs_f64();
            let busy = n as f64 * latency_ms as f64 / 1e3 / (wall.as_secs_f64() * 3.0);
            let ratio = base.map(|b: f64| format!("{:.2}x", qps / b)).unwrap_or_else(|| "1.00x".into());
            base.get_or_insert(qps);
            println!(
                "| {clients} | {design} | {:.0} ms | {qps:.2} | {:.0}% | {ratio} |",
                wall.as_secs_f64() * 1e3,
                100.0 * busy
            );
        }
    }
}

/// The CPU backend: one row per call against four rows per call, as merging would make them.
fn cpu_merge(model: &Path) {
    let host = HostBundle::load(model).expect("checkpoint");
    let mut cpu = laya_edge::backend::cpu::CpuBackend::load(model, &host.config).expect("model");
    let vocab = CpuModel::load(model, &host.config).expect("model").encoder.config.vocab_size as u32;
    println!();
    println!("## CPU: one row per call vs four merged (padded to the longest), model {}", model.display());
    println!("| rows | one per call | four per call | merged vs one |");
    println!("|---|---|---|---|");
    for (name, lengths) in [("all 128 tokens", [128usize; 4]), ("mixed 40/90/160/300", [40, 90, 160, 300])] {
        let rows: Vec<Row> = (0..24).map(|i| row(lengths[i % 4], 3, vocab, i as u32)).collect();
        let refs: Vec<&Row> = rows.iter().collect();
        cpu.run(&refs[..4]).expect("warm-up");
        let t = Instant::now();
        for r in &refs {
            cpu.run(&[r]).expect("one");
        }
        let one = rows.len() as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        for chunk in refs.chunks(4) {
            cpu.run(chunk).expect("four");
        }
        let four = rows.len() as f64 / t.elapsed().as_secs_f64();
        println!("| {name} | {one:.1} rows/s | {four:.1} rows/s | {:.2}x |", four / one);
    }
}

fn qnn(model: &Path, scratch: &Path, latency_ms: u64, n_rows: usize) {
    let lib = test_kit::build_fake_library("fake-qnn", "fake_qnn");
    let ckpt = std::path::absolute(model).expect("path");
    let l = 128;
    let bin = scratch.join("enc_128.fake.bin");
    std::fs::write(
        &bin,
        format!(
            r#"{{"fake_qnn_binary": 1, "checkpoint": {}, "seq_len": {l}, "graph_name": "enc_{l}", "tensor_suffix": ""}}"#,
            json_str(&ckpt.to_string_lossy())
        ),
    )
    .expect("binary");
    let bundle_dir = scratch.join("qnn-bundle");
    std::fs::create_dir_all(&bundle_dir).expect("dir");
    std::fs::write(
        bundle_dir.join("laya-bundle.json"),
        format!(
            r#"{{"backend": "qnn", "checkpoint": {}, "graphs": [{{"file": {}, "seq_len": {l}, "calibration": "sqnr", "io": "float"}}]}}"#,
            json_str(&ckpt.to_string_lossy()),
            json_str(&bin.to_string_lossy())
        ),
    )
    .expect("manifest");
    let bundle = HostBundle::load(&bundle_dir).expect("bundle");
    let mut backend = QnnBackend::load(&bundle, &QnnConfig::new(&lib, &lib)).expect("qnn backend");
    let host = HostBundle::load(model).expect("checkpoint");
    let cpu = CpuModel::load(model, &host.config).expect("model");
    let (d, vocab) = (cpu.encoder.config.hidden_size, cpu.encoder.config.vocab_size as u32);
    // Full rows of L tokens, four options each.
    let rows: Vec<Row> = (0..n_rows).map(|i| row(l, 4, vocab, i as u32)).collect();
    let refs: Vec<&Row> = rows.iter().collect();
    backend.run(&refs[..2]).expect("warm-up");
    // The two stages alone.
    let t = Instant::now();
    let hidden: Vec<_> = rows.iter().map(|r| backend.encode(&r.input_ids).expect("encode")).collect();
    let npu = t.elapsed() / n_rows as u32;
    let t = Instant::now();
    for (r, h) in rows.iter().zip(&hidden) {
        std::hint::black_box(cpu.head.forward(h, &[l], &[0], &[r.marker_pos.as_slice()]).expect("head"));
    }
    let head = t.elapsed() / n_rows as u32;
    // Serial: one question per call, as the worker ran every row before.
    let t = Instant::now();
    for r in &refs {
        backend.run(&[r]).expect("serial");
    }
    let serial = t.elapsed();
    // Pipelined: one call of all rows.
    let t = Instant::now();
    backend.run(&refs).expect("pipelined");
    let piped = t.elapsed();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let qps = |w: Duration| n_rows as f64 / w.as_secs_f64();
    let bound = 1.0 / npu.max(head).as_secs_f64();
    let busy = |w: Duration| n_rows as f64 * latency_ms as f64 / 1e3 / w.as_secs_f64();
    println!();
    println!(
        "## QNN: fake graphExecute latency {latency_ms} ms (no host compute), L={l}, d={d}, {n_rows} questions, model {}",
        model.display()
    );
    println!(
        "NPU stage (inputs + graphExecute + output) {:.1} ms/question, head {:.1} ms/question, bound 1/max = {bound:.2} questions/s",
        ms(npu),
        ms(head)
    );
    println!("| design | wall | questions/s | of the bound | NPU busy | vs serial |");
    println!("|---|---|---|---|---|---|");
    for (name, w) in [("serial (one question per call)", serial), ("pipelined (one call)", piped)] {
        println!(
            "| {name} | {:.0} ms | {:.2} | {:.2} | {:.0}% | {:.2}x |",
            ms(w),
            qps(w),
            qps(w) / bound,
            100.0 * busy(w),
            qps(w) / qps(serial)
        );
    }
}

fn main() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/laya-0.3.20");
    let model = std::env::var_os("LAYA_BENCH_MODEL").map(PathBuf::from).unwrap_or(fixtures.join("models/bpe-t5"));
    let (rknn_ms, qnn_ms) = (env_num("LAYA_BENCH_RKNN_MS", 500), env_num("LAYA_BENCH_QNN_MS", 100));
    let n_rows = env_num("LAYA_BENCH_ROWS", 8) as usize;
    // SAFETY: set before any thread of this process exists (the fakes read them at load/run).
    unsafe {
        std::env::set_var("FAKE_RKNN_LATENCY_MS", rknn_ms.to_string());
        std::env::set_var("FAKE_QNN_LATENCY_MS", qnn_ms.to_string());
        std::env::set_var("FAKE_QNN_NO_COMPUTE", "1");
    }
    let scratch = std::env::temp_dir().join(format!("laya-npu-overlap-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("scratch");
    println!(
        "{} CPU threads; load: {}",
        rayon::current_num_threads(),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    let part = std::env::var("LAYA_BENCH_PART").unwrap_or_default();
    if part.is_empty() || part == "rknn" {
        rknn(&fixtures, &scratch, rknn_ms);
    }
    if part.is_empty() || part == "qnn" {
        qnn(&model, &scratch, qnn_ms, n_rows);
    }
    if part.is_empty() || part == "cpu" {
        cpu_merge(&model);
    }
    if part.is_empty() || part == "engine" {
        rknn_engine(&fixtures, &scratch, rknn_ms, env_num("LAYA_BENCH_ROUNDS", 4) as usize);
    }
    std::fs::remove_dir_all(&scratch).ok();
}
