#!/usr/bin/env bash
# A venv with laya 0.4.15 for agent/tests/it/http_door.rs (tools/test.sh runs this and exports
# what it prints as LAYA_SERVE_PYTHON): the test points laya's own `RemoteRouter`
# (laya.mcp.remote, standard library plus numpy) at laya-edge's HTTP door. Installed without
# laya's model stack (torch, transformers: gigabytes, and not imported by RemoteRouter), at
# the versions tests/fixtures/laya-serve-0.4.15 was recorded with
# (tools/fixtures/requirements-serve-0.4.15.txt). Prints the venv's python.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
venv=target/laya-remote/venv
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv" >&2
fi
pin() { grep -E "^$1(\[[a-z]+\])?==" tools/fixtures/requirements-serve-0.4.15.txt | sed 's/\[[a-z]*\]//'; }
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$(pin laya)" "$(pin numpy)" >&2
"$venv/bin/python" -c 'import laya.mcp.remote' >&2
echo "$PWD/$venv/bin/python"
