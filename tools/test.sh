#!/usr/bin/env bash
# The test suite on a fresh Debian machine (and what .ci/run runs): installs what the tests need,
# then runs `cargo fmt --check`, the Yocto layer checks, `cargo clippy --all-targets -D warnings`,
# `cargo test --workspace --locked` (one test binary per test crate, RUST_TEST_THREADS=4 by
# default: most tests wait on a broker or a worker process, not on the CPU), and the aarch64
# build's end-to-end tests under emulation (tools/cross/aarch64.sh, which installs its own cross
# tools). Each step says how long it took.
#
#   tools/test.sh [extra cargo test arguments]
#
# Installs, only what is missing:
#   - from apt: mosquitto (a real broker for the MQTT tests; 2.0.13 or later, from
#     bookworm-backports on Debian 12 whose own 2.0.11 ignores the Receive Maximum), openssl (test certificates),
#     python3-venv (Debian's python3 keeps venv/ensurepip apart; .ci/yocto-checks.sh makes a
#     venv), python3-pip (tools/qnn/fetch-runtime.sh downloads a wheel with pip) and systemd
#     (systemd-analyze, for the unit checks), nodejs and npm (the Node client example, Node
#     18.7 or later: Debian 12's will do), mender-client and mender-artifact (the Mender update
#     module's test drives the real client), curl and prometheus (the HTTP door's tests: curl as a
#     client, promtool and a Prometheus server scraping /metrics). As root, or through sudo.
#   - the client examples' pinned packages (tools/examples.sh: a venv, `npm ci`).
#   - Qualcomm's x86-64 QNN HTP simulator (pinned, from PyPI's onnxruntime-qnn wheel; never
#     committed) into target/qnn-runtime with tools/qnn/fetch-runtime.sh, exported as
#     LAYA_QNN_LIB_DIR (a directory you set yourself is used as it is).
# The tests that need the simulator or the examples' packages are #[ignore]d with the reason (a
# plain `cargo test` lists them as ignored, never as passed); this script runs them with
# --include-ignored, and such a test that runs without what it needs fails.
# Needs a Rust toolchain (rust-version in Cargo.toml) and network access to the package registries.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"

