#!/usr/bin/env bash
# Checks of the Yocto layer (yocto-layer/) that need no Yocto build:
#   1. oelint-adv --release wrynose over every recipe, append, include, class and layer.conf:
#      no finding at all, infos included (rules off for the whole layer, and why:
#      yocto-layer/.oelint.cfg; the few off for one line say why above the line), but the two
#      that the generated laya-edge-crates.inc must have, accepted in that file only
#      (tools/yocto/oelint.sh);
#   2. laya-edge-crates.inc matches Cargo.lock (tools/yocto/crates_inc.py --check);
#      laya-edge_git.bb's SRCREV is a full hash of HEAD or an ancestor, its PV that commit's
#      version, and the crates.inc that commit's crate list (tools/yocto/pin_srcrev.py --check;
#      in a shallow clone without the commit, or outside git: skipped with a message); and the
#      agent at that commit has what the layer uses: every cargo feature a PACKAGECONFIG option
#      passes is in its agent/Cargo.toml, and it handles every signal the unit sends it (SIGHUP
#      for ExecReload=, SIGTERM to stop) (tools/yocto/pin_agent.py; a shallow clone without the
#      commit fails: fetch the history);
#   3. the recipe's LICENSE covers every crate linked into laya-edge (tools/yocto/licenses.py,
#      which asks `cargo metadata`; skipped without cargo);
#   4. LIC_FILES_CHKSUM's md5 of the repository's LICENSE (tools/yocto/lic_files_chksum.py);
#   5. the kas files load and validate as kas loads them, every layer repository is pinned to a
#      full commit hash, the qcom file drops meta-qcom's AUTOREV kernel variants (an offline
#      parse), and the laya-edge fetch they set up works from a detached checkout, replayed with
#      git (tools/yocto/check_kas.py);
#   6. the example configuration is valid TOML;
#   7. systemd-analyze verify on laya-edge.service, alone and with each board drop-in;
#   8. the checks can fail: checks 1-5 rerun on a copy with one known breakage each, and each
#      must fail saying why (tools/yocto/mutations.sh).
# Idempotent; runs from anywhere (it changes to the repository root). The Python tools live in
# a venv under the cache directory, rebuilt only when tools/yocto/requirements.txt changes.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '== yocto: %s\n' "$*"; }

# Fallback for standalone runs (tools/test.sh installs these up front): as root with apt-get, install
# the packages, running apt-get update at most once per run. Returns non-zero if it could not.
apt_updated=
apt_install() {  # apt_install PACKAGE...
    command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] || return 1
    say "installing $*"
    if [ -z "$apt_updated" ]; then
        apt_updated=1
        apt-get update -qq || return 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# --- tools ------------------------------------------------------------------------------
cache_root="${LAYA_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/laya-edge}"
req=tools/yocto/requirements.txt
req_hash="$(sha256sum "$req" | cut -c1-16)"
venv="$cache_root/yocto-venv-$req_hash"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.installed" ]; then
    say "creating $venv"
    rm -rf "$venv"
    mkdir -p "$cache_root"
    if ! "$python" -m venv "$venv" 2>/dev/null; then
        # Debian's python3 keeps venv/ensurepip in a separate package.
        rm -rf "$venv"
        apt_install python3-venv || true
        "$python" -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$req"
    touch "$venv/.installed"
fi
vpy="$venv/bin/python"

# --- 1. oelint-adv ----------------------------------------------------------------------
say "oelint-adv $("$venv/bin/oelint-adv" --version | awk '{print $NF}')"
bash tools/yocto/oelint.sh "$venv/bin/oelint-adv"

# --- 2. crates ------------------------------------------------------------------------------
say "laya-edge-crates.inc against Cargo.lock"
"$vpy" tools/yocto/crates_inc.py --check
say "laya-edge_git.bb's pinned SRCREV"
"$vpy" tools/yocto/pin_srcrev.py --check
say "the pinned agent has what the layer uses"
"$vpy" tools/yocto/pin_agent.py

# --- 3. licences --------------------------------------------------------------------------
if command -v cargo >/dev/null 2>&1; then
    say "crate licences against the recipe's LICENSE"
    "$vpy" tools/yocto/licenses.py --check
