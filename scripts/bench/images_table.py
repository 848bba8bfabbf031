"""Summarise target/bench-images.jsonl (scripts/bench-images.sh) as a
markdown table: per data set, shuffle and peer the median rows/s, time to
the first batch and peak PSS over the rounds, and sqlfeed's ratios to DALI
and to the DataLoader measured in the same rounds.

    python images_table.py FILE
"""

import json
import statistics
import sys
from collections import defaultdict


def steady(r):
    """Rows/s after the first batch (excludes reading, planning, a barrier)."""
    return (r["rows"] - 256) / max(r["wall_s"] - (r.get("ttfb_s") or 0), 1e-9)


def main(path):
    runs = defaultdict(list)
    errors = defaultdict(int)
    for line in open(path):
        r = json.loads(line)
        key = (r["data"], r["size"], r["shuffle"], r["peer"])
        if "error" in r:
            errors[key] += 1
        else:
            runs[key].append(r)
    keys = sorted(set(runs) | set(errors))
    print("| data | output | shuffled | peer | rows/s (median) | after the first batch | runs | first batch s | peak PSS MB | sqlfeed ÷ peer (all / after first) |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    for key in keys:
        data, size, shuffle, peer = key
        rs = runs.get(key, [])
        if not rs:
            print(f"| {data} | {size}² | {shuffle} | {peer} | error ({errors[key]} runs) | | | | | |")
            continue
        rate = statistics.median(r["rows_per_s"] for r in rs)
        steady_rate = statistics.median(steady(r) for r in rs)
        ttfb = statistics.median(r.get("ttfb_s") or float("nan") for r in rs)
        pss = max(r["peak_pss_MB"] for r in rs)
        ours = runs.get((data, size, shuffle, "sqlfeed"), [])
        ratio = ""
        if ours and peer != "sqlfeed":
            a = statistics.median(r["rows_per_s"] for r in ours) / rate
            b = statistics.median(steady(r) for r in ours) / steady_rate
            ratio = f"{a:.2f}× / {b:.2f}×"
        print(f"| {data} | {size}² | {shuffle} | {peer} | {rate:,.0f} | {steady_rate:,.0f} | {len(rs)} | {ttfb:.2f} | {pss:,.0f} | {ratio} |")
    for data, size in sorted({(k[0], k[1]) for k in runs}):
        plain = runs.get((data, size, False, "sqlfeed"), [])
        shuffled = runs.get((data, size, True, "sqlfeed"), [])
        if plain and shuffled:
            a = statistics.median(r["rows_per_s"] for r in shuffled)
            b = statistics.median(r["rows_per_s"] for r in plain)
            print(f"\nsqlfeed {data} → {size}²: shuffled ÷ unshuffled = {a / b:.2f}×")


if __name__ == "__main__":
    main(sys.argv[1])
