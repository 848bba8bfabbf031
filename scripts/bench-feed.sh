#!/usr/bin/env bash
# The feed benchmarks of ../shared/bench (W2 tensor feed, W3 global shuffle
# then feed, W4 dynamic padding, W5 starvation) for sqlfeed and its peers,
# side by side in one run, A B A B.
#
#   scripts/bench-feed.sh [DATA=/tmp/bench-data/big] [REPEAT=2] [WORKLOADS=W2,W4,W5]
#   scripts/bench-feed.sh /tmp/bench-data/small 2 W3     # as in BASELINES.md
#   W3_WINDOW=65536 scripts/bench-feed.sh /tmp/bench-data/small 2 W3
#       also sqlfeed with SHUFFLE WINDOW 65536 (sqlfeed_window)
#   W3_POSITION=1 scripts/bench-feed.sh /tmp/bench-data/small 2 W3
#       also sqlfeed with SHUFFLE BY POSITION (sqlfeed_position)
#
# Needs the peer venv and data of ../shared/bench/README.md and a release
# build (cargo build --release). Appends to target/bench-feed.jsonl and prints
# the harness's table.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-/tmp/bench-data/big}
repeat=${2:-2}
workloads=${3:-W2,W4,W5}
has() { [[ ",$workloads," == *",$1,"* ]]; }
py=${PEERS_PY:-/tmp/peers-venv/bin/python}
out=$PWD/target/bench-feed.jsonl

# shellcheck source=bench/feed-args.sh
source "$PWD/scripts/bench/feed-args.sh"

for rep in $(seq "$repeat"); do
  echo "== round $rep"
  if has W2; then
    external sqlfeed W2 "$bin" "${w2_args[@]}"
    external datafusion_scan W2 "$py" "$PWD/scripts/bench/df_scan.py" "$data"
    external pyarrow W2 "$py" "$bench/peers.py" one --workload W2 --peer pyarrow --data "$data"
  fi
  if has W3; then
    # The W2 feed, globally shuffled every epoch (one epoch here).
    external sqlfeed W3 "$bin" "${w2_args[@]}" --shuffle-seed 42
    # W3_WINDOW=n: also SHUFFLE WINDOW n (not a global shuffle: rows of one
    # row group land in one window), named sqlfeed_window.
    if [[ -n ${W3_WINDOW:-} ]]; then
      external sqlfeed_window W3 "$bin" "${w2_args[@]}" --shuffle-seed 42 \
        --shuffle-window "$W3_WINDOW"
    fi
    # W3_POSITION=1: also SHUFFLE BY POSITION (an exact global shuffle keyed
    # by file and row), named sqlfeed_position.
    if [[ -n ${W3_POSITION:-} ]]; then
      external sqlfeed_position W3 "$bin" "${w2_args[@]}" --shuffle-seed 42 \
        --shuffle-by-position
    fi
    external duckdb_order_hash W3 "$py" "$bench/peers.py" one --workload W3 --peer duckdb_order_hash --data "$data"
    external numpy_perm W3 "$py" "$bench/peers.py" one --workload W3 --peer numpy_perm --data "$data"
  fi
  if has W4; then
    external sqlfeed W4 "$bin" "${w4_args[@]}"
    external pyarrow W4 "$py" "$bench/peers.py" one --workload W4 --peer pyarrow --data "$data"
  fi
done
if ! has W5; then
  (cd "$bench" && "$py" report.py "$out")
  exit 0
fi
# W5: the step is 1.1x sqlfeed's own per-batch production time in W2.
step_ms=$("$py" - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"sqlfeed"' in l and '"W2"' in l]
r = rows[-1]
print(round(1.1 * 1000 * r["wall_s"] / (r["rows"] / 256), 3))
PY
)
echo "== W5, step ${step_ms} ms"
external sqlfeed W5 "$bin" "${w2_args[@]}" --step-ms "$step_ms"
external pyarrow_thread W5 "$py" "$bench/peers.py" one --workload W5 --peer pyarrow_thread --data "$data" --step-ms "$step_ms"
(cd "$bench" && "$py" report.py "$out")
