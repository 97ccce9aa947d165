#!/usr/bin/env bash
# Every board laya-edge runs on (QCS6490, RK3588) is aarch64. This cross-builds the agent for
# aarch64-unknown-linux-gnu (release profile, both NPU features) and the fake vendor runtimes, and
# runs the end-to-end tests against that build under qemu-user: the x86 test binaries drive the
# aarch64 `laya-edge` (LAYA_EDGE_BIN) and hand it the aarch64 fake runtimes (LAYA_FAKE_LIB_DIR), so
#   - `layout` and `predict --backend cpu` on every fixture request against laya's recorded answers
#     (agent/tests/fixtures_cli.rs, the tolerances of the x86 tests),
#   - `predict --backend rknn` and `--backend qnn` through the fake runtimes, the RKNN `serve` round
#     trip and both watchdog tests (agent/tests/rknn_cli.rs, the fake-runtime tests of qnn_cli.rs),
#   - one `serve` round trip over mosquitto (x86 broker, emulated agent) with a worker killed and
#     replaced (agent/tests/serve_restart.rs)
# run on the board's instruction set, with the board's `#[repr(C)]` layouts (`rknn_context` is a
# u64 there). It also type-checks the agent for 32-bit ARM (armv7-unknown-linux-gnueabihf, where
# `rknn_context` is a u32), which meta-qcom's 32-bit machines would build.
#
# An emulated agent starts its worker process with execve, so the kernel must run aarch64 ELF
# files itself: the script registers qemu-aarch64 with binfmt_misc (root; idempotent).
#
# Installs what it needs on a Debian machine (root): gcc-aarch64-linux-gnu, libc6-dev-arm64-cross,
# gcc-arm-linux-gnueabihf, libc6-dev-armhf-cross, qemu-user; the two Rust targets through rustup.
# Usage: tools/cross/aarch64.sh            (from anywhere; called by tools/test.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."

say() { printf '== cross: %s\n' "$*"; }
TARGET=aarch64-unknown-linux-gnu
ARMV7=armv7-unknown-linux-gnueabihf
SYSROOT=/usr/aarch64-linux-gnu

# --- tools ------------------------------------------------------------------------------
need=()
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
[ -e "$SYSROOT/lib/ld-linux-aarch64.so.1" ] || need+=(libc6-dev-arm64-cross)
command -v arm-linux-gnueabihf-gcc >/dev/null 2>&1 || need+=(gcc-arm-linux-gnueabihf)
[ -e /usr/arm-linux-gnueabihf/lib/ld-linux-armhf.so.3 ] || need+=(libc6-dev-armhf-cross)
command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user)
if [ "${#need[@]}" -gt 0 ]; then
    say "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
installed="$(rustup target list --installed)"
for t in "$TARGET" "$ARMV7"; do
    grep -qx "$t" <<<"$installed" || rustup target add "$t"
done

# --- binfmt_misc: the kernel runs aarch64 executables through qemu-aarch64 --------------------
binfmt=/proc/sys/fs/binfmt_misc
[ -e "$binfmt/register" ] || mount -t binfmt_misc binfmt_misc "$binfmt"
if [ ! -e "$binfmt/qemu-aarch64" ]; then
    # The ELF header of an aarch64 executable (e_machine 0xb7), the mask of the bytes that must
    # match, and F: the interpreter is opened now, so it works in any mount namespace.
    magic='\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
    mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
    printf '%s' ":qemu-aarch64:M::$magic:$mask:$(command -v qemu-aarch64):F" > "$binfmt/register"
fi
# The emulated programs' dynamic loader and libc.
export QEMU_LD_PREFIX="$SYSROOT"

# --- build ------------------------------------------------------------------------------
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CARGO_TARGET_ARMV7_UNKNOWN_LINUX_GNUEABIHF_LINKER=arm-linux-gnueabihf-gcc
export CC_armv7_unknown_linux_gnueabihf=arm-linux-gnueabihf-gcc
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
out="$target_dir/$TARGET/release"

say "cargo build --release --target $TARGET (laya-edge with qnn+rknn, fake-rknn, fake-qnn)"
start=$(date +%s)
cargo build --locked --release --target "$TARGET" -p laya-edge -p fake-rknn -p fake-qnn \
    --features laya-edge/qnn,laya-edge/rknn
say "built in $(( $(date +%s) - start )) s"
for f in "$out/laya-edge" "$out/libfake_rknn.so" "$out/libfake_qnn.so"; do
    # e_machine at offset 18: 0xb7 0x00 is aarch64.
    [ "$(od -An -tx1 -j18 -N2 "$f" | tr -d ' ')" = "b700" ] || { echo "$f is not an aarch64 ELF file" >&2; exit 1; }
done
"$out/laya-edge" --version

say "cargo check --target $ARMV7 (laya-edge with qnn+rknn: the 32-bit ABI mirrors)"
cargo check --locked --target "$ARMV7" -p laya-edge --features qnn,rknn

# --- the end-to-end tests, emulated ------------------------------------------------------------
say "end-to-end tests against the aarch64 build under qemu-aarch64"
start=$(date +%s)
LAYA_EDGE_BIN="$out/laya-edge" LAYA_FAKE_LIB_DIR="$out" \
    cargo test --locked -p laya-edge --features qnn,rknn \
    --test fixtures_cli --test serve_restart --test rknn_cli --test qnn_cli -- \
    layout_gives_lavas_rows predict_on_the_cpu_gives serve_answers_like \
    predict_with_the_rknn_backend serve_with_the_rknn_backend rknn_runtime_is_restarted \
    qnn_runtime_is_restarted dlc_is_compiled_once predict_with_the_qnn_backend_on_the_fake_runtime
say "emulated tests took $(( $(date +%s) - start )) s"
