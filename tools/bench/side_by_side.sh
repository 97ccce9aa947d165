#!/bin/sh
# Issue #16's side-by-side benchmarks in one run, printing the machine, each figure and the
# ratios (BENCHMARKS.md, "Side by side"). Not a test.
#
#   tools/bench/side_by_side.sh [SCRATCH]     # checkpoints and outputs go to SCRATCH (/tmp/laya-bench)
#
# LAYA_BENCH_PYTHON: a Python with torch and laya 0.3.20 (default /work/venv-demo/bin/python);
# LAYA_BENCH_ORT_PYTHON: a Python with onnxruntime that sees the same torch/laya through
# PYTHONPATH (default: none, the ONNX Runtime column is skipped); LAYA_BENCH_REQUESTS (12),
# LAYA_BENCH_PASSES (2); LAYA_BENCH_PARTS: any of "head cpu mid host mem npu" (default
# "head cpu host npu"; "mid", the ModernBERT-base-sized checkpoint in the whole-model comparison,
# and "mem", memory and start-up over MQTT, are slow and only run when named);
# LAYA_BENCH_MID_REQUESTS (4): the mid checkpoint's requests (each distinct batch shape is one
# ~500 MB ONNX export that its ONNX Runtime session keeps in memory); LAYA_BENCH_THREADS ("1 2"):
# the thread counts of the whole-model comparison, each by wall time and by CPU time (rows per
# CPU-second, which load on the machine does not skew); LAYA_BENCH_CPU_MODELS (laya-small
# laya-1024x2 laya-large4): its checkpoints.
set -eu
cd "$(dirname "$0")/../.."
S=${1:-/tmp/laya-bench}
PY=${LAYA_BENCH_PYTHON:-/work/venv-demo/bin/python}
ORTPY=${LAYA_BENCH_ORT_PYTHON:-}
REQ=${LAYA_BENCH_REQUESTS:-12}
PASSES=${LAYA_BENCH_PASSES:-2}
PARTS=${LAYA_BENCH_PARTS:-head cpu host npu}
MIDREQ=${LAYA_BENCH_MID_REQUESTS:-4}
THREADS=${LAYA_BENCH_THREADS:-1 2}
CPU_MODELS=${LAYA_BENCH_CPU_MODELS:-laya-small laya-1024x2 laya-large4}
SITE=$($PY -c 'import site; print(site.getsitepackages()[0])')
mkdir -p "$S"
echo "== machine: $(uname -srm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "== load at start: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
ckpt() { # name, make_checkpoint args...
    n=$1; shift
    [ -f "$S/$n/model.safetensors" ] || $PY tools/bench/make_checkpoint.py --out "$S/$n" "$@" >/dev/null
}
ckpt laya-1024 --hidden 1024 --layers 1 --heads 16 --intermediate 2624 --local-attention 128
ratio() { python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(f'{a / b:.2f}x')" "$1" "$2"; }
field() { python3 -c "import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
case " $PARTS " in *" head "*)
    echo "== (a) decision head, d=1024, 2 layers, 16 heads, FFN 4096; one full row, 4 markers"
    LAYA_BENCH_MODEL="$S/laya-1024" cargo bench -q -p laya-edge --features qnn,rknn --bench qnn_host_steps 2>/dev/null | tee "$S/head-rust.txt"
    T=$($PY tools/bench/head_torch.py --model "$S/laya-1024" 2>/dev/null | tail -1); echo "$T"
    for L in 128 256; do
        R=$(awk -F'|' -v l=$L '$2 ~ "^ "l" $" {gsub(/ ms| /, "", $7); print $7}' "$S/head-rust.txt")
        P=$(field "$T" head_ms_L$L)
        echo "head L=$L: laya-edge $R ms, PyTorch $P ms: laya-edge takes $(ratio "$R" "$P") PyTorch's time (target <= 0.70x)"
    done
esac
whole() { # checkpoint name, requests; at each of LAYA_BENCH_THREADS, by wall and by CPU time
    m=$1; req=$2
    for t in $THREADS; do
        E=$(LAYA_BENCH_MODEL="$S/$m" LAYA_BENCH_REQUESTS=$req LAYA_BENCH_PASSES=$PASSES RAYON_NUM_THREADS=$t \
            cargo bench -q -p laya-edge --features qnn,rknn --bench cpu_rows 2>/dev/null | tail -1)
        P=$($PY tools/bench/laya_rows_per_sec.py --model "$S/$m" --requests $req --passes $PASSES --threads $t 2>/dev/null | tail -1)
        echo "$m $t thread(s) laya-edge: $E"; echo "$m $t thread(s) pytorch:   $P"
        e=$(field "$E" rows_per_second); p=$(field "$P" rows_per_second)
        ec=$(field "$E" rows_per_cpu_second); pc=$(field "$P" rows_per_cpu_second)
        echo "$m $t: laya-edge / laya on PyTorch = $(ratio "$e" "$p") wall, $(ratio "$ec" "$pc") CPU time (target >= 1.5x)"
        if [ -n "$ORTPY" ]; then
            O=$(PYTHONPATH="$SITE" $ORTPY tools/bench/ort_rows_per_sec.py --model "$S/$m" --requests $req --passes $PASSES \
                --threads $t 2>/dev/null | tail -1)
            echo "$m $t thread(s) ort:       $O"
            echo "$m $t: laya-edge / ONNX Runtime = $(ratio "$e" "$(field "$O" ort_rows_per_second)") wall," \
                "$(ratio "$ec" "$(field "$O" ort_rows_per_cpu_second)") CPU time (target >= 1.2x)"
        fi
    done
}
case " $PARTS " in *" cpu "*)
    echo "== (b) whole CPU model, rows/s on the first $REQ benchmark requests, $PASSES passes, threads: $THREADS"
    ckpt laya-small --hidden 256 --layers 6 --heads 4 --intermediate 384 --local-attention 64
    ckpt laya-1024x2 --hidden 1024 --layers 2 --heads 16 --intermediate 2624 --local-attention 128
    # ModernBERT-large's shape (d=1024, 16 heads, FFN 2624, window 128, global every 3rd layer), 4 layers.
    ckpt laya-large4 --hidden 1024 --layers 4 --heads 16 --intermediate 2624 --local-attention 128
    for m in $CPU_MODELS; do whole $m $REQ; done
