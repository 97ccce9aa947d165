#!/usr/bin/env python3
"""Probe rows for the RKNN graph, laid out and scored by laya 0.3.20's own code.

Runs in the torch venv (as export_rknn_onnx.py):

    /work/venv-demo/bin/python tools/rknn/rknn_rows.py --checkpoint models/demo \
        --requests tests/fixtures/demo/heldout.jsonl --out build/demo.rows.jsonl

Every request in --requests (one JSON object a line: the request itself or {"request": ...}) is laid out
with `Agent._check_question`, `Agent._to_internal` and `Agent._encode_state` (the token layout laya.Agent
feeds its model). From the distinct rows, --count are picked deterministically so that they span every
question type and short and long states: for each type, the shortest, the longest and the one nearest the
middle length, then the rows with the most options, then the rest in file order. Each row's float logits
come from laya's own forward (`collate_items` + `DecisionModel`, float32 on the CPU, unpadded, sdpa
attention as laya.Agent runs it): the CPU float model the simulator is compared with.

With --edge-rows, two synthetic rows are added that no request of a small checkpoint reaches: one that
fills the graph exactly (L tokens, no padding, all K marker slots used, choice) and one of 3 tokens with a
single option (score). Their token ids are drawn (seeded) from the vocabulary; their float logits come
from laya's forward like the others. They are marked "synthetic": true.

Output, one JSON object a line:
    {"request": id, "qid": qid, "qtype": 0|1|2, "input_ids": [...], "marker_pos": [...], "torch_logits": [...]}
"""
import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)


def layout(agent, path, max_len):
    """[(request id, qid, item)] for every question of every request, distinct layouts, in file order."""
    import laya.agent
    rows, seen = [], set()
    with open(path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    for n, line in enumerate(lines):
        req = line.get("request", line)
        ids = list(req["questions"])
        for qid in ids:
            laya.agent.Agent._check_question(qid, req["questions"][qid])
        internal = {qid: laya.agent.Agent._to_internal(req["questions"][qid]) for qid in ids}
        for qid, item in zip(ids, agent._encode_state(req["state"], ids, internal)):
            key = (tuple(item["ids"]), tuple(item["markers"]), item["qtype"])
            if key in seen or len(item["ids"]) > max_len:
                continue
            seen.add(key)
            rows.append((req.get("id", f"request-{n}"), qid, item))
    return rows


def pick(rows, count):
    chosen = []

    def take(r):
        if r not in chosen and len(chosen) < count:
            chosen.append(r)

    for t in sorted({r[2]["qtype"] for r in rows}):
        of = sorted((r for r in rows if r[2]["qtype"] == t), key=lambda r: len(r[2]["ids"]))
        mid = (len(of[0][2]["ids"]) + len(of[-1][2]["ids"])) / 2
        take(of[0])
        take(of[-1])
        take(min(of, key=lambda r: abs(len(r[2]["ids"]) - mid)))
    for r in sorted(rows, key=lambda r: -len(r[2]["markers"]))[:2]:
        take(r)
    for r in rows:
        take(r)
    return chosen


@torch.no_grad()
def float_logits(model, item, pad_id):
    from laya.common import collate_items
    b = collate_items([[item]], pad_id)
    logits, _ = model(b["input_ids"], b["attention_mask"], b["marker_pos"], b["marker_mask"], b["qtype"])
    return [float(x) for x in logits[0]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--requests", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=12)
    ap.add_argument("--seq-len", type=int, default=512, help="leave out rows longer than the graph's L")
    ap.add_argument("--marker-slots", type=int, default=64, help="the graph's K (for --edge-rows)")
    ap.add_argument("--edge-rows", action="store_true", help="add a full L x K row and a 3-token single-option row")
    a = ap.parse_args()
    import laya
    agent = laya.Agent(os.path.abspath(a.checkpoint), device="cpu")
    model = agent.model.float().eval()
    pad_id = int(agent.tok.pad_token_id)
    rows = pick(layout(agent, a.requests, a.seq_len), a.count)
    if a.edge_rows:
        import random
        rng = random.Random(14)
        vocab = int(model.encoder.config.vocab_size)
        L, K = a.seq_len, a.marker_slots
        full = [rng.randrange(5, vocab) for _ in range(L)]
        rows.append(("synthetic-full", "full", {"ids": full, "markers": [1 + j * (L - 2) // (K - 1) for j in range(K)],
                                                "qtype": 0}))
        rows.append(("synthetic-one-option", "one", {"ids": [rng.randrange(5, vocab) for _ in range(3)], "markers": [1],
                                                     "qtype": 1}))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        for rid, qid, item in rows:
            line = {"request": rid, "qid": qid, "qtype": int(item["qtype"]), "input_ids": item["ids"],
                    "marker_pos": item["markers"], "torch_logits": float_logits(model, item, pad_id)}
            if rid.startswith("synthetic-"):
                line["synthetic"] = True
            f.write(json.dumps(line) + "\n")
    print(f"{a.out}: {len(rows)} rows; qtypes {sorted({r[2]['qtype'] for r in rows})}; tokens "
          f"{sorted(len(r[2]['ids']) for r in rows)}; options {sorted(len(r[2]['markers']) for r in rows)}")


if __name__ == "__main__":
    main()
