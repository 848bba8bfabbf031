#!/usr/bin/env bash
# Epoch boundaries of a shuffled feed (issue 55): the share of time a
# training loop slower than the feed waits after its first batch, over
# EPOCHS shuffled epochs, with the next epoch started ahead (LookaheadExec,
# the default) and without it (SET sqlfeed.epoch_lookahead = false), side by
# side, A B A B, with the first batch's latency and peak RSS.
#
#   scripts/bench-epochs.sh [ROWS=2000000] [ROUNDS=2] [STEP_MS=8] [EPOCHS=2]
#
# The narrow feed of issue 55: 8 float32 features as `x`, the label as `y`,
# 16 Parquet files written once under target/bench-epochs by sqlfeed itself
# (COPY … TO, deterministic values with no repeated rows up to 4·10⁹: a
# feed whose rows repeat pays for numbering the copies, which is another
# measurement), batches of 4096. STEP_MS is the simulated training step: slower than the feed, so
# that every wait after the first batch is the feed's fault (at an epoch
# boundary, the next epoch's shuffle). Needs a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-2000000}
rounds=${2:-2}
step_ms=${3:-8}
epochs=${4:-2}
bin=$PWD/target/release/sqlfeed
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 1; }
# ROW_GROUP_ROWS: rows per Parquet row group (DataFusion's default, 1M,
# when unset); another value writes data of its own.
row_group=${ROW_GROUP_ROWS:-}
data=target/bench-epochs/unique-$rows${row_group:+-rg$row_group}
layout=()
[[ -z $row_group ]] || layout=(--set "datafusion.execution.parquet.max_row_group_size=$row_group")
# Rows are written in `value` order: each file's rows in the same places
# on every machine, so orders keyed by position (SHUFFLE BY POSITION, whose
# digests follow the rows' places) are the same wherever it is written.
if [[ ! -f $data/done ]]; then
  mkdir -p "$data"
  per_file=$(( rows / 16 ))
  features=$(for f in 0 1 2 3 4 5 6 7; do
    printf 'CAST(((value * %d + %d) %% 4294967291) AS FLOAT) / 4294967291.0 AS f%d, ' \
      $(( 2654435761 + 97 * f )) $(( 7919 * f )) "$f"
  done)
  for file in $(seq 0 15); do
    first=$(( file * per_file ))
    "$bin" "${layout[@]}" -c "COPY (SELECT $features CAST(value % 10 AS INT) AS label \
      FROM generate_series($first, $(( first + per_file - 1 ))) ORDER BY value) \
      TO '$data/part-$file.parquet' STORED AS PARQUET" >/dev/null
  done
  touch "$data/done"
fi
sql="SELECT feature_vector(f0, f1, f2, f3, f4, f5, f6, f7) AS x, label AS y FROM '$data/*.parquet'"

timing=$(mktemp)
trap 'rm -f "$timing"' EXIT
printf '%-10s %-6s %8s %9s %10s %12s %12s\n' case round ttfb_s wall_s wait_after epoch_s peak_rss_mb
for round in $(seq "$rounds"); do
  for mode in one_by_one lookahead; do
    set_flag=()
    [[ $mode == one_by_one ]] && set_flag=(--set sqlfeed.epoch_lookahead=false)
    result=$(/usr/bin/time -f "%M" -o "$timing" "$bin" "${set_flag[@]}" feed "$sql" \
      --shuffle-seed 42 --epochs "$epochs" --batch-size 4096 --device cpu \
      --step-ms "$step_ms" --result-json 2>/dev/null | grep '^RESULT ' | cut -c8-)
    rss_kb=$(tail -1 "$timing")
    python3 - "$mode" "$round" "$rss_kb" "$result" <<'PY'
import json, sys
mode, round_, rss_kb, result = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
epochs = " ".join(f"{s:.2f}" for s in result.get("epoch_s", []))
print(f"{mode:<10} {round_:<6} {result['ttfb_s']:8.3f} {result['wall_s']:9.2f} "
      f"{100 * result['wait_frac_steady']:9.2f}% {epochs:>12} {rss_kb / 1024:12.0f}")
PY
  done
done
