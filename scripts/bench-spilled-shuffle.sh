#!/usr/bin/env bash
# A shuffle larger than its memory limit (issue 55): one shuffled epoch of
# the narrow feed (8 float32 features as `x` = feature_vector(f0 … f7), the
# label as `y`, 16 files, batches of 4096) under --memory-limit LIMIT, so the
# permutation spills key-sorted runs and merges them. With BASELINE set to
# another build's binary, that binary runs side by side, A B A B: the first
# batch's latency, the epoch's time, peak RSS, the bytes spilled and a hash
# of every batch's digest (equal when the order is).
#
#   BASELINE=path/to/old/sqlfeed scripts/bench-spilled-shuffle.sh [ROUNDS=2] [ROWS:LIMIT...=2000000:64M 20000000:512M]
#
# The data is bench-epochs.sh's (written once under target/bench-epochs).
# Needs a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
shift || true
cases=("$@")
[[ ${#cases[@]} -gt 0 ]] || cases=(2000000:64M 20000000:512M)
bin=$PWD/target/release/sqlfeed
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 1; }
builds=("new=$bin")
[[ -n ${BASELINE:-} ]] && builds=("old=$BASELINE" "${builds[@]}")
timing=$(mktemp)
out=$(mktemp)
trap 'rm -f "$timing" "$out"' EXIT
printf '%-9s %-6s %-5s %-6s %8s %9s %12s %10s %14s\n' \
  rows limit build round ttfb_s epoch_s peak_rss_mb spilled_mb batch_digests
for case in "${cases[@]}"; do
  rows=${case%%:*}
  limit=${case#*:}
  data=target/bench-epochs/unique-$rows
  if [[ ! -f $data/done ]]; then
    # bench-epochs.sh writes the data first; 0 rounds runs nothing else.
    scripts/bench-epochs.sh "$rows" 0 >/dev/null
  fi
  sql="SELECT feature_vector(f0, f1, f2, f3, f4, f5, f6, f7) AS x, label AS y FROM '$data/*.parquet'"
  for round in $(seq "$rounds"); do
    for build in "${builds[@]}"; do
      name=${build%%=*}
      exe=${build#*=}
      /usr/bin/time -f "%M" -o "$timing" "$exe" --memory-limit "$limit" feed "$sql" \
        --shuffle-seed 42 --epochs 1 --batch-size 4096 --device cpu \
        --result-json --digest >"$out" 2>&1
      # The bytes spilled: the same query's EXPLAIN ANALYZE (a second run).
      spilled=$("$exe" --memory-limit "$limit" -c "EXPLAIN ANALYZE $sql SHUFFLE SEED 42" 2>/dev/null |
        grep -o 'spilled_bytes=[0-9.]* [KMGT]*B' | head -1 | cut -d= -f2)
      read -r ttfb epoch digests < <(python3 scripts/bench/feed_result.py "$out")
      printf '%-9s %-6s %-5s %-6s %8s %9s %12.0f %10s %14s\n' "$rows" "$limit" "$name" \
        "$round" "$ttfb" "$epoch" "$(echo "$(tail -1 "$timing") / 1024" | bc -l)" \
        "${spilled:--}" "$digests"
    done
  done
done
