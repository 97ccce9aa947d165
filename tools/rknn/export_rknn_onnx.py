#!/usr/bin/env python3
"""Export a laya 0.3.20 checkpoint as the RK3588 model card's ONNX graph (the RKNN graph interface).

Runs in a torch venv (laya==0.3.20, transformers 5.17.0, torch, onnx; /work/venv-demo works):

    /work/venv-demo/bin/python tools/rknn/export_rknn_onnx.py --checkpoint models/demo --out build/demo.onnx

The graph is laya's own `DecisionModel.forward` (the model `laya.Agent` loads: `build_model` + the
checkpoint's weights), traced with eager attention:

    inputs   input_ids      1 x L  int64   tokens, padded with the tokenizer's pad id
             attention_mask 1 x L  int64   1 over the tokens, 0 over the padding
             marker_pos     1 x K  int64   the options' marker positions, padded with 0
             marker_mask    1 x K  int64   1 over the real options, 0 past them
             qtype          1      int64   0 choice, 1 score, 2 noul
    output   logits         1 x K  float   the scorer's logits, -10000 in the slots past the options

with L = 512 and K = 64 by default (static shapes), ONNX opset 18. The act head's output is not part
of the graph. laya writes the slots past the options with `masked_fill(~marker_mask, -1e4)`, which
exports as Where(Not(Cast(mask)), -1e4, raw); as the model card says, that final logit mask is
rewritten to Mul/Add:

    logits = raw * m + (m * 10000 - 10000),   m = Cast(marker_mask, float)

(exactly -10000 where m = 0, exactly raw where m = 1, also in float16). If onnxruntime is importable
the script checks the rewritten ONNX model against laya's own PyTorch forward on two padded rows (build_rknn.py
always checks it on the probe rows).
"""
import argparse
import json
import os
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

OPSET = 18
INPUTS = ["input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype"]
MISSING = -10000.0


class Graph(torch.nn.Module):
    """laya's DecisionModel with the card's five int64 inputs and the logits as the only output."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, marker_pos, marker_mask, qtype):
        logits, _act = self.model(input_ids, attention_mask, marker_pos, marker_mask.bool(), qtype)
        return logits


def load_agent(ckpt):
    """laya 0.3.20's own loader (build_model + weights + compatibility checks), on the CPU in float32,
    with eager attention in the encoder (what the card exported)."""
    import laya
    agent = laya.Agent(ckpt, device="cpu")
    model = agent.model.float().eval()
    enc = model.encoder
    if hasattr(enc, "set_attn_implementation"):
        enc.set_attn_implementation("eager")
    else:
        enc.config._attn_implementation = "eager"
    assert enc.config._attn_implementation == "eager", enc.config._attn_implementation
    return agent, model


def pad_row(ids, markers, qtype, pad_id, L, K):
    """One row padded to (L, K) exactly as laya-edge's RKNN backend pads it (agent/src/backend/npu/rknn/inputs.rs)."""
    assert len(ids) <= L and len(markers) <= K, (len(ids), len(markers))
    f = {
        "input_ids": np.full((1, L), pad_id, dtype=np.int64),
        "attention_mask": np.zeros((1, L), dtype=np.int64),
        "marker_pos": np.zeros((1, K), dtype=np.int64),
        "marker_mask": np.zeros((1, K), dtype=np.int64),
        "qtype": np.array([qtype], dtype=np.int64),
    }
    f["input_ids"][0, : len(ids)] = ids
    f["attention_mask"][0, : len(ids)] = 1
    f["marker_pos"][0, : len(markers)] = markers
    f["marker_mask"][0, : len(markers)] = 1
    return f


def consumers(graph, name):
    return [n for n in graph.node if name in n.input]


def producer(graph, name):
    return next((n for n in graph.node if name in n.output), None)


def const_value(graph, name):
    """The value of `name` if it is an initializer or a Constant node's output, else None."""
    from onnx import numpy_helper
    for init in graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    p = producer(graph, name)
    if p is not None and p.op_type == "Constant":
        for a in p.attribute:
            if a.name == "value":
                return numpy_helper.to_array(a.t)
    return None


