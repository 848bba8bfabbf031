#!/usr/bin/env bash
# A 3-source mixture feed (issue 28) against the UNION ALL of the same
# sources, globally shuffled (goal ≥ 0.95× its rows/s), and torchdata's
# MultiNodeWeightedSampler over the same sources, A B A B in one run.
#
#   scripts/bench-mix.sh [DATA=/tmp/bench-data/mid] [ROUNDS=2] [PYTHON]
#
# The sources are DATA's files: web = part-000[0-9] (10 files), code =
# part-001[0-3] (4), math = part-001[45] (2), mixed 0.6 / 0.25 / 0.15 of all
# their rows (web down-sampled, math repeated). Each case is the W2 tensor
# feed (32 standardised features, label, 3×32×32 image bytes → float32/255,
# batches of 256) on the CPU device. Needs a release build (cargo build
# --release), the bench data (../shared/bench/gen_data.py) and a Python with
# torchdata, pyarrow, numpy and torch (default: target/test-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-/tmp/bench-data/mid}
rounds=${2:-2}
python=${3:-$PWD/target/test-venv/bin/python}
bin=${SQLFEED_BIN:-$PWD/target/release/sqlfeed}
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 1; }

source scripts/bench/w2_feed.sh
cols="$x_sql AS x, label AS y, image AS img"
web="SELECT $cols FROM '$data/part-000[0-9].parquet'"
code="SELECT $cols FROM '$data/part-001[0-3].parquet'"
math="SELECT $cols FROM '$data/part-001[45].parquet'"
mix="SELECT x, y, img FROM (MIX ($web) AS web WEIGHT 0.6, ($code) AS code WEIGHT 0.25, ($math) AS math WEIGHT 0.15 SEED 1)"
union="$web UNION ALL $code UNION ALL $math"
feed() { w2_feed "$@"; }
cat "$data"/*.parquet > /dev/null  # the page cache, as peers.py warms it

printf '%-34s %-6s %12s\n' case round rows_per_s
for round in $(seq "$rounds"); do
  mixed=$(feed "$mix" | rate)
  unioned=$(feed "$union" --shuffle-seed 1 | rate)
  printf '%-34s %-6s %12s\n' "UNION ALL + SHUFFLE" "$round" "$unioned"
  printf '%-34s %-6s %12s   %.3fx union\n' "MIX 0.6/0.25/0.15" "$round" "$mixed" \
    "$(python3 -c "print($mixed / $unioned)")"
  td=$("$python" scripts/bench/mix_torchdata.py "$data" | rate)
  printf '%-34s %-6s %12s   MIX = %.2fx this\n' "torchdata MultiNodeWeightedSampler" "$round" "$td" \
    "$(python3 -c "print($mixed / $td)")"
done