need=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
command -v mosquitto_passwd >/dev/null 2>&1 || need+=(mosquitto)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
"$python" -c 'import ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
"$python" -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v mender >/dev/null 2>&1 || need+=(mender-client)
command -v mender-artifact >/dev/null 2>&1 || need+=(mender-artifact)
command -v curl >/dev/null 2>&1 || need+=(curl)
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need+=(prometheus)
if [ "${#need[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        sudo=()
    elif command -v sudo >/dev/null 2>&1; then
        sudo=(sudo)
    else
        echo "tools/test.sh: needs ${need[*]} from apt: run it as root or install them" >&2
        exit 1
    fi
    echo "== installing ${need[*]}"
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# mosquitto 2.0.13 or later: earlier versions do not honour a client's Receive Maximum
# (eclipse/mosquitto#2306), which the delivery tests check. Debian 12 ships 2.0.11; its
# bookworm-backports has a fixed one.
mosquitto_bin="$(command -v mosquitto || echo /usr/sbin/mosquitto)"
# (`mosquitto -h` exits with status 3: hence `|| true`.)
mosquitto_version="$({ "$mosquitto_bin" -h 2>/dev/null || true; } | sed -n 's/^mosquitto version \([0-9.]*\).*/\1/p' | head -1)"
if [ "$(printf '%s\n%s\n' "$mosquitto_version" 2.0.13 | sort -V | head -1)" != 2.0.13 ]; then
    codename="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
    if [ "$codename" != bookworm ]; then
        echo "tools/test.sh: mosquitto $mosquitto_version is older than 2.0.13 (it ignores the Receive Maximum); install a newer one" >&2
        exit 1
    fi
    if [ "$(id -u)" = 0 ]; then sudo=(); else sudo=(sudo); fi
    echo "== mosquitto $mosquitto_version ignores the Receive Maximum: installing it from bookworm-backports"
    echo "deb http://deb.debian.org/debian bookworm-backports main" |
        "${sudo[@]}" tee /etc/apt/sources.list.d/laya-edge-bookworm-backports.list >/dev/null
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends -t bookworm-backports mosquitto >/dev/null
fi
echo "== mosquitto $({ "$mosquitto_bin" -h 2>/dev/null || true; } | sed -n 's/^mosquitto version \([0-9.]*\).*/\1/p' | head -1)"

if [ -z "${LAYA_QNN_LIB_DIR:-}" ]; then
    LAYA_QNN_LIB_DIR="$(tools/qnn/fetch-runtime.sh)"
fi
export LAYA_QNN_LIB_DIR
echo "== QNN simulator: $LAYA_QNN_LIB_DIR"

# rustfmt and clippy come with rustup's default profile; a minimal toolchain lacks them.
if command -v rustup >/dev/null 2>&1; then
    for c in rustfmt clippy; do
        rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
    done
fi

step() { printf '== %s took %d s\n' "$1" "$(( $(date +%s) - $2 ))"; }
all=$(date +%s)

# Formatting first: it takes a second and fails for the smallest reason.
t=$(date +%s)
cargo fmt --all --check
step "cargo fmt --check" "$t"

# The Yocto layer: oelint-adv, crates.inc in sync with Cargo.lock, licences, kas, the systemd unit.
t=$(date +%s)
bash .ci/yocto-checks.sh
step "yocto checks" "$t"

# The Python and Node client examples (agent/tests/it/examples.rs runs them against `serve`): their
# pinned packages in a venv and examples/node/node_modules.
LAYA_EXAMPLES_PYTHON="$(tools/examples.sh)"
export LAYA_EXAMPLES_PYTHON
echo "== examples: $LAYA_EXAMPLES_PYTHON, node $(node --version)"

# laya 0.4.15's own RemoteRouter, which agent/tests/it/http_door.rs points at the HTTP door.
if [ -z "${LAYA_SERVE_PYTHON:-}" ]; then
    LAYA_SERVE_PYTHON="$(tools/laya-remote-venv.sh)"
fi
export LAYA_SERVE_PYTHON
echo "== laya 0.4.15 for RemoteRouter: $LAYA_SERVE_PYTHON"

# Lints ([workspace.lints] in Cargo.toml): every target, both NPU features.
t=$(date +%s)
cargo clippy --workspace --all-targets --locked --features laya-edge/qnn,laya-edge/rknn -- -D warnings
step "cargo clippy" "$t"

t=$(date +%s)
# --include-ignored goes to the test binaries: after the caller's own `--` if they gave one.
case " $* " in
*" -- "*) test_args=("$@" --include-ignored) ;;
*) test_args=("$@" -- --include-ignored) ;;
esac
# The output also goes to a log: when a test fails, what it panicked with is repeated at the end,
# where a CI page that keeps only the head and the tail of a long run still shows it.
test_log="$(mktemp)"
if ! RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}" cargo test --workspace --locked "${test_args[@]}" 2>&1 | tee "$test_log"; then
    echo "== cargo test failed; what the failing tests panicked with:"
    grep -E -A6 "^---- .* stdout ----$|panicked at" "$test_log" | grep -v -E "^ +[0-9]+: |^ +at " | head -n 200 || true
    rm -f "$test_log"
    exit 1
fi
rm -f "$test_log"
step "cargo test" "$t"

# The boards are aarch64: the agent cross-built and its end-to-end tests run under qemu-user,
# reusing the x86 test binaries just built (tools/cross/aarch64.sh).
t=$(date +%s)
bash tools/cross/aarch64.sh
step "aarch64 cross build and emulated tests" "$t"
step "tools/test.sh" "$all"
