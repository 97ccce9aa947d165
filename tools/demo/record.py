#!/usr/bin/env python3
"""Record the demo model's test material for laya-edge (tests/conformance/it/demo_model.rs).

Usage:  python tools/demo/record.py --model models/demo --out tests/fixtures/demo

- `heldout.jsonl`: demo-style requests drawn by `tickets.request` with a seed neither training nor
  validation used, each with the generator's labels (`{"request", "labels"}`). Nothing here ran the
  model: the labels come from the ticket's latent facts.
- `laya-answers.jsonl`: what laya 0.3.20's own `Agent.predict` answers on the demo requests of
  config/demo-requests.jsonl and on the first held-out requests (`{"request", "result"}`).
- `laya-accuracy.json`: the share of held-out decisions `laya.Agent` gets right against the
  generator's labels, overall and per question type (what the Rust test's floors are set from).
"""
import argparse
import json
import os
import random
import sys
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.pop("LAYA_CPU_AMP", None)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import laya.agent  # noqa: E402
import tickets  # noqa: E402

torch.set_num_threads(1)  # one thread: far faster than two on the shared 2-core machine

HELDOUT_SEED = 20261130
HELDOUT_N = 400
COMPARED_N = 40


def jline(obj):
    return json.dumps(obj, ensure_ascii=False) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/demo")
    ap.add_argument("--out", default="tests/fixtures/demo")
    ap.add_argument("--demo-requests", default="config/demo-requests.jsonl")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    rng = random.Random(HELDOUT_SEED)
    heldout = []
    for i in range(HELDOUT_N):
        req, labels, _ = tickets.request(rng, "heldout-%d" % i)
        heldout.append({"request": req, "labels": labels})
    with open(os.path.join(args.out, "heldout.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(jline(h) for h in heldout)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent = laya.agent.Agent(args.model, device="cpu")
    with open(args.demo_requests, encoding="utf-8") as f:
        demo = [json.loads(line) for line in f if line.strip()]
    compared = demo + [h["request"] for h in heldout[:COMPARED_N]]
    with open(os.path.join(args.out, "laya-answers.jsonl"), "w", encoding="utf-8") as f:
        for req in compared:
            kw = {k: req[k] for k in ("lang", "max_len", "head_max_len") if k in req}
            result = agent.predict(req["state"], req["questions"], **kw)
            f.write(jline({"request": req, "result": result}))
    right = total = 0
    by_type = {}
    for h in heldout:
        res = agent.predict(h["request"]["state"], h["request"]["questions"])
        for qid, label in h["labels"].items():
            a = res["answers"][qid]
            if a["type"] == "noul":
                ok = (a["noul"] >= 0.5) == label
            elif a["type"] == "choice":
                ok = a["choice"] == label
            else:
                probs = a["probabilities"]
                ok = max(range(len(probs)), key=lambda i: probs[str(i)]) == label
            right += ok
            total += 1
            r, n = by_type.get(a["type"], (0, 0))
            by_type[a["type"]] = (r + ok, n + 1)
    print("laya.Agent on the held-out set: %d/%d = %.4f" % (right, total, right / total), file=sys.stderr)
    acc = {"requests": HELDOUT_N, "questions": total, "right": right, "accuracy": round(right / total, 4),
           "by_type": {k: {"right": r, "questions": n, "accuracy": round(r / n, 4)} for k, (r, n) in sorted(by_type.items())}}
    with open(os.path.join(args.out, "laya-accuracy.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(acc, indent=2) + "\n")
    print(json.dumps(acc, indent=2), file=sys.stderr)


if __name__ == "__main__":
    main()
