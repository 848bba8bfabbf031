#!/usr/bin/env bash
# The shuffle's barrier as the data grows (issue 55): one shuffled epoch of
# the narrow feed (8 float32 features as `x` = feature_vector(f0 … f7), the
# label as `y`, 16 files, batches of 4096) with the permutation's index
# sorted whole on one thread before the first batch (SET
# sqlfeed.shuffle_sort_threads = 1) and the default (placed in key-range
# groups on the scan's cores, the groups sorted behind the output), A B A B,
# at each ROWS: the first batch's latency, the epoch's time, peak RSS, and a
# hash of every batch's digest (equal on all paths: the threads change when
# the order is ready, not the order). Each size also times one plain scan of the columns
# the feed reads (the sum of each, which file statistics cannot answer),
# what the issue's goal compares the first batch with. With BASELINE set to
# an older release binary, its default path (cores) runs too, as `old`,
# between the two: the new build against the old one in one run.
#
#   [BASELINE=path/to/old/sqlfeed] scripts/bench-sort-threads.sh [ROUNDS=2] [ROWS...=200000 2000000 20000000]
#
# The data is bench-epochs.sh's (written once under target/bench-epochs).
# Needs a release build.
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
printf '%-9s %-8s %-6s %8s %9s %12s %14s\n' rows threads round ttfb_s epoch_s peak_rss_mb batch_digests
for rows in "${sizes[@]}"; do
  data=target/bench-epochs/unique-$rows
  if [[ ! -f $data/done ]]; then
    # bench-epochs.sh writes the data first; 0 rounds runs nothing else.
    scripts/bench-epochs.sh "$rows" 0 >/dev/null
  fi
  files="'$data/*.parquet'"
  sql="SELECT feature_vector(f0, f1, f2, f3, f4, f5, f6, f7) AS x, label AS y FROM $files"
  scan="SELECT sum(f0), sum(f1), sum(f2), sum(f3), sum(f4), sum(f5), sum(f6), sum(f7), sum(label) FROM $files"
  for round in $(seq "$rounds"); do
    /usr/bin/time -f "%e %M" -o "$timing" "$bin" -c "$scan" >/dev/null
    read -r scan_s scan_kb < "$timing"
    printf '%-9s %-8s %-6s %8s %9s %12.0f %14s\n' "$rows" "scan" "$round" "-" "$scan_s" \
      "$(echo "$scan_kb / 1024" | bc -l)" "-"
    cases=("1:$bin")
    [[ -n ${BASELINE:-} ]] && cases+=("old:$BASELINE")
    cases+=("cores:$bin")
    for case in "${cases[@]}"; do
      label=${case%%:*}
      run_bin=${case#*:}
      threads=0
      [[ $label == 1 ]] && threads=1
      /usr/bin/time -f "%M" -o "$timing" "$run_bin" --set "sqlfeed.shuffle_sort_threads=$threads" \
        feed "$sql" --shuffle-seed 42 --epochs 1 --batch-size 4096 --device cpu \
        --result-json --digest >"$out" 2>&1
      read -r ttfb epoch digests < <(python3 scripts/bench/feed_result.py "$out")
      printf '%-9s %-8s %-6s %8s %9s %12.0f %14s\n' "$rows" "$label" "$round" "$ttfb" "$epoch" \
        "$(echo "$(tail -1 "$timing") / 1024" | bc -l)" "$digests"
    done
  done
done
