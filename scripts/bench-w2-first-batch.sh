#!/usr/bin/env bash
# Wide rows' first batch as the data grows (issue 55): the W2 feed of
# ../shared/bench (32 standardised features as `x`, the label as `y`, the
# 3 KB image as `img`, batches of 256) unshuffled and shuffled, the
# shuffle's index sorted on one thread (SET sqlfeed.shuffle_sort_threads =
# 1) and on the scan's cores (the default), A B A B at each ROWS: time to
# the first batch and peak RSS (the feed stops after its first batch).
#
#   scripts/bench-w2-first-batch.sh [ROUNDS=2] [ROWS...=200000 2000000]
#
# CASES picks the cases (default "unshuffled shuffled_1_thread
# shuffled_cores"); `position` is SHUFFLE BY POSITION (held whole), and
# `position_limited` the same under --memory-limit $LIMIT (default 1G): an
# epoch that does not fit is spilled by position range. A case named
# CASE_baseline runs CASE with $BASELINE, an older build, for A B A B.
#
# The data: ../shared/bench/gen_data.py's, written once under
# target/bench-w2/rows-ROWS by $PYTHON (default python3; it needs numpy and
# pyarrow). Needs a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
shift || true
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(200000 2000000)
bin=$PWD/target/release/sqlfeed
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 1; }
timing=$(mktemp)
trap 'rm -f "$timing"' EXIT
printf '%-8s %-18s %-6s %8s %12s\n' rows case round ttfb_s peak_rss_mb
for rows in "${sizes[@]}"; do
  data=target/bench-w2/rows-$rows
  if [[ ! -f $data/_meta.json ]]; then
    "${PYTHON:-python3}" ../shared/bench/gen_data.py --out "$data" --files 16 --rows "$rows" >&2
  fi
  source scripts/bench/w2_feed.sh
  sql="SELECT $x_sql AS x, label AS y, image AS img FROM '$data/*.parquet'"
  for round in $(seq "$rounds"); do
    for case in ${CASES:-unshuffled shuffled_1_thread shuffled_cores}; do
      # CASE_baseline: CASE run by $BASELINE (an older build), for A B A B.
      run_bin=$bin
      if [[ $case == *_baseline ]]; then
        run_bin=${BASELINE:?set BASELINE to an older build for $case}
      fi
      case ${case%_baseline} in
        unshuffled) args=(feed "$sql") ;;
        shuffled_1_thread) args=(--set sqlfeed.shuffle_sort_threads=1 feed "$sql" --shuffle-seed 42) ;;
        shuffled_cores) args=(feed "$sql" --shuffle-seed 42) ;;
        position) args=(feed "$sql" --shuffle-seed 42 --shuffle-by-position) ;;
        position_limited)
          args=(--memory-limit "${LIMIT:-1G}" feed "$sql" --shuffle-seed 42 --shuffle-by-position)
          ;;
        *) echo "unknown case $case" >&2; exit 2 ;;
      esac
      result=$(/usr/bin/time -f "%M" -o "$timing" "$run_bin" "${args[@]}" --max-batches 1 \
        --batch-size 256 --drop-last --prefetch 8 --device cpu \
        --tensor img:dtype=float32,shape=3x32x32,scale=1/255 --result-json 2>/dev/null |
        grep '^RESULT ' | cut -c8-)
      python3 - "$rows" "$case" "$round" "$(tail -1 "$timing")" "$result" <<'PY'
import json, sys
rows, case, round_, rss_kb, result = sys.argv[1:6]
r = json.loads(result)
print(f"{rows:<8} {case:<18} {round_:<6} {r['ttfb_s']:8.2f} {int(rss_kb) / 1024:12.0f}")
PY
    done
  done
done