def rewrite_logit_mask(m):
    """Replaces the Where that writes -1e4 into the logits (laya's masked_fill) with Mul/Add on the
    float marker mask. Returns a description of what was replaced."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    g = m.graph
    out = g.output[0].name
    # Walk back from the output through shape-preserving nodes to the Where.
    node = producer(g, out)
    while node is not None and node.op_type in ("Cast", "Identity", "Squeeze", "Reshape") and node.op_type != "Where":
        node = producer(g, node.input[0])
    assert node is not None and node.op_type == "Where", f"no Where before the output (found {node and node.op_type})"
    cond, a, b = node.input
    va, vb = const_value(g, a), const_value(g, b)
    if va is not None and va.size == 1 and float(va.reshape(-1)[0]) == MISSING:
        raw, fill_when = b, True   # Where(cond, -1e4, raw): cond true = slot masked
    elif vb is not None and vb.size == 1 and float(vb.reshape(-1)[0]) == MISSING:
        raw, fill_when = a, False  # Where(cond, raw, -1e4): cond true = slot kept
    else:
        raise AssertionError(f"the Where before the output does not write {MISSING}: {a}={va} {b}={vb}")
    mf = "rknn_marker_mask_f"
    kept, scaled, offset = "rknn_logits_kept", "rknn_mask_scaled", "rknn_mask_offset"
    g.initializer.extend([
        numpy_helper.from_array(np.array(-MISSING, dtype=np.float32), "rknn_ten_thousand"),
        numpy_helper.from_array(np.array(MISSING, dtype=np.float32), "rknn_minus_ten_thousand"),
    ])
    new = [
        helper.make_node("Cast", ["marker_mask"], [mf], to=TensorProto.FLOAT, name="rknn_mask_cast"),
        helper.make_node("Mul", [raw, mf], [kept], name="rknn_mask_mul"),
        helper.make_node("Mul", [mf, "rknn_ten_thousand"], [scaled], name="rknn_mask_scale"),
        helper.make_node("Add", [scaled, "rknn_minus_ten_thousand"], [offset], name="rknn_mask_offset"),
        helper.make_node("Add", [kept, offset], [node.output[0]], name="rknn_mask_add"),
    ]
    idx = list(g.node).index(node)
    g.node.remove(node)
    for k, n in enumerate(new):
        g.node.insert(idx + k, n)
    removed = prune(m)
    onnx.checker.check_model(m)
    cond_chain = [n for n in removed]
    return {"replaced": f"Where({cond}, {a}, {b})", "fill_when_condition": fill_when,
            "removed_dead_nodes": cond_chain}


def prune(m):
    """Removes nodes whose outputs nothing uses (the Not/Cast/Equal that fed the Where). Returns their op types."""
    g = m.graph
    removed = []
    while True:
        used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
        dead = [n for n in g.node if not any(o in used for o in n.output)]
        if not dead:
            break
        for n in dead:
            removed.append(n.op_type)
            g.node.remove(n)
    used = {i for n in g.node for i in n.input}
    for init in [i for i in g.initializer if i.name not in used]:
        g.initializer.remove(init)
    return removed


@torch.no_grad()
def torch_logits(graph, feeds):
    t = {k: torch.from_numpy(v) for k, v in feeds.items()}
    return graph(*(t[k] for k in INPUTS)).numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a laya 0.3.20 checkpoint directory")
    ap.add_argument("--out", required=True, help="the ONNX file to write")
    ap.add_argument("--seq-len", type=int, default=512, help="compiled sequence length L (card: 512)")
    ap.add_argument("--marker-slots", type=int, default=64, help="compiled marker slots K (card: 64)")
    a = ap.parse_args()
    import laya
    import onnx
    import transformers

    L, K = a.seq_len, a.marker_slots
    t0 = time.time()
    agent, model = load_agent(os.path.abspath(a.checkpoint))
    pad_id = int(agent.tok.pad_token_id)
    graph = Graph(model).eval()
    # An example row (the shapes are static; values only need to be valid).
    n = min(L, 40)
    example = pad_row(list(range(5, 5 + n)), [1, 2, 3], 0, pad_id, L, K)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)) or ".", exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            graph,
            tuple(torch.from_numpy(example[k]) for k in INPUTS),
            a.out,
            input_names=INPUTS,
            output_names=["logits"],
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    m = onnx.load(a.out)
    ops_before = sorted({n.op_type for n in m.graph.node})
    rewrite = rewrite_logit_mask(m)
    m = onnx.shape_inference.infer_shapes(m)
    onnx.checker.check_model(m)
    onnx.save(m, a.out)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in list(m.graph.input) + list(m.graph.output)}
    want = {"input_ids": [1, L], "attention_mask": [1, L], "marker_pos": [1, K], "marker_mask": [1, K], "qtype": [1],
            "logits": [1, K]}
    assert shapes == want, shapes
    t_export = time.time() - t0

    # The rewritten ONNX model against laya's PyTorch forward on two padded rows, with onnxruntime if this
    # venv has it (onnx.reference cannot run GatherElements over 512 positions); build_rknn.py repeats the
    # check on the probe rows in the toolkit's venv, which has onnxruntime.
    checks, runner = [], None
    try:
        import onnxruntime as ort
        sess = ort.InferenceSession(a.out, providers=["CPUExecutionProvider"])
        runner = f"onnxruntime {ort.__version__} CPU"
        for qtype, n, k in ((0, min(L, 37), 4), (2, min(L, 90), 2)):
            f = pad_row([5 + (i * 7) % 200 for i in range(n)], list(range(1, k + 1)), qtype, pad_id, L, K)
            want = torch_logits(graph, f)
            got = sess.run(["logits"], f)[0]
            assert np.all(got[0, k:] == MISSING), got[0, k:]
            checks.append(float(np.abs(got - want).max()))
    except ImportError:
        pass
    ops = sorted({n.op_type for n in m.graph.node})
    meta = {
        "checkpoint": os.path.abspath(a.checkpoint),
        "seq_len": L,
        "marker_slots": K,
        "pad_token_id": pad_id,
        "opset": OPSET,
        "exporter": "torch.onnx.export(dynamo=False), do_constant_folding=True, eager attention",
        "logit_mask_rewrite": rewrite,
        "onnx_nodes": len(m.graph.node),
        "onnx_ops": ops,
        "onnx_ops_before_rewrite": ops_before,
        "check_onnx_vs_torch": ({"runner": runner, "max_abs": max(checks)} if checks
                                else "skipped (no onnxruntime here; build_rknn.py checks the ONNX model on the probe rows)"),
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "laya": getattr(laya, "__version__", "0.3.20"),
                     "onnx": onnx.__version__, "numpy": np.__version__},
        "export_seconds": round(t_export, 2),
    }
    with open(os.path.splitext(a.out)[0] + ".export.json", "w") as fh:
        json.dump(meta, fh, indent=1)
    print(f"{a.out}: L={L} K={K} nodes={len(m.graph.node)} rewrite={rewrite['replaced']} "
          f"(removed {rewrite['removed_dead_nodes']}) onnx-vs-torch={max(checks) if checks else 'skipped'} in {t_export:.1f} s", flush=True)


if __name__ == "__main__":
    main()
