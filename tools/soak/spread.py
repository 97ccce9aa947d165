#!/usr/bin/env python3
"""The spread of the agent's memory over several soak runs (issue #40 item 6).

    spread.py [--limit-mib 256] REPORT.json...

Each REPORT is one `soak.py burst ... --json REPORT` run (a fresh agent each: its VmHWM is the peak
of that run alone). Prints, per run, the agent's idle RSS, its sampled peak, its VmHWM (the kernel's
high-water mark, which no sampling misses) and whether every request was answered; then the
minimum, median and maximum of the VmHWM and how many runs stayed under `--limit-mib`.
Exit status 1 when any run went over the limit or lost a request.
"""
import argparse
import json
import statistics
import sys


def mib(kb):
    return kb / 1024 if kb is not None else float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+")
    p.add_argument("--limit-mib", type=float, default=256.0)
    args = p.parse_args()
    hwms, bad = [], 0
    print(f"{'run':>4} {'idle':>9} {'peak':>9} {'VmHWM':>9} {'answered':>9} {'lost':>5}  report")
    for i, path in enumerate(args.reports, 1):
        with open(path) as f:
            report = json.load(f)
        for rnd in report["rounds"]:
            hwm = mib(rnd["after"]["agent_hwm_kb"])
            answered, lost = rnd["replies"]["answered"], rnd["lost"]
            hwms.append(hwm)
            over = hwm >= args.limit_mib or lost or rnd["not_sent"]
            bad += bool(over)
            print(f"{i:>4} {mib(rnd['idle']['agent_rss_kb']):>8.1f}M {mib(rnd['peak_agent_rss_kb']):>8.1f}M "
                  f"{hwm:>8.1f}M {answered:>9} {lost:>5}  {path}{'  <-- over' if over else ''}")
    under = sum(h < args.limit_mib for h in hwms)
    print(f"VmHWM over {len(hwms)} runs: min {min(hwms):.1f} MiB, median {statistics.median(hwms):.1f} MiB, "
          f"max {max(hwms):.1f} MiB; under {args.limit_mib:g} MiB in {under} of {len(hwms)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
