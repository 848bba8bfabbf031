#!/usr/bin/env bash
# The W2 tensor feed of ../shared/bench over a Delta Lake table against the
# same Parquet files read as a glob (issue 30: goal ≥ 0.97× the Parquet
# rows/s), and the `deltalake` package's own path (to_pyarrow_dataset) next
# to a plain pyarrow dataset of the same files, A B A B in one run.
#
#   scripts/bench-delta.sh [DATA=/tmp/bench-data/mid] [ROUNDS=2] [PYTHON]
#
# The Delta table is DATA's files hard-linked into DATA-delta/ and
# converted in place by deltalake.convert_to_deltalake (so both read the
# very same files). Needs a release build (cargo build --release), the bench
# data (../shared/bench/gen_data.py) and a Python with deltalake, pyarrow,
# numpy and torch (default: target/test-venv, which scripts/test.sh makes).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-/tmp/bench-data/mid}
rounds=${2:-2}
python=${3:-$PWD/target/test-venv/bin/python}
bin=$PWD/target/release/sqlfeed
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 1; }
table=${data%/}-delta
if [[ ! -d $table/_delta_log ]]; then
  mkdir -p "$table"
  ln -f "$data"/*.parquet "$table"/
  "$python" -c "import deltalake, sys; deltalake.convert_to_deltalake(sys.argv[1])" "$table"
fi

source scripts/bench/w2_feed.sh
feed() { # FROM-target → RESULT line of the sqlfeed W2 feed
  w2_feed "SELECT $x_sql AS x, label AS y, image AS img FROM '$1'"
}
cat "$data"/*.parquet > /dev/null  # the page cache, as peers.py warms it

printf '%-28s %-6s %12s\n' case round rows_per_s
for round in $(seq "$rounds"); do
  parquet=$(feed "$data/*.parquet" | rate)
  delta=$(feed "$table" | rate)
  printf '%-28s %-6s %12s\n' "sqlfeed parquet glob" "$round" "$parquet"
  printf '%-28s %-6s %12s   %.3fx parquet\n' "sqlfeed delta table" "$round" "$delta" \
    "$(python3 -c "print($delta / $parquet)")"
  pa=$("$python" scripts/bench/w2_pyarrow_dataset.py parquet "$data" | rate)
  dl=$("$python" scripts/bench/w2_pyarrow_dataset.py delta "$data" "$table" | rate)
  printf '%-28s %-6s %12s\n' "pyarrow dataset (parquet)" "$round" "$pa"
  printf '%-28s %-6s %12s   sqlfeed delta = %.2fx this\n' "deltalake to_pyarrow_dataset" "$round" "$dl" \
    "$(python3 -c "print($delta / $dl)")"
done
