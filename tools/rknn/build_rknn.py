#!/usr/bin/env python3
"""Build the RKNN graph (RKNN-Toolkit2 2.3.2, rk3588, fp16) and check it on Rockchip's x86 simulator.

Runs in the toolkit's own venv (python3.11, tools/rknn/requirements.txt):

    /work/rknn-venv/bin/python tools/rknn/build_rknn.py --onnx build/demo.onnx --out demo.rknn \
        --rows build/demo.rows.jsonl

1. Builds FILE.rknn from the ONNX model of export_rknn_onnx.py with the model card's settings:
   target_platform=rk3588, float_dtype=float16, optimization_level=3, no quantization
   (the card also lists disable_rules=["seperate_conv_split"]; passed when this toolkit's config() accepts it).
2. Writes the sidecar FILE.json beside it: {"seq_len", "marker_slots", "target", "dtype", "toolkit",
   "checkpoint", "onnx_sha256", ...}; `laya-edge bundle --rknn FILE.rknn` reads seq_len and marker_slots.
3. With --rows (rknn_rows.py's output: laya's own layout and float logits), pads every row to the graph's
   shape exactly as laya-edge's RKNN backend does (agent/src/backend/npu/rknn/inputs.rs: input_ids padded with the
   pad id and attention_mask 0 there, marker_pos padded with 0 and marker_mask 0 there), runs it on
   Rockchip's simulator (`init_runtime()` with no target) and on onnxruntime (CPU, float32), and writes
   FILE.sim.json: per row the five padded inputs, the simulator's 64 logits, the float model's logits and
   the differences. Prints max |simulator - PyTorch| per row.
"""
import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

INPUTS = ["input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype"]
MISSING = -10000.0
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def repo_relative(path):
    path = os.path.abspath(path)
    return os.path.relpath(path, REPO) if path.startswith(REPO + os.sep) else path


def pad_row(row, pad_id, L, K):
    """The row padded like agent/src/backend/npu/rknn/inputs.rs `Padded::fill`."""
    ids, markers = row["input_ids"], row["marker_pos"]
    assert len(ids) <= L and len(markers) <= K, (len(ids), len(markers))
    f = {
        "input_ids": np.full((1, L), pad_id, dtype=np.int64),
        "attention_mask": np.zeros((1, L), dtype=np.int64),
        "marker_pos": np.zeros((1, K), dtype=np.int64),
        "marker_mask": np.zeros((1, K), dtype=np.int64),
        "qtype": np.array([row["qtype"]], dtype=np.int64),
    }
    f["input_ids"][0, : len(ids)] = ids
    f["attention_mask"][0, : len(ids)] = 1
    f["marker_pos"][0, : len(markers)] = markers
    f["marker_mask"][0, : len(markers)] = 1
    return f


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--out", required=True, help="the .rknn to write (the sidecar FILE.json and FILE.sim.json go beside it)")
    ap.add_argument("--rows", help="probe rows from rknn_rows.py (JSON lines); without it, no simulator run")
    ap.add_argument("--checkpoint", help="recorded in the sidecar; default: the one in the ONNX model's .export.json")
    a = ap.parse_args()
    for k in ("onnx", "out", "rows", "checkpoint"):
        if getattr(a, k):
            setattr(a, k, os.path.abspath(getattr(a, k)))
    # The toolkit writes its intermediate check*.onnx files into the working directory: give it a
    # scratch one.
    import shutil
    import tempfile
    scratch = tempfile.mkdtemp(prefix="rknn-build-")
    os.chdir(scratch)
    try:
        run(a)
    finally:
        os.chdir(REPO)
        shutil.rmtree(scratch, ignore_errors=True)


