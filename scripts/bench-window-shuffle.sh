#!/usr/bin/env bash
# SHUFFLE WINDOW against SHUFFLE as the data grows (issue 55), A B A B at
# each ROWS: the first batch's latency, peak RSS and (narrow) the epoch's
# time and a hash of every batch's digest (equal across rounds: the order
# is a pure function of data, seed and window).
#
#   scripts/bench-window-shuffle.sh narrow [ROUNDS=2] [WINDOW=262144] [ROWS...=200000 2000000 20000000]
#   scripts/bench-window-shuffle.sh w2     [ROUNDS=2] [WINDOW=65536]  [ROWS...=200000 2000000]
#
# narrow: bench-epochs.sh's data (8 float32 features as `x`, the label as
# `y`, 16 files, batches of 4096), one whole epoch per run. w2: the W2 feed
# of ../shared/bench (32 standardised features, label, 3 KB image as
# float32 tensors, batches of 256), data from its gen_data.py under
# target/bench-w2 (needs $PYTHON with numpy and pyarrow), stopped after its
# first batch (--max-batches 1). Needs a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?narrow or w2}
rounds=${2:-2}
shift 2 || shift $#
case $kind in
  narrow) window=${1:-262144} ;;
  w2) window=${1:-65536} ;;
  *) echo "narrow or w2, not $kind" >&2; exit 2 ;;
esac
shift || true
sizes=("$@")
if [[ ${#sizes[@]} -eq 0 ]]; then
  if [[ $kind == narrow ]]; then sizes=(200000 2000000 20000000); else sizes=(200000 2000000); fi
fi
bin=$PWD/target/release/sqlfeed
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 1; }
timing=$(mktemp)
out=$(mktemp)
trap 'rm -f "$timing" "$out"' EXIT
printf '%-9s %-8s %-14s %-6s %8s %9s %12s %14s\n' rows kind case round ttfb_s epoch_s \
  peak_rss_mb batch_digests
for rows in "${sizes[@]}"; do
  if [[ $kind == narrow ]]; then
    data=target/bench-epochs/unique-$rows
    [[ -f $data/done ]] || scripts/bench-epochs.sh "$rows" 0 >/dev/null
    sql="SELECT feature_vector(f0, f1, f2, f3, f4, f5, f6, f7) AS x, label AS y FROM '$data/*.parquet'"
    shape=(--epochs 1 --batch-size 4096 --device cpu --digest)
  else
    data=target/bench-w2/rows-$rows
    if [[ ! -f $data/_meta.json ]]; then
      "${PYTHON:-python3}" ../shared/bench/gen_data.py --out "$data" --files 16 --rows "$rows" >&2
    fi
    source scripts/bench/w2_feed.sh
    sql="SELECT $x_sql AS x, label AS y, image AS img FROM '$data/*.parquet'"
    shape=(--max-batches 1 --batch-size 256 --drop-last --prefetch 8 --device cpu
      --tensor img:dtype=float32,shape=3x32x32,scale=1/255 --digest)
  fi
  for round in $(seq "$rounds"); do
    for case in exact "window=$window"; do
      args=(feed "$sql" --shuffle-seed 42)
      [[ $case == exact ]] || args+=(--shuffle-window "$window")
      /usr/bin/time -f "%M" -o "$timing" "$bin" "${args[@]}" "${shape[@]}" \
        --result-json >"$out" 2>&1
      read -r ttfb epoch digests < <(python3 scripts/bench/feed_result.py "$out")
      printf '%-9s %-8s %-14s %-6s %8s %9s %12.0f %14s\n' "$rows" "$kind" "$case" "$round" \
        "$ttfb" "$epoch" "$(echo "$(tail -1 "$timing") / 1024" | bc -l)" "$digests"
    done
  done
done
