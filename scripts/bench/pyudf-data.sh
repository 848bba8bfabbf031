#!/usr/bin/env bash
# The data of the Python-function benches (bench-python-udf.sh,
# bench-python-udf-cluster.sh): ROWS rows of `sqlfeed gen --image-size 96` in
# 4 files, generated once per size with the release binary; prints the folder.
#
#   scripts/bench/pyudf-data.sh ROWS
set -euo pipefail
cd "$(dirname "$0")/../.."
rows=$1
data=${TMPDIR:-/tmp}/sqlfeed-bench-pyudf-$rows
if [[ ! -f $data/.done ]]; then
  rm -rf "$data"
  target/release/sqlfeed gen --rows "$rows" --files 4 --image-size 96 --out "$data" >/dev/null
  touch "$data/.done"
fi
echo "$data"
