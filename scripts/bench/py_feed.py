#!/usr/bin/env python3
"""sqlfeed's Python package on the shared bench workloads, yielding torch
tensors, for ``../shared/bench/peers.py external`` (prints one ``RESULT``
line). The consumer takes every tensor of every batch, like the peers' loops.

    python scripts/bench/py_feed.py --workload W2 --data /tmp/bench-data/big
    python scripts/bench/py_feed.py --workload W5 --data /tmp/bench-data/big --step-ms 1.3

W2/W5: x float32 [256,32] = (f - mean)/std, y int64 [256], img float32
[256,3,32,32] = uint8/255; W4: input_ids int64 [256, Lmax] + mask. Final
partial batch dropped. W5 sleeps ``--step-ms`` per batch (a training step)
and reports the share of time the loop waited for data.
"""

import argparse
import json
import time

import sqlfeed
import torch  # noqa: F401  (imported before the clock starts, as the peers do)
from w2_features import w2_features

p = argparse.ArgumentParser()
p.add_argument("--workload", choices=["W2", "W4", "W5"], required=True)
p.add_argument("--data", required=True)
p.add_argument("--step-ms", type=float, default=0.0)
p.add_argument(
    "--protocol",
    action="store_true",
    help="tensors through torch.from_dlpack per tensor (the path before the extension made "
    "them in one call per batch), for an A/B of the two",
)
args = p.parse_args()
meta = json.load(open(f"{args.data}/_meta.json"))
files = f"'{args.data}/*.parquet'"

if args.workload == "W4":
    query = f"SELECT tokens AS input_ids FROM {files}"
    columns = {}
else:
    query = f"SELECT {w2_features(args.data)} AS x, label AS y, image AS img FROM {files}"
    columns = {"img": {"dtype": "float32", "shape": [3, 32, 32], "scale": 1 / 255}}
# The session is the engine, made once per process (as ray.init is for Ray
# Data, which the harness reports apart as init_s); the CLI makes its own
# before its clock too. The clock starts at the feed, as the CLI's does at
# its build (planning and listing the inputs included): the SQL is given
# (the W2 features are computed before, as scripts/bench/feed-args.sh does
# for the CLI).
init_started = time.perf_counter()
session = sqlfeed.Session()
started = time.perf_counter()
init_s = started - init_started
feed = session.feed(
    query, batch_size=256, drop_last=True, prefetch=8, device="cpu", columns=columns
)
if args.protocol:
    feed._importer = None

rows = 0
out_bytes = 0
waited = 0.0
first = None
step = args.step_ms / 1000
asked = time.perf_counter()
for batch in feed:
    got = time.perf_counter()
    waited += got - asked
    if first is None:
        first = got - started
        first_wait = got - asked
    for tensor in batch.values():  # touch every tensor
        out_bytes += tensor.element_size() * tensor.nelement()
    rows += next(iter(batch.values())).shape[0]
    if step:
        time.sleep(step)
    asked = time.perf_counter()
wall = time.perf_counter() - started
result = {
    "rows": rows,
    "wall_s": round(wall, 3),
    "ttfb_s": round(first or 0.0, 3),
    "out_bytes": out_bytes,
    "init_s": round(init_s, 3),
}
if step:
    steady = wall - (first or 0.0)
    result.update(
        step_ms=args.step_ms,
        wait_frac=round(waited / wall, 4),
        wait_frac_steady=round((waited - first_wait) / steady, 4)
        if steady > 0
        else None,
    )
print("RESULT " + json.dumps(result), flush=True)
