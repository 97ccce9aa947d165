#!/usr/bin/env bash
# The Yocto layer checks can fail: each one is run on a copy of the repository with one known
# breakage, and must fail there. .ci/yocto-checks.sh runs this after the checks have passed on
# the real tree, so a check that passes a breakage has stopped checking it.
#
#   tools/yocto/mutations.sh PYTHON OELINT
#
# PYTHON is the venv's python (kas, tomllib), OELINT its oelint-adv. The copy is a shared clone
# of this repository (its history, for the SRCREV checks) with the working tree's files on top,
# in a temporary directory; the real tree is never touched. No network.
set -euo pipefail
cd "$(dirname "$0")/../.."
vpy="$1"
oelint="$2"
root="$PWD"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
copy="$tmp/repo"
git clone -q --shared --no-checkout "$root" "$copy" 2>/dev/null
git -C "$root" ls-files -z | tar --null -T - -cf - | tar -xf - -C "$copy"
git -C "$copy" reset -q

recipe_dir=yocto-layer/recipes-laya/laya-edge
failures=0
# In a shallow clone without the pinned commit, pin_srcrev.py and check_kas.py cannot check the
# pin at all (the former says so); the mutations that need the commit are skipped then.
srcrev="$(sed -n 's/^SRCREV = "\(.*\)"$/\1/p' "$copy/$recipe_dir/laya-edge_git.bb")"
have_pin=1
git -C "$copy" cat-file -e "$srcrev^{commit}" 2>/dev/null || have_pin=

# mutate DESCRIPTION FILE PYTHON_EDIT EXPECTED -- CHECK...: apply the edit (Python: s is the
# file's text, assign the new text to s), run the check in the copy, restore the file. The check
# must exit non-zero and say EXPECTED (a fixed string), so that it failed for this breakage.
mutate() {
    local desc="$1" file="$2" edit="$3" expected="$4" rc=0 why
    shift 5
    cp "$copy/$file" "$tmp/saved"
    "$vpy" - "$copy/$file" "$edit" <<'EOF'
import sys
path, edit = sys.argv[1], sys.argv[2]
s = open(path).read()
before = s
exec(edit)
if s == before:
    sys.exit(f"mutation did not change {path}: {edit}")
open(path, "w").write(s)
EOF
    (cd "$copy" && "$@") >"$tmp/out" 2>&1 || rc=$?
    cp "$tmp/saved" "$copy/$file"
    if [ "$rc" -eq 0 ] || ! grep -qF -- "$expected" "$tmp/out"; then
        echo "== yocto: MUTATION NOT CAUGHT: $desc: '$*' exited $rc without saying '$expected':" >&2
        sed 's/^/    /' "$tmp/out" >&2
        failures=$((failures + 1))
    else
        why="$(grep -F -m1 -- "$expected" "$tmp/out" | cut -c1-150)"
        echo "== yocto: mutation caught: $desc: $why"
    fi
}

lint() {  # the oelint run of .ci/yocto-checks.sh, on the copy
    bash tools/yocto/oelint.sh "$oelint"
}

mutate "SRCREV above SRC_URI in laya-edge_git.bb (style rule oelint.var.order.SRC_URI)" \
    "$recipe_dir/laya-edge_git.bb" \
    "import re; a = re.search(r'^SRC_URI = .*\n', s, re.M).group(0); s = s.replace(a, '', 1).replace('DEFAULT_PREFERENCE', a + 'DEFAULT_PREFERENCE', 1)" \
    "oelint.var.order.SRC_URI" -- lint
dyn_line="$(grep -n '^BBFILES_DYNAMIC' "$copy/yocto-layer/conf/layer.conf" | cut -d: -f1)"
mutate "BBFILES_DYNAMIC += \" \\ in layer.conf (the crates file's accepted findings, in another file)" \
    yocto-layer/conf/layer.conf \
    "s = s.replace('BBFILES_DYNAMIC += \"qcom:', 'BBFILES_DYNAMIC += \" \\\\\n    qcom:', 1)" \
    "yocto-layer/conf/layer.conf:$dyn_line:error:oelint.vars.inconspaces" -- lint
mutate "a crate's sha256 changed in laya-edge-crates.inc" \
    "$recipe_dir/laya-edge-crates.inc" \
    "import re; m = re.search(r'sha256sum\] = \"(.)', s); s = s[:m.start(1)] + ('0' if m.group(1) != '0' else '1') + s[m.end(1):]" \
    "is out of date with Cargo.lock" -- "$vpy" tools/yocto/crates_inc.py --check
if [ -n "$have_pin" ]; then
    mutate "SRCREV a hash that is no commit" \
        "$recipe_dir/laya-edge_git.bb" \
        "import re; s = re.sub(r'^SRCREV = \".*\"', 'SRCREV = \"' + '0123456789abcdef' * 2 + '01234567\"', s, flags=re.M)" \
        "0123456789abcdef" -- env LAYA_PIN_SHALLOW=fail "$vpy" tools/yocto/pin_srcrev.py --check
fi
orphan="$(git -C "$copy" commit-tree -m "not on any branch" "HEAD^{tree}")"
mutate "SRCREV a commit that is not an ancestor of HEAD" \
    "$recipe_dir/laya-edge_git.bb" \
    "import re; s = re.sub(r'^SRCREV = \".*\"', 'SRCREV = \"$orphan\"', s, flags=re.M)" \
    "${orphan:0:12}" -- env LAYA_PIN_SHALLOW=fail "$vpy" tools/yocto/pin_srcrev.py --check
