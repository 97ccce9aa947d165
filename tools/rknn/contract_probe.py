#!/usr/bin/env python3
"""What Rockchip's simulator does with inputs outside the graph's contract (laya-edge never sends them).

Runs in the toolkit's venv; builds the ONNX model again (the simulator does not run a loaded .rknn):

    /work/rknn-venv/bin/python tools/rknn/contract_probe.py --onnx tools/rknn/build/demo.onnx \
        --rows tools/rknn/build/demo.rows.jsonl

Takes the first probe row and prints the simulator's first logits for: the row as it is; qtype 3, 100
and -1; an extra marker pointing into the padding; a marker_mask with a gap (1, 0, 1); marker_mask
values of 2. The fake runtime (tests/fake-rknn) refuses all of these with RKNN_ERR_INPUT_INVALID, on
purpose: it is stricter than the runtime so that a padding bug in the backend shows up.
"""
import argparse
import json
import os
import shutil
import tempfile

import numpy as np


def feeds(ids, markers, qtype, pad_id, L=512, K=64, mmask=None):
    f = [np.full((1, L), pad_id, np.int64), np.zeros((1, L), np.int64), np.zeros((1, K), np.int64),
         np.zeros((1, K), np.int64), np.array([qtype], np.int64)]
    f[0][0, : len(ids)] = ids
    f[1][0, : len(ids)] = 1
    f[2][0, : len(markers)] = markers
    f[3][0, : len(markers)] = 1
    if mmask is not None:
        f[3][0, :] = mmask
    return f


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--rows", required=True)
    ap.add_argument("--pad-id", type=int, default=3)
    a = ap.parse_args()
    onnx_path, rows_path = os.path.abspath(a.onnx), os.path.abspath(a.rows)
    from rknn.api import RKNN
    scratch = tempfile.mkdtemp(prefix="rknn-probe-")
    os.chdir(scratch)
    try:
        r = RKNN(verbose=False)
        r.config(target_platform="rk3588", float_dtype="float16", optimization_level=3)
        assert r.load_onnx(model=onnx_path) == 0 and r.build(do_quantization=False) == 0
        assert r.init_runtime() == 0
        row = json.loads(open(rows_path).readline())
        ids, m = row["input_ids"], row["marker_pos"]
        k = len(m)
        cases = [("as laid out", feeds(ids, m, row["qtype"], a.pad_id))]
        cases += [(f"qtype {q}", feeds(ids, m, q, a.pad_id)) for q in (3, 100, -1)]
        cases.append((f"a marker in the padding (position {len(ids) + 10})", feeds(ids, m + [len(ids) + 10], 0, a.pad_id)))
        gap = np.zeros(64, np.int64)
        gap[[0, 2]] = 1
        cases.append(("marker_mask 1,0,1", feeds(ids, m, 0, a.pad_id, mmask=gap)))
        two = np.zeros(64, np.int64)
        two[:k] = 2
        cases.append(("marker_mask 2 on the options", feeds(ids, m, 0, a.pad_id, mmask=two)))
        print(f"row {row['request']}:{row['qid']} laya's float logits {[round(x, 4) for x in row['torch_logits']]}")
        for name, f in cases:
            try:
                out = r.inference(inputs=f, data_format=["nchw"] * 5)[0].reshape(-1)
                print(f"{name}: {[float(x) for x in out[: k + 2]]}")
            except Exception as e:  # the simulator raises from its onnxruntime session
                print(f"{name}: error: {str(e).splitlines()[-1][:200]}")
        r.release()
    finally:
        os.chdir("/")
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
