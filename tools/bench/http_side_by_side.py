#!/usr/bin/env python3
"""laya-edge's HTTP door against laya.serve, side by side in one run (issue #41, item 9).

    http_side_by_side.py --laya-serve VENV/bin/laya-serve --laya-edge target/release/laya-edge \
        [--model models/demo] [--threads 1] [--requests 300]

Starts laya.serve (uvicorn, laya 0.4.15, offline, the checkpoint registered as
LAYA_EXTRA_MODELS='{"edge": MODEL}', LAYA_DEVICE=cpu, LAYA_THREADS=THREADS) and `laya-edge serve`
with the HTTP door alone (no broker; the CPU backend, engine.threads = THREADS, model_names
["edge"]), then asks each the same laya.serve body (`"model": "edge"`, the demo's first request)
at concurrency 1 and 16 over keep-alive connections (http.client, one thread per connection),
and prints requests/s and p50/p99 latency per server and concurrency as one JSON line. With
`--null`, laya-edge runs the zero-cost `null` backend alone: the door's own round trip.

Not a test: figures go to BENCHMARKS.md with the machine's load. Standard library only.
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def body():
    with open(os.path.join(ROOT, "config", "demo-requests.jsonl")) as f:
        first = json.loads(next(line for line in f if line.strip()))
    return json.dumps({"model": "edge", "state": first["state"], "questions": first["questions"]}).encode()


def wait_ready(port, within=300):
    end = time.time() + within
    while time.time() < end:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("POST", "/v1/systemone", body=BODY, headers={"content-type": "application/json"})
            r = c.getresponse()
            r.read()
            if r.status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"nothing answered 200 on port {port} within {within} s")


def load(port, concurrency, total):
    """`total` requests over `concurrency` keep-alive connections: (requests/s, latencies in ms)."""
    per = total // concurrency
    lat, errors = [], []
    lock = threading.Lock()

    def worker():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        mine = []
        for _ in range(per):
            t0 = time.perf_counter()
            c.request("POST", "/v1/systemone", body=BODY, headers={"content-type": "application/json"})
            r = c.getresponse()
            r.read()
            mine.append((time.perf_counter() - t0) * 1000)
            if r.status != 200:
                errors.append(r.status)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"port {port}: {len(errors)} non-200 answers, e.g. {errors[:3]}")
    lat.sort()
    return {
        "requests": len(lat),
        "rps": round(len(lat) / wall, 1),
        "p50_ms": round(statistics.median(lat), 3),
        "p99_ms": round(lat[min(len(lat) - 1, len(lat) * 99 // 100)], 3),
    }


def start_edge(binary, model, threads, null):
    port = free_port()
    d = tempfile.mkdtemp(prefix="laya-edge-http-bench-")
    cfg = os.path.join(d, "laya-edge.toml")
    backend = "null" if null else "cpu"
    with open(cfg, "w") as f:
        f.write(f'[mqtt]\ndevice = "bench"\n[engine]\nbackend = "{backend}"\nthreads = {threads}\n'
                f'[model]\ndir = "{model}"\n[http]\nlisten = "127.0.0.1:{port}"\nmodel_names = ["edge"]\n'
                f'max_concurrent = 64\n[log]\nlevel = "warn"\n')
    p = subprocess.Popen([binary, "serve", "--config", cfg], stdout=subprocess.DEVNULL)
    return p, port


def start_serve(binary, model, threads):
    port = free_port()
    env = dict(os.environ, LAYA_HOST="127.0.0.1", LAYA_PORT=str(port), LAYA_MODELS="edge", LAYA_DEVICE="cpu",
               LAYA_THREADS=str(threads), LAYA_EXTRA_MODELS=json.dumps({"edge": model}), LAYA_MAX_CONCURRENT="64",
               LAYA_LOG_LEVEL="warning", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    p = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return p, port


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--laya-serve")
    ap.add_argument("--laya-edge", required=True)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "demo"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--requests", type=int, default=320)
    ap.add_argument("--null", action="store_true", help="laya-edge alone on the null backend")
    args = ap.parse_args()
    model = os.path.abspath(args.model)
    servers = [("laya-edge", start_edge(args.laya_edge, model, args.threads, args.null))]
    if args.laya_serve and not args.null:
        servers.append(("laya.serve", start_serve(args.laya_serve, model, args.threads)))
    out = {"bench": "http_side_by_side", "threads": args.threads, "null": args.null,
           "load": open("/proc/loadavg").read().split()[:3]}
    try:
        for name, (_, port) in servers:
            wait_ready(port)
            load(port, 4, 40)  # warm-up
            out[name] = {f"c{c}": load(port, c, args.requests) for c in (1, 16)}
    finally:
        for _, (p, _) in servers:
            p.terminate()
            p.wait(timeout=60)
    if "laya.serve" in out:
        out["rps_ratio_c16"] = round(out["laya-edge"]["c16"]["rps"] / out["laya.serve"]["c16"]["rps"], 2)
        out["rps_ratio_c1"] = round(out["laya-edge"]["c1"]["rps"] / out["laya.serve"]["c1"]["rps"], 2)
    print(json.dumps(out))


BODY = body()

if __name__ == "__main__":
    sys.exit(main())
