"""laya 0.3.20's host code per request, the model call excluded (issue #16 item 4c): the Python
side of `cargo bench --bench host_pipeline`, on the same requests (the fixture requests of model
bpe-t5 whose questions are all valid) and the same payloads (the request as compact JSON).

Per request: `json.loads` of the payload, then `laya.Agent.predict` itself -- hooks, question
validation (`_check_question`, `_to_internal`), tokenizing the state and laying out each
question (`_encode_state`: `build_sequence`, `render_options`), `collate_items` into tensors,
`_forward`'s conversions (act softmax, `.numpy()`), `_decode_answers` -- with the model's
forward replaced by zeros of the shape it returns (`Agent._infer`, the one place the model is
called), and `json.dumps` of the reply (the result plus id, device, backend, serving, timing_ms,
as laya-edge's reply carries). laya has no memo of recurring texts, so every pass costs the same.

    /work/venv-demo/bin/python tools/bench/laya_host_pipeline.py [--passes 5]
"""
import argparse
import hashlib
import json
import os
import time

import torch

import laya

from laya_rows_per_sec import CASES, requests  # same directory

MODEL = os.path.join(os.path.dirname(CASES), "models", "bpe-t5")


def payloads():
    # The same requests as laya_rows_per_sec.py (bpe-t5, answered, with questions), as JSON bytes.
    return [json.dumps(r, ensure_ascii=False, separators=(",", ":")).encode() for r in requests(None)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    agent = laya.Agent(MODEL, device="cpu")
    n_act = agent.model.act_head[-1].out_features

    def zeros(b):  # the model's outputs for batch b: option logits [rows, kmax], act logits [rows, n_act]
        rows, kmax = b["marker_pos"].shape
        return torch.zeros((rows, kmax)), torch.zeros((rows, n_act))

    agent._infer = zeros
    reqs = payloads()
    questions = sum(len(json.loads(p)["questions"]) for p in reqs)
    keys = ("lang", "max_len", "head_max_len")
    timing = {"queue": 0.0, "tokenize": 0.0, "infer": 0.0, "decode": 0.0, "total": 0.0}

    def answer(payload, stages):
        t0 = time.perf_counter()
        doc = json.loads(payload)
        t1 = time.perf_counter()
        result = agent.predict(doc["state"], doc["questions"], **{k: doc[k] for k in keys if k in doc})
        t2 = time.perf_counter()
        reply = {"id": doc.get("id"), **result, "device": "bench", "backend": "cpu", "serving": "primary",
                 "timing_ms": timing}
        out = json.dumps(reply, ensure_ascii=False, separators=(",", ":")).encode()
        t3 = time.perf_counter()
        stages[0] += t1 - t0
        stages[1] += t2 - t1
        stages[2] += t3 - t2
        return out

    first = [0.0, 0.0, 0.0]
    replies = b"".join(answer(p, first) for p in reqs)
    stages = [0.0, 0.0, 0.0]
    for _ in range(args.passes):
        for p in reqs:
            answer(p, stages)
    n = len(reqs) * args.passes
    us = lambda s, k: round(s * 1e6 / k, 1)
    print(json.dumps({"impl": "laya-0.3.20-python", "python": "%d.%d.%d" % os.sys.version_info[:3],
                      "torch": torch.__version__, "requests": len(reqs), "questions": questions,
                      "passes": args.passes, "payload_bytes": sum(map(len, reqs)), "reply_bytes": len(replies),
                      "replies_sha256": hashlib.sha256(replies).hexdigest(),
                      "first_pass_us_per_request": us(sum(first), len(reqs)),
                      "us_per_request": us(sum(stages), n),
                      "stages_us": {"json_loads": us(stages[0], n), "predict": us(stages[1], n),
                                    "json_dumps": us(stages[2], n)}}))


if __name__ == "__main__":
    main()