def run(a):
    import onnx
    from rknn.api import RKNN

    export_meta_path = os.path.splitext(a.onnx)[0] + ".export.json"
    export_meta = json.load(open(export_meta_path)) if os.path.exists(export_meta_path) else {}
    m = onnx.load(a.onnx)
    dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in m.graph.input}
    assert [i.name for i in m.graph.input] == INPUTS, dims
    L, K = dims["input_ids"][1], dims["marker_pos"][1]
    pad_id = int(export_meta.get("pad_token_id", 0))
    del m

    rknn = RKNN(verbose=False)
    cfg = dict(target_platform="rk3588", float_dtype="float16", optimization_level=3)
    import inspect
    params = inspect.signature(rknn.config).parameters
    accepts_rules = "disable_rules" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())
    if accepts_rules:
        cfg["disable_rules"] = ["seperate_conv_split"]
    t0 = time.time()
    assert rknn.config(**cfg) == 0, "config"
    assert rknn.load_onnx(model=a.onnx) == 0, "load_onnx"
    assert rknn.build(do_quantization=False) == 0, "build"
    os.makedirs(os.path.dirname(os.path.abspath(a.out)) or ".", exist_ok=True)
    assert rknn.export_rknn(a.out) == 0, "export_rknn"
    t_build = time.time() - t0

    import rknn as rknn_pkg
    toolkit = getattr(rknn_pkg, "__version__", None) or _toolkit_version()
    base = os.path.splitext(a.out)[0]
    checkpoint = a.checkpoint or export_meta.get("checkpoint")
    sidecar = {
        "seq_len": L,
        "marker_slots": K,
        "target": "rk3588",
        "dtype": "fp16",
        "toolkit": toolkit,
        "checkpoint": repo_relative(checkpoint) if checkpoint else None,
        "onnx_sha256": sha256(a.onnx),
        "rknn_sha256": sha256(a.out),
        "pad_token_id": pad_id,
        "inputs": {"input_ids": [1, L], "attention_mask": [1, L], "marker_pos": [1, K], "marker_mask": [1, K],
                   "qtype": [1]},
        "output": {"logits": [1, K]},
        "missing_marker_logit": MISSING,
        "build": {k: v for k, v in cfg.items()} | {"do_quantization": False},
        "export": {k: export_meta.get(k) for k in ("opset", "exporter", "logit_mask_rewrite", "versions")},
    }
    with open(base + ".json", "w") as f:
        json.dump(sidecar, f, indent=1)
        f.write("\n")
    print(f"{a.out}: {os.path.getsize(a.out)} bytes, toolkit {toolkit}, built in {t_build:.1f} s "
          f"(disable_rules {'passed' if accepts_rules else 'not accepted by config()'})", flush=True)

    if not a.rows:
        rknn.release()
        return
    rows = [json.loads(line) for line in open(a.rows) if line.strip()]
    import onnxruntime as ort
    sess = ort.InferenceSession(a.onnx, providers=["CPUExecutionProvider"])
    t0 = time.time()
    assert rknn.init_runtime() == 0, "init_runtime (simulator)"
    t_init = time.time() - t0
    out_rows, t_sim = [], 0.0
    for r in rows:
        f = pad_row(r, pad_id, L, K)
        t1 = time.time()
        sim = rknn.inference(inputs=[f[k] for k in INPUTS])[0].astype(np.float32).reshape(-1)
        t_sim += time.time() - t1
        ref = sess.run(["logits"], f)[0].astype(np.float32).reshape(-1)
        k = len(r["marker_pos"])
        torch_l = np.array(r["torch_logits"], dtype=np.float32)
        d_sim = float(np.abs(sim[:k] - torch_l).max())
        d_onnx = float(np.abs(ref[:k] - torch_l).max())
        out_rows.append({
            "request": r["request"], "qid": r["qid"], "tokens": len(r["input_ids"]), "options": k,
            "synthetic": bool(r.get("synthetic", False)),
            "inputs": {name: f[name].reshape(-1).tolist() for name in INPUTS},
            "simulator_logits": [float(x) for x in sim],
            "torch_logits": [float(x) for x in torch_l],
            "onnxruntime_logits": [float(x) for x in ref[:k]],
            "max_abs_simulator_vs_torch": d_sim,
            "max_abs_onnxruntime_vs_torch": d_onnx,
            "simulator_slots_past_options_all_missing": bool(np.all(sim[k:] == MISSING)),
            "argmax_agrees": int(np.argmax(sim[:k])) == int(np.argmax(torch_l)),
        })
        print(f"{r['request']}:{r['qid']} qtype={r['qtype']} tokens={len(r['input_ids'])} options={k} "
              f"max|sim-torch|={d_sim:.4f} max|onnx-torch|={d_onnx:.2e} slots past options: "
              f"{sorted(set(float(x) for x in sim[k:]))}", flush=True)
    rknn.release()
    summary = {
        "rows": len(out_rows),
        "max_abs_simulator_vs_torch": max(r["max_abs_simulator_vs_torch"] for r in out_rows),
        "mean_of_row_max_abs_simulator_vs_torch": float(np.mean([r["max_abs_simulator_vs_torch"] for r in out_rows])),
        "max_abs_onnxruntime_vs_torch": max(r["max_abs_onnxruntime_vs_torch"] for r in out_rows),
        "argmax_agreement": sum(r["argmax_agrees"] for r in out_rows),
        "every_slot_past_the_options_is_missing": all(r["simulator_slots_past_options_all_missing"] for r in out_rows),
    }
    doc = {
        "what": "Rockchip's RKNN-Toolkit2 x86 simulator (init_runtime() with no target) on the probe rows, padded "
                "like agent/src/backend/npu/rknn/inputs.rs; torch_logits: laya 0.3.20's own float forward, unpadded",
        "rknn": os.path.basename(a.out),
        "rknn_sha256": sidecar["rknn_sha256"],
        "rows_from": repo_relative(a.rows),
        "seq_len": L, "marker_slots": K, "pad_token_id": pad_id,
        "toolkit": toolkit,
        "versions": {"python": sys.version.split()[0], "numpy": np.__version__, "onnx": onnx.__version__,
                     "onnxruntime": ort.__version__},
        "seconds": {"build": round(t_build, 1), "init_runtime": round(t_init, 1), "inference_total": round(t_sim, 1)},
        "summary": summary,
        "rows": out_rows,
    }
    with open(base + ".sim.json", "w") as f:
        json.dump(doc, f)
        f.write("\n")
    print(json.dumps(summary | {"seconds": doc["seconds"]}), flush=True)


def _toolkit_version():
    from importlib.metadata import version
    return version("rknn-toolkit2")


if __name__ == "__main__":
    main()