esac
case " $PARTS " in *" mid "*)
    echo "== (b) whole CPU model, ModernBERT-base-sized (d=768, 22 layers, 12 heads, FFN 1152, local attention 128,"
    echo "   global every 3rd layer): rows/s on the first $MIDREQ benchmark requests, $PASSES passes, 2 threads"
    ckpt laya-mid --hidden 768 --layers 22 --heads 12 --intermediate 1152 --local-attention 128
    whole laya-mid $MIDREQ
esac
case " $PARTS " in *" host "*)
    echo "== (c) host pipeline per request (decode, validate, tokenize, layout, decide, encode; model call excluded)"
    E=$(cargo bench -q -p laya-edge --bench host_pipeline 2>/dev/null | tail -1)
    P=$($PY tools/bench/laya_host_pipeline.py 2>/dev/null | tail -1)
    echo "laya-edge: $E"; echo "laya:      $P"
    [ "$(field "$E" replies_sha256)" = "$(field "$P" replies_sha256)" ] && echo "same replies, byte for byte" \
        || echo "THE REPLIES DIFFER"
    echo "host pipeline: laya-edge is $(ratio "$(field "$P" us_per_request)" "$(field "$E" warm_us_per_request)") faster" \
        "than laya's Python per request (warm tokenizer memo; target >= 5x)," \
        "$(ratio "$(field "$P" first_pass_us_per_request)" "$(field "$E" fresh_us_per_request)") on a fresh tokenizer"
esac
case " $PARTS " in *" mem "*)
    echo "== (d) memory and start-up over MQTT (backend cpu, bench-profile binary)"
    ckpt laya-small --hidden 256 --layers 6 --heads 4 --intermediate 384 --local-attention 64
    ckpt laya-1024x2 --hidden 1024 --layers 2 --heads 16 --intermediate 2624 --local-attention 128
    ckpt laya-mid --hidden 768 --layers 22 --heads 12 --intermediate 1152 --local-attention 128
    [ -f "$S/tok50k/tokenizer/tokenizer.json" ] || $PY tools/bench/make_tokenizer.py --out "$S/tok50k" >/dev/null
    ckpt laya-small-tok50k --hidden 256 --layers 6 --heads 4 --intermediate 384 --local-attention 64 \
        --tokenizer "$S/tok50k/tokenizer"
    cargo build -q --profile bench -p laya-edge --bin laya-edge
    python3 tools/bench/memory.py --bin "${CARGO_TARGET_DIR:-target}/release/laya-edge" \
        tests/fixtures/laya-0.3.20/models/bpe-t5 "$S/laya-small" "$S/laya-small-tok50k" "$S/laya-1024x2" "$S/laya-mid"
esac
case " $PARTS " in *" npu "*)
    echo "== keeping the NPU busy (fake runtimes' latency knobs)"
    LAYA_BENCH_MODEL="$S/laya-1024" cargo bench -q -p laya-edge --features qnn,rknn --bench npu_overlap 2>/dev/null
esac
echo "== load at end: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
