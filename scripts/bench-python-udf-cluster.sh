#!/usr/bin/env bash
# Python functions on the cluster (issue 57): the Pillow batch function of
# bench-python-udf.sh, concurrency 2, as a shuffled feed dealt to 2 ranks,
# embedded and on 1 scheduler + 2 executors hosting it; CPU per row of every
# process, rounds alternating, batch digests compared.
#
#   scripts/bench-python-udf-cluster.sh [ROWS] [ROUNDS] [float32|uint8]
#
# uint8: the function returns uint8 pixels and the feed normalises them on
# the rank (what the cluster guide recommends for wide outputs).
#
# Needs a release build (cargo build --release --workspace --lib --bins) and
# a Python with pyarrow, numpy and pillow ($SQLFEED_PYTHON, default
# target/test-venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-6000}
rounds=${2:-2}
pixels=${3:-float32}
python=${SQLFEED_PYTHON:-target/test-venv/bin/python}
data=$(scripts/bench/pyudf-data.sh "$rows")
ln -sf ../../target/release/lib_sqlfeed.so python/sqlfeed/_sqlfeed.abi3.so
trap 'ln -sf ../../target/debug/lib_sqlfeed.so python/sqlfeed/_sqlfeed.abi3.so' EXIT
PYTHONPATH=python "$python" scripts/bench/python_udf_cluster.py --data "$data" --rounds "$rounds" --pixels "$pixels"
