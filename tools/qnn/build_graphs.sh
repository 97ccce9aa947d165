#!/bin/sh
# QNN context binaries for any laya checkpoint, and how far they are from the float model.
#
#   tools/qnn/build_graphs.sh CHECKPOINT_DIR OUT_DIR [--requests FILE.jsonl] [--mask-clip 100]
#                             [--lengths "128 256"] [--eval-rows 40] [--cal-rows 48] [--name NAME]
#
# Writes to OUT_DIR, for L in 128 and 256, w8a16 Hexagon V68 (QCS6490) context binaries in both I/O
# flavours with their sidecar JSONs (what `laya-edge bundle --qnn FILE.bin` reads):
#   enc_L<L>_f32io_ctx_qnn.bin / .json   float32 I/O (quantize/dequantize inside the binary)
#   enc_L<L>_u16io_ctx_qnn.bin / .json   uint16 I/O (the host quantizes with the binary's scale/offset)
# and fidelity_report.json, printed as a table: the float model (laya's own forward) against the same
# decision head on the HTP simulator's output, over held-out requests the quantizer never saw.
#
# --requests: your own requests, one JSON object a line (a request, or {"request": ...}); every third
#   one is held out for the report, the rest calibrate. Without it, generic requests are generated
#   (tools/qnn/make_requests.py); your own traffic calibrates better.
# --mask-clip (default 100): the attention-mask inputs are calibrated on max(mask, -clip). The real masks
#   hold finfo(float32).min (-3.4e38); plain min-max calibration on them gives the masks and the
#   "scores + mask" sums a uint16 step of ~5e33, every real attention score rounds to the same value and
#   attention collapses to a uniform average (decisions near 0.5 at 256 tokens). Clipped, the step is
#   clip/65535; at run time finfo.min saturates to -clip and exp(-100) is 0 in float32, so masking is
#   unchanged. 0 = no clip (plain min-max: only to reproduce the collapse).
#
# Runs in two venvs (onnxruntime-qnn must not share one with another onnxruntime), each made on
# first use from pinned requirements, under ${XDG_CACHE_HOME:-$HOME/.cache}/laya-edge/ (a new one
# when its requirements change), with python3.11 if it runs, else python3 (LAYA_VENV_PYTHON: another):
#   export venv  tools/qnn/requirements-export.txt  torch, laya 0.3.20, onnx (export, fidelity report)
#   qnn venv     tools/qnn/requirements-qnn.txt     onnxruntime-qnn 2.7.0 (quantize, compile, simulate)
# The first run downloads them from PyPI (torch with CUDA's libraries: a few GB). To use venvs of your
# own instead, name their pythons: LAYA_EXPORT_PY, LAYA_QNN_PY. Needs x86_64 Linux, glibc >= 2.35 (the
# HTP simulator in the onnxruntime-qnn wheel).
set -eu

usage() { sed -n '2,4p' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
CKPT=$1
OUT=$2
shift 2
REQUESTS=""
CLIP=100
LENGTHS="128 256"
EVAL=40
CAL=48
NAME=""
while [ $# -gt 0 ]; do
    case $1 in
        --requests) REQUESTS=$2; shift 2 ;;
        --mask-clip) CLIP=$2; shift 2 ;;
        --lengths) LENGTHS=$2; shift 2 ;;
        --eval-rows) EVAL=$2; shift 2 ;;
        --cal-rows) CAL=$2; shift 2 ;;
        --name) NAME=$2; shift 2 ;;
        *) usage ;;
    esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
[ -f "$CKPT/rl_agent_config.json" ] || { echo "build_graphs.sh: $CKPT is not a laya checkpoint (no rl_agent_config.json)" >&2; exit 1; }

# venv_python NAME REQUIREMENTS [INCLUDED...]: the python of the cached venv NAME made from
# REQUIREMENTS (which includes the INCLUDED files with -r), making it first if it is not there. Its
# directory name carries a hash of those files and of the python's version, so a change to either
# makes a new venv; .installed marks one whose install finished.
venv_python() {
    if [ -n "${LAYA_VENV_PYTHON:-}" ]; then
        base_py=$LAYA_VENV_PYTHON
    elif python3.11 -c '' >/dev/null 2>&1; then
        base_py=python3.11
    else
        base_py=python3
    fi
    name=$1
    shift
    version=$("$base_py" -c 'import sys; print(sys.version)') || {
        echo "build_graphs.sh: $base_py does not run: LAYA_VENV_PYTHON names the python to make venvs with" >&2
        return 1
    }
    key=$( { echo "$version"; cat "$@"; } | sha256sum | cut -c1-16)
    cache=${XDG_CACHE_HOME:-$HOME/.cache}/laya-edge
    dir=$cache/qnn-$name-venv-$key
    if [ ! -x "$dir/bin/python" ] || [ ! -f "$dir/.installed" ]; then
        echo "build_graphs.sh: making the $name venv $dir from ${1#"$HERE/"} with $base_py (once)" >&2
        rm -rf "$dir"
        mkdir -p "$cache"
        "$base_py" -m venv "$dir" >&2
        if ! "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$1" >&2; then
            echo "build_graphs.sh: could not install $1 into a venv of $base_py (the pins are for Python" \
                "3.11 on x86_64 Linux; LAYA_VENV_PYTHON names another python, LAYA_EXPORT_PY and" \
                "LAYA_QNN_PY venvs of your own)" >&2
            return 1
        fi
        touch "$dir/.installed"
    fi
    echo "$dir/bin/python"
}
EXPORT_PY=${LAYA_EXPORT_PY:-$(venv_python export "$HERE/requirements-export.txt")}
QNN_PY=${LAYA_QNN_PY:-$(venv_python qnn "$HERE/requirements-qnn.txt" "$HERE/requirements.txt")}
NAME=${NAME:-$(basename "$(cd "$CKPT" && pwd)")}
BUILD=$OUT/build
mkdir -p "$BUILD"

if [ -z "$REQUESTS" ]; then
    REQUESTS=$BUILD/generated_requests.jsonl
    python3 "$HERE/make_requests.py" generate --out "$REQUESTS" --n 240
fi
python3 "$HERE/make_requests.py" split --requests "$REQUESTS" --cal "$BUILD/cal_requests.jsonl" \
    --heldout "$BUILD/heldout_requests.jsonl"

# shellcheck disable=SC2086 # $LENGTHS is a list
"$EXPORT_PY" "$HERE/export_encoder.py" --build "$BUILD" --checkpoint "$CKPT" --name "$NAME" \
    --requests "$BUILD/cal_requests.jsonl" --heldout-requests "$BUILD/heldout_requests.jsonl" \
    --eval-rows "$EVAL" --cal-rows "$CAL" --lengths $LENGTHS
# shellcheck disable=SC2086
"$QNN_PY" "$HERE/build_context.py" --build "$BUILD" --out "$OUT" --subdir . --models "$NAME" \
    --lengths $LENGTHS --mask-clip "$CLIP" --no-refs 2>&1 | grep --line-buffered -v -e '^WARNING:root' -e LIBNATIVE
"$EXPORT_PY" "$HERE/fidelity_report.py" --build "$BUILD" --name "$NAME" --checkpoint "$CKPT" \
    --requests "$BUILD/heldout_requests.jsonl" --json "$OUT/fidelity_report.json"
echo "binaries and sidecars in $OUT (intermediates in $BUILD, safe to delete)"
