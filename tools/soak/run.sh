#!/usr/bin/env bash
# Makes (once) a venv with requirements.txt in target/soak-venv and runs soak.py with the
# arguments given, e.g.  tools/soak/run.sh flood --broker mqtt://127.0.0.1:18830 --agent-pid PID
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$root/target/soak-venv"
if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv" >&2
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$root/tools/soak/requirements.txt" >&2
exec "$venv/bin/python" "$root/tools/soak/soak.py" "$@"
