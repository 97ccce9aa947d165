"""laya's model through ONNX Runtime's CPU provider, rows/second on the benchmark requests
(the set `cargo bench --bench cpu_rows` and laya_rows_per_sec.py use), issue #16 item 4b; with
--dynamic, one export with dynamic axes for every batch (issue #30: laya 0.4.15's model, e.g.
PYTHONPATH=DIR-WITH-LAYA-0.4.15 in front of the 0.3.20 venv's packages).

laya.Agent answers each request once while its model's forward is recorded: the exact tensors
laya feeds it (one batch per request, padded to the request's longest row). The model is then
exported to ONNX at each recorded batch's exact shape (torch.onnx, opset 17), every
recorded batch is checked against PyTorch's outputs, and the batches are timed through
onnxruntime (CPU provider, 2 intra-op threads) and, for reference, through PyTorch. Only the
model is timed: laya's tokenization, layout and decoding are not (laya-edge's cpu_rows times its
whole pipeline, so this favours ORT).

Needs torch, laya and onnxruntime in one interpreter, e.g. a venv with onnxruntime and the
laya venv's site-packages on PYTHONPATH:

    python -m venv /tmp/ort && /tmp/ort/bin/pip install onnxruntime   # and openvino for --openvino
    PYTHONPATH=/work/venv-demo/lib/python3.11/site-packages /tmp/ort/bin/python \
        tools/bench/ort_rows_per_sec.py --model /tmp/laya-small --requests 40 --passes 2
"""
import argparse
import json
import os
import tempfile
import time

import numpy as np
import onnxruntime as ort
import torch

import laya

