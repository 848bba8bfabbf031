#!/usr/bin/env python3
"""Prints what the feed benchmarks tabulate from a `sqlfeed feed --result-json
--digest` run's output: the first batch's latency, the first epoch's time, and
a short hash of every batch's digest line (equal when two runs fed the same
batches), separated by spaces; `-` for the epoch's time of a run stopped
before its first epoch ended (`--max-batches`).

    python3 scripts/bench/feed_result.py OUTPUT_FILE
"""

import hashlib
import json
import sys

lines = open(sys.argv[1]).read().splitlines()
result = json.loads(next(line for line in lines if line.startswith("RESULT "))[7:])
digests = "\n".join(line for line in lines if "digest" in line)
epoch = f"{result['epoch_s'][0]:.2f}" if result.get("epoch_s") else "-"
print(
    f"{result['ttfb_s']:.2f} {epoch} "
    f"{hashlib.sha256(digests.encode()).hexdigest()[:12]}"
)
