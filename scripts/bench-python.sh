#!/usr/bin/env bash
# sqlfeed from Python (the `sqlfeed` package yielding torch tensors) against
# the sqlfeed CLI and the best peers of ../shared/bench, side by side in one
# run, A B A B: W2 tensor feed, W4 dynamic padding, W5 starvation.
#
#   scripts/bench-python.sh [DATA=/tmp/bench-data/big] [ROUNDS=2]
#
# Needs: the bench data (../shared/bench/README.md), a release CLI
# (cargo build --release), and $PY: a Python with sqlfeed installed
# (`pip install ./python`), torch, pyarrow and psutil. Appends to
# target/bench-python.jsonl and prints the harness's table.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-/tmp/bench-data/big}
rounds=${2:-2}
py=${PY:-python3}
out=$PWD/target/bench-python.jsonl
# shellcheck source=bench/feed-args.sh
source "$PWD/scripts/bench/feed-args.sh"

for round in $(seq "$rounds"); do
  echo "== round $round"
  external sqlfeed_cli W2 "$bin" "${w2_args[@]}"
  external sqlfeed_python W2 "$py" "$feed_py" --workload W2 --data "$data"
  external pyarrow W2 "$py" "$bench/peers.py" one --workload W2 --peer pyarrow --data "$data"
  external sqlfeed_cli W4 "$bin" "${w4_args[@]}"
  external sqlfeed_python W4 "$py" "$feed_py" --workload W4 --data "$data"
  external pyarrow W4 "$py" "$bench/peers.py" one --workload W4 --peer pyarrow --data "$data"
done
# W5: a step of 1.1x sqlfeed-python's own per-batch production time in W2.
step_ms=$("$py" scripts/bench/w5_step.py "$out")
for round in $(seq "$rounds"); do
  echo "== W5 round $round, step ${step_ms} ms"
  external sqlfeed_python W5 "$py" "$feed_py" --workload W5 --data "$data" --step-ms "$step_ms"
  external pyarrow_thread W5 "$py" "$bench/peers.py" one --workload W5 --peer pyarrow_thread --data "$data" --step-ms "$step_ms"
done
(cd "$bench" && "$py" report.py "$out")
