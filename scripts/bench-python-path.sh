#!/usr/bin/env bash
# The Python loop against the CLI, and the one-call-per-batch path (the
# extension makes torch tensors itself) against the protocol path it
# replaced (torch.from_dlpack per tensor), side by side in one run, A B A B:
# W2 tensor feed, W4 dynamic padding and W5 starvation of ../shared/bench
# (issue 34).
#
#   scripts/bench-python-path.sh [DATA=/tmp/bench-data/big] [ROUNDS=2]
#
# Needs: the bench data (../shared/bench/README.md), a release build
# (cargo build --release --workspace --lib --bins: the CLI and the
# extension), and $PY: a Python with torch, numpy and psutil. The package
# is run from a copy of python/sqlfeed next to the release extension.
# Appends to target/bench-python-path.jsonl and prints the harness's table.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-/tmp/bench-data/big}
rounds=${2:-2}
py=${PY:-python3}
out=$PWD/target/bench-python-path.jsonl
# shellcheck source=bench/feed-args.sh
source "$PWD/scripts/bench/feed-args.sh"
[[ -x $bin && -f target/release/lib_sqlfeed.so ]] || {
  echo "build first: cargo build --release --workspace --lib --bins" >&2; exit 1; }

package=$(mktemp -d)
trap 'rm -rf "$package"' EXIT
cp -r python/sqlfeed "$package/"
rm -f "$package/sqlfeed/_sqlfeed.abi3.so"
cp target/release/lib_sqlfeed.so "$package/sqlfeed/_sqlfeed.abi3.so"
export PYTHONPATH=$package

for round in $(seq "$rounds"); do
  echo "== round $round"
  for workload in W2 W4; do
    args_name="${workload,,}_args[@]"
    external sqlfeed_cli "$workload" "$bin" "${!args_name}"
    external sqlfeed_python "$workload" "$py" "$feed_py" --workload "$workload" --data "$data"
    external sqlfeed_python_protocol "$workload" "$py" "$feed_py" --workload "$workload" \
      --data "$data" --protocol
  done
done
# W5: a step of 1.1x the Python loop's own per-batch time in W2; the goal
# is a wait of at most 2% after the first batch.
step_ms=$("$py" scripts/bench/w5_step.py "$out")
for round in $(seq "$rounds"); do
  echo "== W5 round $round, step ${step_ms} ms"
  external sqlfeed_python W5 "$py" "$feed_py" --workload W5 --data "$data" --step-ms "$step_ms"
  external sqlfeed_python_protocol W5 "$py" "$feed_py" --workload W5 --data "$data" \
    --step-ms "$step_ms" --protocol
done
(cd "$bench" && "$py" report.py "$out")
