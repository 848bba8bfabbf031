#!/usr/bin/env bash
# Map-style access to an epoch shuffled by position (issue 55, item 4):
# what `dataset(epoch)[i]` costs as the data grows, through the CLI's
# `--rows EPOCH:FIRST:COUNT` (a new process each: planning, footers, the
# row groups the rows fall in, the functions above the shuffle), against
# the feed's own first batch of the same epoch.
#
#   scripts/bench-position-rows.sh [ROUNDS=2] [ROWS...=200000 2000000 20000000]
#   BASELINE=/tmp/sqlfeed-old scripts/bench-position-rows.sh …
#       each --rows case also run by $BASELINE (an older build) right after
#       this build's, A B A B (case names ending in "(baseline)")
#
# The data is bench-epochs.sh's (8 float columns and a label in 16 files,
# written first if missing), read as `x` (the 8 features as one vector) and
# `y`. COUNT positions from 1000 on: a row group asked for at most one row
# in 16 reads the pages holding them (1 position; 256 over 20 row groups of
# 1M rows), else it is read whole (4096 positions at 0.2M rows). Needs a
# release build.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
shift || true
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(200000 2000000 20000000)
bin=$PWD/target/release/sqlfeed
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 1; }
timing=$(mktemp)
out=$(mktemp)
trap 'rm -f "$timing" "$out"' EXIT

printf '%-9s %-6s %-33s %8s %12s\n' rows round case wall_s peak_rss_mb
for rows in "${sizes[@]}"; do
  data=target/bench-epochs/unique-$rows
  if [[ ! -f $data/done ]]; then
    scripts/bench-epochs.sh "$rows" 0 >/dev/null
  fi
  sql="SELECT feature_vector(f0, f1, f2, f3, f4, f5, f6, f7) AS x, label AS y \
    FROM '$data/*.parquet'"
  flags=(--shuffle-seed 42 --shuffle-by-position --device cpu)
  for round in $(seq "$rounds"); do
    for count in 1 256 4096 feed; do
      if [[ $count == feed ]]; then
        case="feed, first batch"
        /usr/bin/time -f "%M" -o "$timing" "$bin" feed "$sql" "${flags[@]}" --epochs 1 \
          --batch-size 4096 --result-json >"$out" 2>&1 || { cat "$out" >&2; exit 1; }
        read -r wall _ < <(python3 scripts/bench/feed_result.py "$out")
        rss=$(tail -1 "$timing" | awk '{print $NF}')
        printf '%-9s %-6s %-33s %8s %12.0f\n' "$rows" "$round" "$case" "$wall" \
          "$(echo "$rss / 1024" | bc -l)"
      else
        for build in "$bin" ${BASELINE:+"$BASELINE"}; do
          case="--rows 0:1000:$count"
          [[ $build == "$bin" ]] || case="$case (baseline)"
          /usr/bin/time -f "%e %M" -o "$timing" "$build" feed "$sql" "${flags[@]}" \
            --rows "0:1000:$count" >"$out" 2>&1 || { cat "$out" >&2; exit 1; }
          wall=$(tail -1 "$timing" | cut -d' ' -f1)
          rss=$(tail -1 "$timing" | awk '{print $NF}')
          printf '%-9s %-6s %-33s %8s %12.0f\n' "$rows" "$round" "$case" "$wall" \
            "$(echo "$rss / 1024" | bc -l)"
        done
      fi
    done
  done
done
