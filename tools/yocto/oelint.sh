#!/usr/bin/env bash
# oelint-adv over the layer, as .ci/yocto-checks.sh (check 1) and tools/yocto/mutations.sh run it:
#
#   tools/yocto/oelint.sh OELINT
#
# from the root of a checkout (the real one, or mutations.sh's copy); OELINT is the venv's
# oelint-adv. It lints every recipe, append, include, class and conf/*.conf of yocto-layer/ with
# --release wrynose --mode all and yocto-layer/.oelint.cfg, and fails on any finding, infos
# included, but one: the generated laya-edge-crates.inc must stay byte-identical to what
# `bitbake -c update_crates laya-edge` writes (tools/yocto/crates_inc.py --check), and bitbake
# writes `SRC_URI += " \`, which oelint.vars.inconspaces (an error) and oelint.vars.notneededspace
# (an info) report. oelint-adv can switch a rule off only for the whole layer or for one line
# under a comment, and a comment would make the file differ from bitbake's, so those two rules
# stay on and their findings are accepted in that one file only: anywhere else they fail.
set -euo pipefail
oelint="$1"

crates=yocto-layer/recipes-laya/laya-edge/laya-edge-crates.inc
accepted="^${crates//./\\.}:[0-9]+:(error|info):oelint\\.vars\\.(inconspaces|notneededspace):"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mapfile -t files < <(find yocto-layer -type f \
    \( -name '*.bb' -o -name '*.bbappend' -o -name '*.inc' -o -name '*.bbclass' \
       -o -path 'yocto-layer/conf/*.conf' \) | sort)
rc=0
# oelint-adv exits non-zero on any finding, infos included; --mode all runs the slower rules too.
OELINT_CONFIG="$PWD/yocto-layer/.oelint.cfg" "$oelint" --release wrynose --mode all --quiet \
    --relpaths --output "$tmp/findings" "${files[@]}" 2>"$tmp/stderr" || rc=$?
touch "$tmp/findings"
grep -vE "$accepted" "$tmp/findings" > "$tmp/rest" || true
n_accepted="$(grep -cE "$accepted" "$tmp/findings" || true)"

cat "$tmp/stderr" >&2
if [ -s "$tmp/rest" ]; then
    cat "$tmp/rest" >&2
    echo "oelint: findings in the ${#files[@]} files (oelint-adv exited $rc)" >&2
    exit 1
fi
# A non-zero exit is expected with the accepted findings alone, not with none or with errors.
if [ "$rc" -ne 0 ] && { [ "$n_accepted" -eq 0 ] || [ -s "$tmp/stderr" ]; }; then
    echo "oelint: oelint-adv exited $rc without a finding to show for it" >&2
    exit 1
fi
echo "oelint: ${#files[@]} files, no findings but the $n_accepted accepted in the generated $(basename "$crates")"