else
    say "SKIPPED licence check: cargo is not installed"
fi

# --- 4. LIC_FILES_CHKSUM ----------------------------------------------------------------
say "LIC_FILES_CHKSUM against the repository's LICENSE"
"$vpy" tools/yocto/lic_files_chksum.py

# --- 5. kas ---------------------------------------------------------------------------------
say "kas files"
"$vpy" tools/yocto/check_kas.py

# --- 8. mutations (before 6-7, whose unit checks end the script) -----------------------------
say "the checks above, each on a known breakage"
bash tools/yocto/mutations.sh "$vpy" "$venv/bin/oelint-adv"

# --- 6. example configuration ---------------------------------------------------------------
conf=yocto-layer/recipes-laya/laya-edge/files/laya-edge.toml
"$vpy" -c 'import sys, tomllib; tomllib.load(open(sys.argv[1], "rb"))' "$conf"
say "$conf parses"

# --- 7. systemd unit --------------------------------------------------------------------
if ! command -v systemd-analyze >/dev/null 2>&1; then
    apt_install systemd || true
fi
if ! command -v systemd-analyze >/dev/null 2>&1; then
    say "SKIPPED systemd-analyze verify: systemd-analyze is not installed and could not be"
    exit 0
fi

# verify checks that ExecStart's binary exists and is executable, so the unit is rendered the
# way the recipe renders it (@BINDIR@, @SYSCONFDIR@) but pointing at a stub in a temporary
# directory, and loaded from there with each drop-in as the board layers render it.
# verify exits 0 on most findings (unknown keys, bad values are "ignoring" warnings), so any
# output at all is a failure.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/etc/laya-edge"
printf '#!/bin/sh\nexit 0\n' > "$tmp/bin/laya-edge"
chmod 0755 "$tmp/bin/laya-edge"
cp "$conf" "$tmp/etc/laya-edge/laya-edge.toml"

unit_src=yocto-layer/recipes-laya/laya-edge/files/laya-edge.service
qnn_src=yocto-layer/dynamic-layers/qcom/recipes-laya/laya-edge/files/qnn.conf
rknn_src=yocto-layer/dynamic-layers/rockchip/recipes-laya/laya-edge/files/rknn.conf

verify() {  # verify NAME [DROPIN_SRC SED_EXPR]
    local name="$1" dir="$tmp/units-$1" out rc=0
    mkdir -p "$dir"
    sed -e "s,@BINDIR@,$tmp/bin,g" -e "s,@SYSCONFDIR@,$tmp/etc,g" "$unit_src" > "$dir/laya-edge.service"
    if [ $# -gt 1 ]; then
        mkdir -p "$dir/laya-edge.service.d"
        sed -e "$3" "$2" > "$dir/laya-edge.service.d/$(basename "$2")"
        if grep -q '@[A-Z_]*@' "$dir/laya-edge.service.d/$(basename "$2")"; then
            echo "$2: a placeholder is left after rendering" >&2
            return 1
        fi
    fi
    out="$(SYSTEMD_UNIT_PATH="$dir:" systemd-analyze verify --man=no "$dir/laya-edge.service" 2>&1)" || rc=$?
    if [ "$rc" -ne 0 ] || [ -n "$out" ]; then
        printf '%s\n' "$out" >&2
        echo "systemd-analyze verify failed for $name (exit $rc)" >&2
        return 1
    fi
    say "systemd-analyze verify: $name ok"
}

say "systemd-analyze $(systemd-analyze --version | head -n1 | awk '{print $2}')"
verify base
verify qnn "$qnn_src" 's,@ADSP_LIBRARY_PATH@,/usr/share/qcom/qcm6490/Thundercomm/RB3gen2/dsp/cdsp,'
verify qnn-no-adsp-path "$qnn_src" '/@ADSP_LIBRARY_PATH@/d'
verify rknn "$rknn_src" 's,@RKNN_LIB@,/usr/lib/librknnrt-2.3.2/librknnrt.so,'
verify rknn-no-runtime "$rknn_src" '/@RKNN_LIB@/d'
