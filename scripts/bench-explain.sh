#!/usr/bin/env bash
# Batch provenance against the feed it explains: the seconds `--explain E:S`
# takes for one batch next to the seconds of the whole epoch it is part of,
# for the W2 tensor feed of ../shared/bench unshuffled (explaining the last
# step, the worst case: every row before it is read and passed over) and
# globally shuffled (W3: any step waits for the whole shuffle), A B A B;
# and a shuffled feed of repeated rows (`repeated`: the label alone, 10
# distinct values, every row a copy of thousands: issue 56 measured 430 s of
# explaining on 214 distinct values where the epoch took 0.35 s).
#
#   scripts/bench-explain.sh [DATA=/tmp/bench-data/small] [ROUNDS=2]
#
# Needs a release build (cargo build --release) and the bench data of
# ../shared/bench/README.md (gen_data.py). Goal (issue 33): explaining a
# batch costs at most 15% of the epoch's feed time.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-/tmp/bench-data/small}
rounds=${2:-2}
bin=$PWD/target/release/sqlfeed
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 1; }

x_sql=$(python3 "$PWD/scripts/bench/w2_features.py" "$data")
sql="SELECT $x_sql AS x, label AS y, image AS img FROM '$data/*.parquet'"
feed=(feed "$sql" --batch-size 256 --drop-last --prefetch 8 --device cpu
      --tensor img:dtype=float32,shape=3x32x32,scale=1/255)
rows=$("$bin" -c "SELECT count(*) FROM '$data/*.parquet'" --format csv | tail -1)
last=$(( rows / 256 - 1 ))

seconds() { # command... → wall seconds
  local start end
  start=$(date +%s.%N)
  "$@" >/dev/null 2>&1
  end=$(date +%s.%N)
  python3 -c "print($end - $start)"
}

repeated=(feed "SELECT CAST(label AS FLOAT) AS x FROM '$data/*.parquet'"
          --batch-size 256 --drop-last --prefetch 8 --device cpu)

printf '%-10s %-6s %10s %12s %8s\n' case round feed_s explain_s ratio
for round in $(seq "$rounds"); do
  for mode in unshuffled shuffled repeated; do
    args=("${feed[@]}")
    step=$last
    case $mode in
      shuffled) args+=(--shuffle-seed 42); step=$(( last / 2 )) ;;
      repeated) args=("${repeated[@]}" --shuffle-seed 3); step=$(( last / 2 )) ;;
    esac
    feed_s=$(seconds "$bin" "${args[@]}")
    explain_s=$(seconds "$bin" "${args[@]}" --explain "0:$step")
    printf '%-10s %-6s %10.3f %12.3f %7.1f%%\n' "$mode" "$round" "$feed_s" "$explain_s" \
      "$(python3 -c "print(100 * $explain_s / $feed_s)")"
  done
done
