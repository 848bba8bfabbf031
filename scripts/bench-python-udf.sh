#!/usr/bin/env bash
# Python batch functions side by side (issue 27): a Pillow decode-resize-
# normalise function in a plain loop, in sqlfeed with concurrency 1 and 2,
# in Ray Data map_batches and a 2-worker DataLoader; rounds interleaved.
#
#   scripts/bench-python-udf.sh [ROWS] [ROUNDS]
#
# Needs a release build of the extension (cargo build --release --workspace
# --lib) and a Python with pyarrow, numpy, pillow, torch and ray[data]
# ($SQLFEED_PYTHON, default target/test-venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-6000}
rounds=${2:-2}
python=${SQLFEED_PYTHON:-target/test-venv/bin/python}
data=$(scripts/bench/pyudf-data.sh "$rows")
ln -sf ../../target/release/lib_sqlfeed.so python/sqlfeed/_sqlfeed.abi3.so
PYTHONPATH=python "$python" scripts/bench_python_udf.py --data "$data" --rounds "$rounds"
# Leave the development layout as scripts/test.sh expects it.
ln -sf ../../target/debug/lib_sqlfeed.so python/sqlfeed/_sqlfeed.abi3.so
