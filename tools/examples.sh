#!/usr/bin/env bash
# Installs what the client examples need, pinned, for agent/tests/it/examples.rs (tools/test.sh
# runs this before the tests): a venv with examples/python/requirements.txt in
# target/examples/venv, and examples/node/node_modules from package-lock.json (`npm ci`).
# Prints the venv's python; the test finds both at these places (or LAYA_EXAMPLES_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
venv=target/examples/venv
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv" >&2
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r examples/python/requirements.txt >&2
(cd examples/node && npm ci --no-audit --no-fund --loglevel=error >&2)
echo "$PWD/$venv/bin/python"
