#!/usr/bin/env bash
# SHUFFLE WINDOW against SHUFFLE as the data grows (issue 55), A B A B at
# each ROWS: the first batch's latency, peak RSS and (narrow) the epoch's
# time and a hash of every batch's digest (equal across rounds: the order
# is a pure function of data, seed and window).
#
#   scripts/bench-window-shuffle.sh narrow [ROUNDS=2] [WINDOW=262144] [ROWS...=200000 2000000 20000000]
#   scripts/bench-window-shuffle.sh w2     [ROUNDS=2] [WINDOW=65536]  [ROWS...=200000 2000000]
#   scripts/bench-window-shuffle.sh epochs [ROUNDS=2] [WINDOW=262144] [ROWS...=20000000]
#
# narrow: bench-epochs.sh's data (8 float32 features as `x`, the label as
# `y`, 16 files, batches of 4096; ROW_GROUP_ROWS=N writes it in row groups of
# N rows instead of DataFusion's 1M), one whole epoch per run. w2: the W2 feed
# of ../shared/bench (32 standardised features, label, 3 KB image as
# float32 tensors, batches of 256), data from its gen_data.py under
# target/bench-w2 (needs $PYTHON with numpy and pyarrow), stopped after its
# first batch (--max-batches 1). epochs: the narrow feed for 2 epochs with
# an 8 ms training step (slower than the feed, so every wait after the
# first batch is the feed's: at the epoch boundary), the next epoch started
# ahead (the default look-ahead); prints the share of the run the loop
# waited after its first batch. Needs a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?narrow or w2}
rounds=${2:-2}
shift 2 || shift $#
case $kind in
  narrow | epochs) window=${1:-262144} ;;
  w2) window=${1:-65536} ;;
  *) echo "narrow or w2, not $kind" >&2; exit 2 ;;
esac
shift || true
sizes=("$@")
if [[ ${#sizes[@]} -eq 0 ]]; then
  case $kind in
    narrow) sizes=(200000 2000000 20000000) ;;
    w2) sizes=(200000 2000000) ;;
    epochs) sizes=(20000000) ;;
  esac
fi
bin=$PWD/target/release/sqlfeed
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 1; }
timing=$(mktemp)
out=$(mktemp)
trap 'rm -f "$timing" "$out"' EXIT
if [[ $kind == epochs ]]; then
  printf '%-9s %-14s %-6s %8s %11s %12s\n' rows case round ttfb_s wait_after peak_rss_mb
else
  printf '%-9s %-8s %-14s %-6s %8s %9s %12s %14s\n' rows kind case round ttfb_s epoch_s \
    peak_rss_mb batch_digests
fi
for rows in "${sizes[@]}"; do
  if [[ $kind == narrow || $kind == epochs ]]; then
    data=target/bench-epochs/unique-$rows${ROW_GROUP_ROWS:+-rg$ROW_GROUP_ROWS}
    [[ -f $data/done ]] || scripts/bench-epochs.sh "$rows" 0 >/dev/null
    sql="SELECT feature_vector(f0, f1, f2, f3, f4, f5, f6, f7) AS x, label AS y FROM '$data/*.parquet'"
    shape=(--epochs 1 --batch-size 4096 --device cpu --digest)
    [[ $kind == epochs ]] && shape=(--epochs 2 --batch-size 4096 --device cpu --step-ms 8)
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
      rss_mb=$(echo "$(tail -1 "$timing") / 1024" | bc -l)
      if [[ $kind == epochs ]]; then
        python3 - "$rows" "$case" "$round" "$rss_mb" "$out" <<'PY'
import json, sys
rows, case, round_, rss_mb, out = sys.argv[1:6]
line = next(l for l in open(out).read().splitlines() if l.startswith("RESULT "))
r = json.loads(line[7:])
print(f"{rows:<9} {case:<14} {round_:<6} {r['ttfb_s']:8.2f} {100 * r['wait_frac_steady']:10.2f}% "
      f"{float(rss_mb):12.0f}")
PY
        continue
      fi
      read -r ttfb epoch digests < <(python3 scripts/bench/feed_result.py "$out")
      printf '%-9s %-8s %-14s %-6s %8s %9s %12.0f %14s\n' "$rows" "$kind" "$case" "$round" \
        "$ttfb" "$epoch" "$rss_mb" "$digests"
    done
  done
done