from laya_rows_per_sec import requests  # same directory


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dynamic", action="store_true",
                    help="one export with dynamic batch, length and marker axes for every batch, instead of one "
                         "exact-shape export per batch shape (laya 0.4.15's model traces for every length; "
                         "0.3.20's bakes shapes into its reshapes)")
    ap.add_argument("--openvino", action="store_true",
                    help="also time each export through OpenVINO's CPU plugin (f32, --threads threads)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.openvino:
        import openvino as ov
        core = ov.Core()
        ov_config = {"INFERENCE_NUM_THREADS": args.threads, "INFERENCE_PRECISION_HINT": "f32"}
    compiled = {}

    def openvino_of(path, keys):
        """The export at `path` compiled by OpenVINO once, before the file goes, for the shapes `keys`."""
        if args.openvino:
            request = core.compile_model(core.read_model(path), "CPU", ov_config).create_infer_request()
            compiled.update({key: request for key in keys})
    agent = laya.Agent(args.model, device="cpu")
    model = agent.model.eval()
    calls = []
    forward = model.forward

    def recording(*a, **kw):
        calls.append(tuple(x.clone() for x in a[:5]))
        return forward(*a, **kw)

    model.forward = recording
    reqs = requests(args.requests)
    kw = lambda r: {k: r[k] for k in ("lang", "max_len", "head_max_len") if k in r}
    refused = 0
    for r in reqs:
        try:
            agent.predict(r["state"], r["questions"], **kw(r))
        except (TypeError, ValueError):  # laya 0.4.15 refuses a `None` state that 0.3.20 answers
            refused += 1
    model.forward = forward
    rows = sum(c[0].shape[0] for c in calls)
    tokens = sum(int(c[1].sum()) for c in calls)  # real tokens (attention_mask), not padding
    names = ["input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype"]
    tmp = tempfile.mkdtemp()
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    # One export per distinct batch shape: with dynamic axes the export keeps shapes baked into
    # its reshapes. With gradients enabled, as torch.onnx needs: PyTorch's fused encoder-layer
    # fast path (taken under inference_mode) has no ONNX export.
    sessions = {}
    if args.dynamic:
        path = os.path.join(tmp, "laya-dynamic.onnx")
        axes = {"input_ids": {0: "batch", 1: "length"}, "attention_mask": {0: "batch", 1: "length"},
                "marker_pos": {0: "batch", 1: "markers"}, "marker_mask": {0: "batch", 1: "markers"},
                "qtype": {0: "batch"}, "logits": {0: "batch", 1: "markers"}, "act_logits": {0: "batch"}}
        torch.onnx.export(model, calls[0], path, input_names=names, output_names=["logits", "act_logits"],
                          opset_version=17, dynamo=False, dynamic_axes=axes)
        dynamic = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        openvino_of(path, [tuple(tuple(t.shape) for t in c) for c in calls])
        os.remove(path)
        sessions = {tuple(tuple(t.shape) for t in c): dynamic for c in calls}
    for c in calls:
        key = tuple(tuple(t.shape) for t in c)
        if key not in sessions:
            path = os.path.join(tmp, "laya-%d.onnx" % len(sessions))
            torch.onnx.export(model, c, path, input_names=names, output_names=["logits", "act_logits"],
                              opset_version=17, dynamo=False)
            sessions[key] = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            openvino_of(path, [key])
            os.remove(path)  # the session holds the graph; one export on disk at a time
    os.rmdir(tmp)
    sess_of = [sessions[tuple(tuple(t.shape) for t in c)] for c in calls]
    feeds = [{n: t.numpy() for n, t in zip(names, c)} for c in calls]
    ov_of = [compiled.get(tuple(tuple(t.shape) for t in c)) for c in calls]
    worst, ov_worst = 0.0, 0.0
    with torch.inference_mode():
        for c, f, sess, req in zip(calls, feeds, sess_of, ov_of):
            want = model(*c)[0].numpy()
            got = sess.run(["logits"], f)[0]
            worst = max(worst, float(np.abs(want - got).max()))
            if req is not None:
                ov_got = req.infer(f)["logits"]
                ov_worst = max(ov_worst, float(np.abs(want - ov_got).max()))

    def timed(fn):
        """Wall and CPU seconds of all passes, and of the fastest pass (the least disturbed)."""
        for f in range(len(calls)):
            fn(f)
        t, c = time.perf_counter(), time.process_time()
        best, best_cpu = float("inf"), float("inf")
        for _ in range(args.passes):
            pt, pc = time.perf_counter(), time.process_time()
            for f in range(len(calls)):
                fn(f)
            best, best_cpu = min(best, time.perf_counter() - pt), min(best_cpu, time.process_time() - pc)
        return time.perf_counter() - t, time.process_time() - c, best, best_cpu

    # Wall time, and the CPU time of the whole process (every thread): rows per CPU-second is
    # what load on the machine does not skew.
    ort_s, ort_cpu, ort_best, ort_best_cpu = timed(lambda i: sess_of[i].run(None, feeds[i]))
    figures = {}
    if args.openvino:
        ov_s, ov_cpu, ov_best, ov_best_cpu = timed(lambda i: ov_of[i].infer(feeds[i]))
        figures = {"openvino": ov.__version__, "openvino_max_abs_logit_diff_vs_torch": ov_worst,
                   "openvino_rows_per_second": round(rows * args.passes / ov_s, 2),
                   "openvino_rows_per_cpu_second": round(rows * args.passes / ov_cpu, 2),
                   "openvino_best_pass_rows_per_second": round(rows / ov_best, 2),
                   "openvino_best_pass_rows_per_cpu_second": round(rows / ov_best_cpu, 2)}
    with torch.inference_mode():
        torch_s, torch_cpu, _, _ = timed(lambda i: model(*calls[i]))
    print(json.dumps({**figures, "impl": "laya-%s-onnxruntime-cpu" % laya.__version__, "onnxruntime": ort.__version__,
                      "torch": torch.__version__, "threads": args.threads, "requests": len(reqs), "batches": len(calls),
                      "exports": 1 if args.dynamic else len(sessions), "axes": "dynamic" if args.dynamic else "exact",
                      "refused_requests": refused, "rows": rows * args.passes,
                      "tokens_per_row": round(tokens / max(rows, 1), 1), "max_abs_logit_diff_vs_torch": worst,
                      "ort_rows_per_second": round(rows * args.passes / ort_s, 2),
                      "ort_rows_per_cpu_second": round(rows * args.passes / ort_cpu, 2),
                      "ort_best_pass_rows_per_second": round(rows / ort_best, 2),
                      "ort_best_pass_rows_per_cpu_second": round(rows / ort_best_cpu, 2),
                      "torch_model_only_rows_per_second": round(rows * args.passes / torch_s, 2),
                      "torch_model_only_rows_per_cpu_second": round(rows * args.passes / torch_cpu, 2)}))


if __name__ == "__main__":
    main()
