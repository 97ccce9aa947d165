//! Rows/second of the CPU reference backend on the benchmark requests: the fixture requests of
//! model bpe-t5 whose questions are all valid (the same set tools/bench/laya_rows_per_sec.py
//! runs through PyTorch). Not a test: see BENCHMARKS.md for recorded numbers.
//!
//!     LAYA_BENCH_MODEL=/tmp/laya-mid LAYA_BENCH_REQUESTS=10 cargo bench --bench cpu_rows
//!
//! `LAYA_BENCH_CPU_WEIGHTS` (`f32`, `int8`, `bf16`) runs the CPU model in that `[cpu] weights` mode.
//! `LAYA_BENCH_FTZ=1` (x86_64) sets flush-to-zero and denormals-are-zero in every thread's MXCSR
//! first: whether subnormal floats slow a run.

use std::path::PathBuf;
use std::time::Instant;

use laya_edge::backend::cpu::CpuBackend;
use laya_edge::backend::{Backend, BackendError, RowResult};
use laya_edge::bundle::HostBundle;
use laya_edge::pipeline;
use laya_edge::prompt::Row;
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
    let mode = match std::env::var("LAYA_BENCH_CPU_WEIGHTS").as_deref() {
        Ok("int8") => laya_edge::config::CpuWeights::Int8,
        Ok("bf16") => laya_edge::config::CpuWeights::Bf16,
        _ => laya_edge::config::CpuWeights::F32,
    };
    if std::env::var("LAYA_BENCH_FTZ").as_deref() == Ok("1") {
        flush_denormals();
        rayon::broadcast(|_| flush_denormals());
    }
    let inner = CpuBackend::load_with(&model, &bundle.config, mode).expect("model");
    let mut backend = Counting { inner, tokens: 0 };
    for r in &requests {
        pipeline::answer(&bundle, &mut backend, r).expect("warm-up");
    }
    backend.tokens = 0;
    let (start, cpu_start) = (Instant::now(), cpu_seconds());
    // The fastest pass too: on a shared machine, the pass least disturbed by its neighbours.
    let (mut best, mut best_cpu) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..passes {
        let (pass, pass_cpu) = (Instant::now(), cpu_seconds());
        for r in &requests {
            pipeline::answer(&bundle, &mut backend, r).expect("answer");
        }
        best = best.min(pass.elapsed().as_secs_f64());
        best_cpu = best_cpu.min(cpu_seconds() - pass_cpu);
    }
    let (secs, cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu_start);
    println!(
        "{{\"impl\": \"laya-edge-{}\", \"threads\": {}, \"requests\": {}, \"rows\": {}, \"seconds\": {:.3}, \"rows_per_second\": {:.2}, \"rows_per_cpu_second\": {:.2}, \"best_pass_rows_per_second\": {:.2}, \"best_pass_rows_per_cpu_second\": {:.2}, \"tokens_per_row\": {:.1}}}",
        backend.inner.name(),
        rayon::current_num_threads(),
        requests.len(),
        rows * passes,
        secs,
        (rows * passes) as f64 / secs,
        (rows * passes) as f64 / cpu,
        rows as f64 / best,
        rows as f64 / best_cpu,
        backend.tokens as f64 / (rows * passes) as f64
    );
}

/// The CPU backend, counting the tokens of the rows it runs (what the rows/s figures are of).
struct Counting {
    inner: CpuBackend,
    tokens: usize,
}

impl Backend for Counting {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn run(&mut self, rows: &[&Row]) -> Result<Vec<RowResult>, BackendError> {
        self.tokens += rows.iter().map(|r| r.input_ids.len()).sum::<usize>();
        self.inner.run(rows)
    }
}

/// Sets MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6) in this thread.
fn flush_denormals() {
    #[cfg(target_arch = "x86_64")]
    {
        let mut csr = 0u32;
        // SAFETY: stmxcsr/ldmxcsr read and write this thread's SSE control register only (SSE is
        // baseline on x86_64); the value written is the one read with two mode bits set.
        unsafe {
            std::arch::asm!("stmxcsr [{0}]", in(reg) &mut csr, options(nostack));
            csr |= (1 << 15) | (1 << 6);
            std::arch::asm!("ldmxcsr [{0}]", in(reg) &csr, options(nostack, readonly));
        }
    }
}

/// User plus system CPU time of the whole process (every thread), what load does not skew.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes one `rusage` into the zeroed struct it is given.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}
