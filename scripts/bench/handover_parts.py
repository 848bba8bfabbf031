#!/usr/bin/env python3
"""What one hand-over of a batch to the Python loop costs, part by part
(BENCHMARKS.md, issue 34's W5): the W2 feed with a sleep of ``--step-ms``
per batch (a training step), and ``next()`` cut into three calls:

- ``pop``: ``RawFeed.__next__`` alone (the Rust side; no tensors made);
- ``capsules``: ``_next_dict`` with an importer returning its capsule
  (adds the DLPack capsules and the dict);
- ``torch``: ``_next_dict`` with ``torch._C._from_dlpack``, what
  ``for batch in feed`` runs.

    PYTHONPATH=<package with the release extension> \\
        python scripts/bench/handover_parts.py --data /tmp/bench-data/mid --step-ms 1.0 --rounds 2

Prints the percentiles of each part, the parts interleaved A B C A B C.
"""

import argparse
import statistics
import time

import sqlfeed
import torch  # noqa: F401  (the importer's module, loaded before the clock)
from w2_features import w2_features


def w2_feed(session: sqlfeed.Session, data: str) -> sqlfeed.Feed:
    query = f"SELECT {w2_features(data)} AS x, label AS y, image AS img FROM '{data}/*.parquet'"
    columns = {"img": {"dtype": "float32", "shape": [3, 32, 32], "scale": 1 / 255}}
    return session.feed(
        query, batch_size=256, drop_last=True, prefetch=8, device="cpu", columns=columns
    )


def hand_overs(data: str, part: str, step: float, batches: int) -> list[float]:
    """Seconds each of ``batches`` calls of ``part`` took, after a step each."""
    feed = w2_feed(sqlfeed.Session(), data)
    batch_iter = iter(feed)
    next(batch_iter)  # the pass starts; its first batch is not a hand-over
    raw = feed._pass
    importer, by_capsule, host_only, stream = feed._importer
    if part == "capsules":
        importer = lambda capsule: capsule
    times = []
    held = None
    for _ in range(batches):
        time.sleep(step)
        held = None  # the previous batch goes back to the ring, as in a loop
        started = time.perf_counter()
        if part == "pop":
            held = raw.__next__()
        else:
            held = raw._next_dict(importer, by_capsule, host_only, stream)
        times.append(time.perf_counter() - started)
        if held is None:
            break
    raw.close()
    return times


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--step-ms", type=float, default=1.0)
    p.add_argument("--batches", type=int, default=2500)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    for round in range(1, args.rounds + 1):
        for part in ("pop", "capsules", "torch"):
            times = sorted(
                hand_overs(args.data, part, args.step_ms / 1000, args.batches)
            )

            def at(q: float, times: list[float] = times) -> float:
                return times[int(q * (len(times) - 1))] * 1e6

            print(
                f"round {round} {part:8}: p10 {at(0.1):.0f} p50 {at(0.5):.0f} "
                f"p90 {at(0.9):.0f} p99 {at(0.99):.0f} mean "
                f"{statistics.mean(times) * 1e6:.0f} µs ({len(times)} batches)",
                flush=True,
            )


if __name__ == "__main__":
    main()
