#!/usr/bin/env bash
# Every board laya-edge runs on (QCS6490, RK3588) is aarch64. This cross-builds the agent for
# aarch64-unknown-linux-gnu (profile `cross`: the release profile without LTO, both NPU features,
# no `demo`, as the Yocto recipe builds it) and the fake vendor runtimes, and
# runs the end-to-end tests against that build under qemu-user: the x86 test binaries drive the
# aarch64 `laya-edge` (LAYA_EDGE_BIN) and hand it the aarch64 fake runtimes (LAYA_FAKE_LIB_DIR), so
#   - `layout` and `predict --backend cpu` on every fixture request against laya's recorded answers
#     (agent/tests/it/fixtures_cli.rs, the tolerances of the x86 tests),
#   - `predict --backend rknn` and `--backend qnn` through the fake runtimes, the RKNN `serve` round
#     trip and both watchdog tests (agent/tests/it/rknn_cli.rs, the fake-runtime tests of qnn_cli.rs),
#   - one `serve` round trip over mosquitto (x86 broker, emulated agent) with a worker killed and
#     replaced (agent/tests/it/serve_restart.rs)
# run on the board's instruction set, with the board's `#[repr(C)]` layouts (`rknn_context` is a
# u64 there). No supported board is 32-bit, so nothing is built for 32-bit ARM (issue #26).
#
# An emulated agent starts its worker process with execve, so the kernel must run aarch64 ELF
# files itself: the script registers qemu-aarch64 with binfmt_misc (root or sudo; idempotent).
#
# Installs what it needs on a Debian machine (as root or through sudo): gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross, qemu-user; the Rust target through rustup.
# Usage: tools/cross/aarch64.sh            (from anywhere; called by tools/test.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."

say() { printf '== cross: %s\n' "$*"; }
total=$(date +%s)
TARGET=aarch64-unknown-linux-gnu
SYSROOT=/usr/aarch64-linux-gnu

# --- tools ------------------------------------------------------------------------------
need=()
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
[ -e "$SYSROOT/lib/ld-linux-aarch64.so.1" ] || need+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user)
# As root, or through sudo (as tools/test.sh).
if [ "$(id -u)" = 0 ]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
else
    sudo=(sh -c 'echo "tools/cross/aarch64.sh: needs root or sudo for: $*" >&2; exit 1' --)
fi
if [ "${#need[@]}" -gt 0 ]; then
    say "installing ${need[*]}"
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
installed="$(rustup target list --installed)"
grep -qx "$TARGET" <<<"$installed" || rustup target add "$TARGET"

# --- binfmt_misc: the kernel runs aarch64 executables through qemu-aarch64 --------------------
binfmt=/proc/sys/fs/binfmt_misc
[ -e "$binfmt/register" ] || "${sudo[@]}" mount -t binfmt_misc binfmt_misc "$binfmt"
if [ ! -e "$binfmt/qemu-aarch64" ]; then
    # The ELF header of an aarch64 executable (e_machine 0xb7), the mask of the bytes that must
    # match, and F: the interpreter is opened now, so it works in any mount namespace.
    magic='\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
    mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
    printf '%s' ":qemu-aarch64:M::$magic:$mask:$(command -v qemu-aarch64):F" | "${sudo[@]}" tee "$binfmt/register" >/dev/null
fi
# The emulated programs' dynamic loader and libc.
export QEMU_LD_PREFIX="$SYSROOT"

# --- build ------------------------------------------------------------------------------
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
out="$target_dir/$TARGET/cross"

say "cargo build --profile cross --target $TARGET (laya-edge with qnn+rknn and no demo, fake-rknn, fake-qnn)"
start=$(date +%s)
cargo build --locked --profile cross --target "$TARGET" -p laya-edge -p fake-rknn -p fake-qnn \
    --no-default-features --features laya-edge/qnn,laya-edge/rknn
say "built in $(( $(date +%s) - start )) s"
for f in "$out/laya-edge" "$out/libfake_rknn.so" "$out/libfake_qnn.so"; do
    # e_machine at offset 18: 0xb7 0x00 is aarch64.
    [ "$(od -An -tx1 -j18 -N2 "$f" | tr -d ' ')" = "b700" ] || { echo "$f is not an aarch64 ELF file" >&2; exit 1; }
done
"$out/laya-edge" --version

# --- the end-to-end tests, emulated ------------------------------------------------------------
# The x86 test binaries of the workspace build (tools/test.sh has built them already: nothing is
# rebuilt; `--workspace`, not `-p laya-edge --features`, so the features unify as in that build).
# The agent's test binary (agent/tests/it); the filters match the names of these tests only, in its
# fixtures_cli, serve_restart, rknn_cli and qnn_cli modules.
tests=(--test it)
filters=(
    layout_gives_layas_rows predict_on_the_cpu_gives_layas serve_answers_like_the_cpu_pipeline
    predict_with_the_rknn_backend serve_with_the_rknn_backend rknn_runtime_is_restarted
    qnn_runtime_is_restarted dlc_is_compiled_once predict_with_the_qnn_backend_on_the_fake_runtime
)
cargo test --workspace --locked --no-run "${tests[@]}"
# Any test that spawned the x86 `laya-edge` instead of LAYA_EDGE_BIN would prove nothing about the
# board: the x86 binary cannot be executed during the run, so such a test fails ("starts").
x86="$target_dir/debug/laya-edge"
[ -x "$x86" ] || { echo "no x86 build at $x86" >&2; exit 1; }
chmod a-x "$x86"
trap 'chmod a+x "$x86"' EXIT

say "end-to-end tests against the aarch64 build under qemu-aarch64"
start=$(date +%s)
# The fixture comparison on the cases whose rows are at most 128 tokens (310 of 465): the 512-token
# rows of the larger fixture models took over half an hour emulated.
LAYA_EDGE_BIN="$out/laya-edge" LAYA_FAKE_LIB_DIR="$out" LAYA_FIXTURE_MAX_TOKENS=128 \
    cargo test --workspace --locked "${tests[@]}" -- "${filters[@]}"
say "emulated tests took $(( $(date +%s) - start )) s"
# Had cargo rebuilt the x86 binary, it would be executable again: the run above proved nothing.
[ ! -x "$x86" ] || { echo "the x86 laya-edge was rebuilt during the emulated run" >&2; exit 1; }
chmod a+x "$x86"
trap - EXIT

# --- time per row, emulated (for the README; not a board figure) ------------------------------
# The smallest fixture model over its 155 recorded requests: the emulator's cost per row of the
# host pipeline and a small encoder (the larger fixture models spend minutes on their 512-token rows).
for model in bpe-small; do
    input="$(python3 -c '
import json, sys
for line in open("tests/fixtures/laya-0.3.20/cases.jsonl"):
    case = json.loads(line) if line.strip() else None
    if case and case["model"] == sys.argv[1]:
        print(json.dumps(case["request"]))' "$model")"
    dir="tests/fixtures/laya-0.3.20/models/$model"
    rows="$("$out/laya-edge" layout --model "$dir" <<<"$input" | python3 -c '
import json, sys
print(sum(1 for l in sys.stdin for q in json.loads(l).get("questions", {}).values() if "input_ids" in q))')"
    t0=$(date +%s%N)
    "$out/laya-edge" predict --backend cpu --model "$dir" <<<"$input" >/dev/null
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    say "emulated predict --backend cpu on $model: $rows rows in $ms ms ($(( ms / rows )) ms per row)"
done

say "all done in $(( $(date +%s) - total )) s"
