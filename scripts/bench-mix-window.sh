#!/usr/bin/env bash
# A mixture whose passes stream (MIX … WINDOW n, issue 55) against one whose
# passes are global shuffles (MIX, the default), as the data grows: first
# batch, first epoch and peak RSS of the feed, A B A B in one run.
#
#   scripts/bench-mix-window.sh [ROUNDS=2] [WINDOW=262144] [ROWS...=200000 2000000 20000000]
#
# The data is bench-epochs.sh's (8 float32 features and a label in 16
# files, written first if missing): source `a` is files 0-7, source `b`
# files 10-15, mixed 0.5 / 0.5 of their rows together (a down-sampled, b
# read in two passes). Each case is one epoch, batches of 4096, on the CPU
# device. Needs a release build (cargo build --release). `digests` is a hash
# of every batch: equal across rounds of one case, and between the cases
# only where each source fits in one window (0.2M rows: files of 12,500
# rows), where a windowed pass is the global one. Windows are whole row
# groups: at 20M rows the files hold row groups of 1,048,576 rows, so a
# window is one such group, about 4 × WINDOW.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
window=${2:-262144}
shift 2 || shift $#
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(200000 2000000 20000000)
bin=$PWD/target/release/sqlfeed
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 1; }
timing=$(mktemp)
out=$(mktemp)
trap 'rm -f "$timing" "$out"' EXIT

printf '%-9s %-14s %-6s %8s %9s %12s %14s\n' rows case round ttfb_s epoch_s peak_rss_mb digests
for rows in "${sizes[@]}"; do
  data=target/bench-epochs/unique-$rows
  if [[ ! -f $data/done ]]; then
    scripts/bench-epochs.sh "$rows" 0 >/dev/null
  fi
  cols="feature_vector(f0, f1, f2, f3, f4, f5, f6, f7) AS x, label AS y"
  a="SELECT $cols FROM '$data/part-[0-7].parquet'"
  b="SELECT $cols FROM '$data/part-1[0-5].parquet'"
  mix="SELECT x, y FROM (MIX ($a) AS a WEIGHT 0.5, ($b) AS b WEIGHT 0.5 SEED 1"
  for round in $(seq "$rounds"); do
    for case in exact "window=$window"; do
      sql="$mix)"
      [[ $case == exact ]] || sql="$mix WINDOW $window)"
      /usr/bin/time -f "%M" -o "$timing" "$bin" feed "$sql" --epochs 1 --batch-size 4096 \
        --device cpu --result-json --digest >"$out" 2>&1 || { cat "$out" >&2; exit 1; }
      read -r ttfb epoch digests < <(python3 scripts/bench/feed_result.py "$out")
      printf '%-9s %-14s %-6s %8s %9s %12.0f %14s\n' "$rows" "$case" "$round" "$ttfb" \
        "$epoch" "$(echo "$(tail -1 "$timing") / 1024" | bc -l)" "$digests"
    done
  done
done
