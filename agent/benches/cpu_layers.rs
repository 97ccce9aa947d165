//! Where the CPU model's time goes, layer by layer, against the machine's peak: one packed row of
//! L tokens through the encoder (each layer timed through `encode_packed`'s per-layer callback)
//! and the decision head, with the FLOPs each does counted analytically (2 per multiply-add; a
//! sliding layer's attention counted over the keys its window lets through, not the blocks it
//! computes). Not a test: see BENCHMARKS.md, "CPU model against the machine's peak".
//!
//!     LAYA_BENCH_MODEL=/tmp/laya-large4 RAYON_NUM_THREADS=1 cargo bench -p laya-edge --bench cpu_layers
//!
//! LAYA_BENCH_PEAK_GFLOPS: the machine's fp32 peak for the threads used, printed beside each
//! figure as a share (`tools/bench/fma_peak.c` measures one core's 256-bit FMA peak).
//!
//! Each figure is the process's CPU time (all threads), the best of the runs: on a machine shared
//! with other work, wall time at 1 thread measures the neighbours as much as the model.
//! `LAYA_CPU_KERNELS` runs a narrower instruction set (`backend::cpu`'s `vector` module).

use std::path::PathBuf;

use candle_core::{Device, Tensor};
use laya_edge::backend::cpu::CpuModel;
use laya_edge::backend::cpu::encoder::Packed;
use laya_edge::bundle::HostBundle;

const RUNS: usize = 5;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/laya-0.3.20");
    let model = std::env::var_os("LAYA_BENCH_MODEL").map(PathBuf::from).unwrap_or_else(|| root.join("models/bpe-t5"));
    let peak: Option<f64> = std::env::var("LAYA_BENCH_PEAK_GFLOPS").ok().and_then(|v| v.parse().ok());
    let bundle = HostBundle::load(&model).expect("model bundle");
    let m = CpuModel::load(&model, &bundle.config).expect("model");
    let cfg = &m.encoder.config;
    let (d, i, w) = (cfg.hidden_size as f64, cfg.intermediate_size as f64, cfg.sliding_window());
    let share = |gflops: f64| peak.map_or(String::new(), |p| format!(" ({:.0}% of peak)", 100.0 * gflops / p));
    println!(
        "threads {}, kernels {}, vector passes {}, d {d}, intermediate {i}, layers {:?}",
        rayon::current_num_threads(),
        laya_edge::backend::cpu::kernel_set(),
        laya_edge::backend::cpu::vector_set(),
        cfg.layer_types
    );
    for l in [128usize, 256, 512] {
        let ids: Vec<u32> = (0..l).map(|t| (t * 31 % cfg.vocab_size) as u32).collect();
        let ids = Tensor::from_vec(ids, (1, l), &Device::Cpu).expect("ids");
        let embeds = m.encoder.embed(&ids).expect("embed").squeeze(0).expect("squeeze");
        let positions: Vec<u32> = (0..l as u32).collect();
        let row = 0..l;
        let packed = Packed { rows: std::slice::from_ref(&row), positions: &positions, layout: None };
        let layers = cfg.num_hidden_layers;
        let mut per_layer = vec![f64::INFINITY; layers];
        let mut hidden = None;
        for run in 0..=RUNS {
            let mut last = cpu_seconds();
            let mut times = vec![0f64; layers];
            let out = m
                .encoder
                .encode_packed(embeds.clone(), &packed, &mut |n| {
                    let now = cpu_seconds();
                    times[n - 1] = now - last;
                    last = now;
                })
                .expect("encode");
            if run > 0 {
                per_layer.iter_mut().zip(&times).for_each(|(a, t)| *a = a.min(*t));
            }
            hidden = Some(out);
        }
        let Some(hidden) = hidden else { return };
        for (n, (t, kind)) in per_layer.iter().zip(&cfg.layer_types).enumerate() {
            // Per token: Wqkv, Wo, Wi, the MLP's Wo; attention: scores and weighted values.
            let keys = match kind {
                laya_edge::backend::cpu::config::LayerType::Global => l as f64,
                laya_edge::backend::cpu::config::LayerType::Sliding => (2 * w + 1).min(l) as f64,
            };
            let flops = l as f64 * (2.0 * (4.0 * d * d + 3.0 * d * i) + 4.0 * keys * d);
            let g = flops / t / 1e9;
            println!(
                "L {l:>3} layer {n} {kind:?}: {:>7.2} ms, {:>5.2} GFLOP, {g:>6.1} GFLOP/s{}",
                t * 1e3,
                flops / 1e9,
                share(g)
            );
        }
        // The head: 4 markers, the last layer at the read rows.
        let hidden = hidden.unsqueeze(0).expect("batch");
        let markers: Vec<u32> = (1..=4).map(|k| (k * l / 5) as u32).collect();
        let mut t = f64::INFINITY;
        for _ in 0..RUNS {
            let t0 = cpu_seconds();
            std::hint::black_box(m.head.forward(&hidden, &[l], &[0], &[markers.as_slice()]).expect("head"));
            t = t.min(cpu_seconds() - t0);
        }
        let hl = bundle.config.head_layers;
        let flops = m.head.flops(l, markers.len() + 1, true);
        let g = flops / t / 1e9;
        println!(
            "L {l:>3} head ({hl} layers): {:>7.2} ms, {:>5.2} GFLOP, {g:>6.1} GFLOP/s{}",
            t * 1e3,
            flops / 1e9,
            share(g)
        );
    }
}

/// The process's CPU time in seconds (every thread's).
fn cpu_seconds() -> f64 {
    // SAFETY: clock_gettime writes one `timespec` into the zeroed struct it is given.
    let t = unsafe {
        let mut t: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t);
        t
    };
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}