# pin_agent.py reads the pinned commit: in a shallow clone without it, it fails for that reason.
if [ -n "$have_pin" ]; then
    # The pin the layer once had (156 commits behind): no `demo` feature, no SIGHUP handler.
    old_pin=cd482b7a9f21dbab7bc56956f735b0ad0320aeca
    if git -C "$copy" cat-file -e "$old_pin^{commit}" 2>/dev/null; then
        mutate "SRCREV back to ${old_pin:0:7} (no demo feature, no SIGHUP handler): the cargo feature" \
            "$recipe_dir/laya-edge_git.bb" \
            "import re; s = re.sub(r'^SRCREV = \".*\"', 'SRCREV = \"$old_pin\"', s, flags=re.M)" \
            "cargo feature \`demo\`" -- "$vpy" tools/yocto/pin_agent.py
        mutate "SRCREV back to ${old_pin:0:7} (no demo feature, no SIGHUP handler): the signal" \
            "$recipe_dir/laya-edge_git.bb" \
            "import re; s = re.sub(r'^SRCREV = \".*\"', 'SRCREV = \"$old_pin\"', s, flags=re.M)" \
            "the unit sends SIGHUP" -- "$vpy" tools/yocto/pin_agent.py
    fi
    mutate "a PACKAGECONFIG option naming a cargo feature the pinned agent does not have" \
        "$recipe_dir/laya-edge.inc" \
        "s = s.replace('PACKAGECONFIG[rknn] = \"--features rknn\"', 'PACKAGECONFIG[rknn] = \"--features rknn\"\nPACKAGECONFIG[gpu] = \"--features gpu\"', 1)" \
        "cargo feature \`gpu\`" -- "$vpy" tools/yocto/pin_agent.py
    mutate "the recipe installing a file of the source tree the pinned commit does not have" \
        "$recipe_dir/laya-edge.inc" \
        "s = s.replace('\${S}/ota/mender/laya-model', '\${S}/ota/mender/no-such-module', 1)" \
        "ota/mender/no-such-module" -- "$vpy" tools/yocto/pin_agent.py
    mutate "the unit sending SIGUSR1 to reload, which the pinned agent does not handle" \
        yocto-layer/recipes-laya/laya-edge/files/laya-edge.service \
        "s = s.replace('kill -HUP', 'kill -USR1', 1)" \
        "the unit sends SIGUSR1" -- "$vpy" tools/yocto/pin_agent.py
fi
mutate "SRCREV AUTOREV in the default recipe" \
    "$recipe_dir/laya-edge_git.bb" \
    "import re; s = re.sub(r'^SRCREV = \".*\"', 'SRCREV = \"\${AUTOREV}\"', s, flags=re.M)" \
    "follows AUTOREV" -- env LAYA_PIN_SHALLOW=fail "$vpy" tools/yocto/pin_srcrev.py --check
mutate "LIC_FILES_CHKSUM's md5 of LICENSE changed" \
    "$recipe_dir/laya-edge.inc" \
    "s = s.replace('file://LICENSE;md5=3', 'file://LICENSE;md5=4', 1)" \
    "LIC_FILES_CHKSUM says md5=4" -- "$vpy" tools/yocto/lic_files_chksum.py
mutate "a character of LICENSE changed" \
    LICENSE \
    "s = s.replace('Version 2.0', 'Version 2.1', 1)" \
    "the file's is" -- "$vpy" tools/yocto/lic_files_chksum.py
mutate "meta-qcom's commit pin dropped from rb3gen2-core-kit.yml" \
    yocto-layer/kas/rb3gen2-core-kit.yml \
    "import re; s = re.sub(r'(\n  meta-qcom:\n(?:    .*\n)*?)    commit: .*\n', r'\\1', s, count=1)" \
    "repository meta-qcom has no commit" -- "$vpy" tools/yocto/check_kas.py
mutate "meta-arm's commit pin cut to 12 hex digits in rock-5b.yml" \
    yocto-layer/kas/rock-5b.yml \
    "import re; s = re.sub(r'(\n  meta-arm:\n(?:    .*\n)*?    commit: )([0-9a-f]{12})[0-9a-f]+', r'\\1\\2', s, count=1)" \
    "is not a full 40-hex commit hash" -- "$vpy" tools/yocto/check_kas.py
mutate "linux-qcom-next's devupstream variant kept in rb3gen2-core-kit.yml (an offline parse fails)" \
    yocto-layer/kas/rb3gen2-core-kit.yml \
    "import re; s = re.sub(r'^ *BBCLASSEXTEND:remove:pn-linux-qcom-next = .*\n', '', s, count=1, flags=re.M)" \
    "does not drop linux-qcom-next's AUTOREV devupstream variant" -- "$vpy" tools/yocto/check_kas.py
if [ -n "$have_pin" ]; then
    mutate "usehead=1 dropped from the kas files' LAYA_EDGE_REPO (finding 6)" \
        yocto-layer/kas/include/laya-common.yml \
        "s = s.replace(';usehead=1', '', 1)" \
        "in branch main even from upstream" -- "$vpy" tools/yocto/check_kas.py
else
    echo "== yocto: SKIPPED the mutations that need the pinned commit ${srcrev:0:12}: not in this shallow clone"
fi
if command -v cargo >/dev/null 2>&1; then
    mutate "MIT dropped from the recipe's LICENSE" \
        "$recipe_dir/laya-edge.inc" \
        "s = s.replace(' & MIT', '', 1)" \
        "does not cover" -- "$vpy" tools/yocto/licenses.py --check
fi

if [ "$failures" -ne 0 ]; then
    echo "== yocto: $failures mutation(s) not caught" >&2
    exit 1
fi
