#!/bin/sh
# Fetches Qualcomm's x86-64 QNN HTP simulator runtime from the pinned onnxruntime-qnn wheel on PyPI
# and prints the directory holding it (for LAYA_QNN_LIB_DIR). The libraries are never committed.
#
#   tools/qnn/fetch-runtime.sh [OUT_DIR]      # default: target/qnn-runtime
#
# Extracts libQnnHtp.so, libQnnSystem.so, libHtpPrepare.so and the three libc++ runtime libraries
# they link against (onnxruntime_qnn.libs/), flattened into OUT_DIR: the vendor libraries carry
# RPATH $ORIGIN, so they find their libc++ beside them. OUT_DIR/.version records the wheel version
# extracted; re-running with the libraries present and that version equal to VERSION only prints
# the directory (after a bump of VERSION they are extracted again).
set -eu

VERSION=2.7.0            # onnxruntime-qnn: QNN 2.51.0 (build v2.51.0.260929181845)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-"$ROOT/target/qnn-runtime"}
CACHE=${LAYA_QNN_WHEEL_CACHE:-"$ROOT/target/qnn-wheel-cache"}
PYTHON=${PYTHON:-python3}

STAMP="$OUT/.version"
if [ -f "$OUT/libQnnHtp.so" ] && [ -f "$OUT/libQnnSystem.so" ] && [ -f "$OUT/libHtpPrepare.so" ] \
    && [ "$(cat "$STAMP" 2>/dev/null)" = "$VERSION" ]; then
    echo "$OUT"
    exit 0
fi

mkdir -p "$CACHE" "$OUT"
rm -f "$STAMP"   # an interrupted extraction leaves no stamp
WHEEL=$(ls "$CACHE"/onnxruntime_qnn-"$VERSION"-*manylinux*x86_64.whl 2>/dev/null | head -n 1 || true)
if [ -z "$WHEEL" ]; then
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
        --platform manylinux_2_35_x86_64 --python-version 3.11 \
        --dest "$CACHE" "onnxruntime-qnn==$VERSION" >&2
    WHEEL=$(ls "$CACHE"/onnxruntime_qnn-"$VERSION"-*manylinux*x86_64.whl | head -n 1)
fi

# Python's zipfile rather than unzip, which a fresh machine may not have.
"$PYTHON" - "$WHEEL" "$OUT" >&2 <<'PY'
import os, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
wanted = {"onnxruntime_qnn/libQnnHtp.so", "onnxruntime_qnn/libQnnSystem.so", "onnxruntime_qnn/libHtpPrepare.so"}
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name in wanted or (name.startswith("onnxruntime_qnn.libs/") and not name.endswith("/")):
            with z.open(name) as src, open(os.path.join(out, os.path.basename(name)), "wb") as dst:
                dst.write(src.read())
PY
echo "$VERSION" > "$STAMP"
echo "$OUT"
