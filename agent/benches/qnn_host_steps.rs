//! The QNN backend's host steps per question, without an NPU: what the application processor
//! does around each `graphExecute` (token embeddings, the two attention biases, conversion of the
//! inputs to the graph's encoding, conversion of the output back) and the decision head after
//! it, through the same functions the backend calls. Not a test: see BENCHMARKS.md.
//!
//! At the QCS6490 model's dimensions (d=1024, 16 heads, head FFN 4096), on a random checkpoint
//! built by tools/bench/make_checkpoint.py (the encoder's depth does not matter here: it runs on
//! the NPU):
//!
//!     /work/venv/bin/python tools/bench/make_checkpoint.py --out /tmp/laya-1024 \
//!         --hidden 1024 --layers 1 --heads 16 --intermediate 2624 --local-attention 128
//!     LAYA_BENCH_MODEL=/tmp/laya-1024 cargo bench -p laya-edge --features qnn --bench qnn_host_steps
//!
//! Without LAYA_BENCH_MODEL it runs on the fixture checkpoint bpe-t5 (d=64).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use laya_edge::backend::cpu::CpuModel;
use laya_edge::backend::npu::qnn::binary::Encoding;
use laya_edge::backend::npu::qnn::host::{self, HostFault};
use laya_edge::bundle::HostBundle;

/// Mean time of `f` over `n` runs after one warm-up run.
fn time<T>(n: usize, mut f: impl FnMut() -> T) -> Duration {
    std::hint::black_box(f());
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(f());
    }
    t.elapsed() / n as u32
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/laya-0.3.20/models/bpe-t5");
    let dir = std::env::var_os("LAYA_BENCH_MODEL").map(PathBuf::from).unwrap_or(root);
    let n: usize = std::env::var("LAYA_BENCH_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let bundle = HostBundle::load(&dir).expect("checkpoint");
    let mut model = CpuModel::load(&dir, &bundle.config).expect("model");
    let cfg = &model.encoder.config;
    let (d, vocab, pad) = (cfg.hidden_size, cfg.vocab_size as u32, bundle.tokenizer.pad.id);
    println!(
        "model {} (d={d}, head layers {}, head heads {}, head FFN {}), {n} iterations, {} threads",
        dir.display(),
        bundle.config.head_layers,
        (d / 64).max(1),
        4 * d,
        rayon::current_num_threads()
    );
    // Encodings like the fixture binaries': embeddings over about +-4, masks clipped at -100,
    // LayerNorm outputs over about +-8.
    let u16_in = [
        Encoding::Ufixed16 { scale: 8.0 / 65535.0, offset: -32768 },
        Encoding::Ufixed16 { scale: 100.0 / 65535.0, offset: -65535 },
        Encoding::Ufixed16 { scale: 100.0 / 65535.0, offset: -65535 },
    ];
    let f32_in = [Encoding::Float32; 3];
    let u16_out = Encoding::Ufixed16 { scale: 16.0 / 65535.0, offset: -32768 };
    println!(
        "| L | inputs f32 | inputs u16 | output f32 | output u16 | head | head, last layer whole | saved | total (u16 I/O) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for l in [128usize, 256] {
        // A full row: every position a real token, four option markers.
        let ids: Vec<u32> = (0..l as u32).map(|i| 5 + (i * 7919) % (vocab - 5)).collect();
        let markers: Vec<u32> = vec![1, 9, 17, 25];
        let t_in_f32 = time(n, || host::prepare_inputs(&model.encoder, &ids, pad, l, f32_in, HostFault::None).unwrap());
        let t_in_u16 = time(n, || host::prepare_inputs(&model.encoder, &ids, pad, l, u16_in, HostFault::None).unwrap());
        let out_f32: Vec<u8> = (0..l * d).flat_map(|i| ((i % 97) as f32 / 50.0 - 1.0).to_le_bytes()).collect();
        let out_u16: Vec<u8> = (0..l * d).flat_map(|i| ((i * 31) as u16).to_le_bytes()).collect();
        let t_out_f32 = time(n, || host::read_output(&out_f32, Encoding::Float32, l, d, l).unwrap());
        let t_out_u16 = time(n, || host::read_output(&out_u16, u16_out, l, d, l).unwrap());
        let hidden = host::read_output(&out_u16, u16_out, l, d, l).unwrap();
        let t_head = time(n, || model.head.forward(&hidden, &[l], &[0], &[markers.as_slice()]).unwrap());
        model.head.set_last_layer_whole(true);
        let t_whole = time(n, || model.head.forward(&hidden, &[l], &[0], &[markers.as_slice()]).unwrap());
        model.head.set_last_layer_whole(false);
        println!(
            "| {l} | {} | {} | {} | {} | {} | {} | {:.0}% time, {:.0}% FLOPs | {} |",
            ms(t_in_f32),
            ms(t_in_u16),
            ms(t_out_f32),
            ms(t_out_u16),
            ms(t_head),
            ms(t_whole),
            100.0 * (1.0 - t_head.as_secs_f64() / t_whole.as_secs_f64()),
            100.0
                * (1.0 - model.head.flops(l, markers.len() + 1, true) / model.head.flops(l, markers.len() + 1, false)),
            ms(t_in_u16 + t_out_u16 + t_head)
        );
    }
}
