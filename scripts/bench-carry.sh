#!/usr/bin/env bash
# Cheap functions computed before a shuffle's permutation (issue 55,
# `sqlfeed_carry_cheap_outputs`): one shuffled epoch of the narrow feed
# (8 float32 features as `x` = feature_vector(f0 … f7), the label as `y`,
# 16 files, batches of 4096) with the rule on and off, A B A B, with the first
# batch's latency, the epoch's time, peak RSS, and a hash of every batch's
# digest (the two must be equal: the rule changes where functions run, not
# the order).
#
#   scripts/bench-carry.sh [ROWS=2000000] [ROUNDS=2]
#
# The data is bench-epochs.sh's (written once under target/bench-epochs).
# Needs a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-2000000}
rounds=${2:-2}
bin=$PWD/target/release/sqlfeed
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 1; }
data=target/bench-epochs/unique-$rows
if [[ ! -f $data/done ]]; then
  # bench-epochs.sh writes the data first; 0 rounds runs nothing else.
  scripts/bench-epochs.sh "$rows" 0 >/dev/null
fi
sql="SELECT feature_vector(f0, f1, f2, f3, f4, f5, f6, f7) AS x, label AS y FROM '$data/*.parquet'"
timing=$(mktemp)
out=$(mktemp)
trap 'rm -f "$timing" "$out"' EXIT
echo "$rows rows, one shuffled epoch, batches of 4096"
printf '%-8s %-6s %8s %9s %12s %14s\n' carry round ttfb_s epoch_s peak_rss_mb batch_digests
for round in $(seq "$rounds"); do
  for carry in false true; do
    /usr/bin/time -f "%M" -o "$timing" "$bin" --set "sqlfeed.carry_cheap_outputs=$carry" feed "$sql" \
      --shuffle-seed 42 --epochs 1 --batch-size 4096 --device cpu --result-json --digest \
      >"$out" 2>&1
    read -r ttfb epoch digests < <(python3 scripts/bench/feed_result.py "$out")
    printf '%-8s %-6s %8s %9s %12.0f %14s\n' "$carry" "$round" "$ttfb" "$epoch" \
      "$(echo "$(tail -1 "$timing") / 1024" | bc -l)" "$digests"
  done
done
