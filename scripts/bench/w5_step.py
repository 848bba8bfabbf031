"""W5's step: 1.1x the Python loop's own per-batch time in the last W2 run
of sqlfeed_python in a peers.py results file (JSON lines), in ms.

    python scripts/bench/w5_step.py RESULTS.jsonl
"""

import json
import sys

rows = [
    json.loads(line)
    for line in open(sys.argv[1])
    if '"sqlfeed_python"' in line and '"W2"' in line
]
run = rows[-1]
print(round(1.1 * 1000 * run["wall_s"] / (run["rows"] / 256), 3))
