"""PyTorch CPU rows/second of laya 0.3.20 on a checkpoint, on the benchmark requests.

The requests are the fixture requests of model bpe-t5 whose questions are all valid (the same
set `cargo bench --bench cpu_rows` uses). One warm-up pass, then `--passes` timed passes.

    /work/venv/bin/python tools/bench/laya_rows_per_sec.py --model DIR [--requests 40] [--passes 3]
"""
import argparse
import json
import os
import time

import torch

import laya

CASES = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "laya-0.3.20", "cases.jsonl")


def requests(limit):
    out = []
    with open(CASES) as f:
        for line in f:
            case = json.loads(line)
            if case["model"] != "bpe-t5" or "error" in case["predict_all"]:
                continue
            if not case["request"]["questions"]:
                continue
            out.append(case["request"])
            if len(out) == limit:
                break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    agent = laya.Agent(args.model, device="cpu")
    reqs = requests(args.requests)
    rows = sum(len(r["questions"]) for r in reqs)
    kw = lambda r: {k: r[k] for k in ("lang", "max_len", "head_max_len") if k in r}
    for r in reqs:
        agent.predict(r["state"], r["questions"], **kw(r))
    t, c = time.perf_counter(), time.process_time()
    best, best_cpu = float("inf"), float("inf")  # the fastest pass: the one least disturbed
    for _ in range(args.passes):
        pt, pc = time.perf_counter(), time.process_time()
        for r in reqs:
            agent.predict(r["state"], r["questions"], **kw(r))
        best, best_cpu = min(best, time.perf_counter() - pt), min(best_cpu, time.process_time() - pc)
    dt, cpu = time.perf_counter() - t, time.process_time() - c
    print(json.dumps({"impl": "laya-0.3.20-pytorch", "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "requests": len(reqs), "rows": rows * args.passes, "seconds": round(dt, 3),
                      "rows_per_second": round(rows * args.passes / dt, 2),
                      "rows_per_cpu_second": round(rows * args.passes / cpu, 2),
                      "best_pass_rows_per_second": round(rows / best, 2),
                      "best_pass_rows_per_cpu_second": round(rows / best_cpu, 2)}))


if __name__ == "__main__":
    main()
