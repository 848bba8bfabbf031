#!/usr/bin/env python3
"""BENCHMARKS.md from one run of scripts/bench-suite.sh.

    benchmarks_md.py RESULTS.jsonl PLAN ROUNDS > BENCHMARKS.md

Per workload: every peer's runs, the median, peak memory, and the ratio of
sqlfeed's median rows/s to the peer's (> 1: sqlfeed is faster). W5 compares
the share of time the training loop waited for data (lower is better).
"""
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

path, plan, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [json.loads(l) for l in open(path) if l.strip()]


def median(rs, key):
    values = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(values) if values else None


def fmt(v, spec="{:,.0f}"):
    return "–" if v is None else spec.format(v)


def machine():
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(l for l in open("/proc/meminfo") if l.startswith("MemTotal")).split()[1]
        mem = f"{int(mem) / 2**20:.0f} GiB"
    except (OSError, StopIteration):
        mem = "?"
    return f"{os.cpu_count()} cores ({cpu}), {mem} RAM, {platform.system()} {platform.release()}"


def versions():
    out = {}
    for mod in ["pyarrow", "duckdb", "polars", "datafusion", "ray", "torch", "numpy"]:
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            pass
    return ", ".join(f"{k} {v}" for k, v in out.items())


commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print("# BENCHMARKS")
print()
print(f"One run of `scripts/bench-suite.sh {plan} {rounds}` on {datetime.date.today()}, sqlfeed at "
      f"{commit}: {rounds} rounds, each running sqlfeed and then every peer once per workload "
      "(A B A B), every case in a fresh process under `../shared/bench/peers.py`'s monitor "
      "(page cache warmed first, peak PSS summed over the process tree, Ray and DataLoader workers "
      "included). Workloads and yardsticks are defined in `../shared/bench/peers.py`.")
print()
print(f"- Machine: {machine()}")
print(f"- Peers: {versions()}")
print("- Machines like this one are shared and noisy: compare within this file, not across runs.")
print()
names = {"W1": "W1 scan (every column)", "W2": "W2 tensor feed (x [256,32], y, img [256,3,32,32])",
         "W3": "W3 global shuffle, then the feed", "W4": "W4 token lists, dynamic padding",
         "W5": "W5 training loop with a step of 1.1x the pipeline's own W2 batch time"}
for workload in ["W1", "W2", "W3", "W4", "W5"]:
    group = [r for r in rows if r.get("workload") == workload]
    if not group:
        continue
    data = sorted({r.get("data") for r in group})
    print(f"## {names[workload]} — data: {', '.join(data)}")
    print()
    ours = [r for r in group if r["peer"] == "sqlfeed" and "error" not in r]
    ours_rate = median(ours, "rows_per_s")
    ours_wait = median(ours, "wait_frac")
    if workload == "W5":
        print("| pipeline | runs | wait % per run | wait % (median) | step ms | rows/s | peak PSS MB |")
        print("|---|---|---|---|---|---|---|")
    else:
        print("| pipeline | runs | rows/s per run | rows/s (median) | sqlfeed / this | decoded MB/s | "
              "time to 1st batch s | peak PSS MB |")
        print("|---|---|---|---|---|---|---|---|")
    peers = ["sqlfeed"] + sorted({r["peer"] for r in group} - {"sqlfeed"})
    for peer in peers:
        rs = [r for r in group if r["peer"] == peer]
        ok = [r for r in rs if "error" not in r]
        if not ok:
            err = rs[0].get("error", "no run") if rs else "no run"
            print(f"| {peer} | 0 | failed: {err} | | | | | |")
            continue
        rate = median(ok, "rows_per_s")
        if workload == "W5":
            waits = " / ".join(fmt(100 * r["wait_frac"], "{:.1f}") for r in ok if r.get("wait_frac") is not None)
            wait = median(ok, "wait_frac")
            print(f"| {peer} | {len(ok)} | {waits} | {fmt(None if wait is None else 100 * wait, '{:.1f}')} | "
                  f"{fmt(median(ok, 'step_ms'), '{:.2f}')} | {fmt(rate)} | {fmt(median(ok, 'peak_pss_MB'))} |")
            continue
        ratio = None if not (ours_rate and rate) else ours_rate / rate
        capped = " (capped)" if any(r.get("capped") for r in ok) else ""
        print(f"| {peer} | {len(ok)} | {' / '.join(fmt(r.get('rows_per_s')) for r in ok)}{capped} | "
              f"{fmt(rate)} | {fmt(ratio, '{:.2f}x')} | {fmt(median(ok, 'dec_MBps'))} | "
              f"{fmt(median(ok, 'ttfb_s'), '{:.2f}')} | {fmt(median(ok, 'peak_pss_MB'))} |")
    print()
print("Regenerate: `cargo build --release && scripts/bench-suite.sh quick 2` (or `full`).")
