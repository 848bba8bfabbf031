#!/usr/bin/env bash
# The cost of verifying Parquet page checksums (issue 18, item 2; goal: at most
# 3% on W1). W1 (`sqlfeed scan "SELECT * FROM ..."`, every column) runs with one
# release binary on two rewrites of the same data that differ only in the page
# headers: A without checksums, B with a CRC-32 in every page (pyarrow's
# write_page_checksum), A B A B. The binary verifies B's checksums (the
# `page-checksums` feature, on by default) and has nothing to verify in A, so
# B/A is the cost of verifying, and nothing else.
#
#   scripts/bench-page-checksums.sh [DATA_DIR] [ROUNDS=5]
#
# DATA_DIR is a ../shared/bench/gen_data.py folder (default: the 2M-row
# BASELINES.md data in /tmp/bench-data/big); the rewrites go to DATA_DIR-nocrc
# and DATA_DIR-crc (made once: same row groups, codec and writer settings).
# Needs a release build and python3 with pyarrow (PY=...). Not part of the CI
# test command.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-/tmp/bench-data/big}
rounds=${2:-5}
py=${PY:-python3}
bin=target/release/sqlfeed
[ -x "$bin" ] || { echo "build first: cargo build --release --workspace --bins" >&2; exit 1; }

rewrite() { # checksums(True|False) out_dir
  [ -f "$2/_done" ] && return
  echo "rewriting $data into $2 (write_page_checksum=$1)"
  mkdir -p "$2"
  "$py" - "$data" "$2" "$1" <<'EOF'
import pathlib, sys
import pyarrow.parquet as pq
src, dst, checksums = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3] == "True"
for path in sorted(src.glob("*.parquet")):
    file = pq.ParquetFile(path)
    meta = file.metadata
    compression = meta.row_group(0).column(0).compression.lower()
    with pq.ParquetWriter(dst / path.name, file.schema_arrow, compression=compression,
                          write_page_checksum=checksums) as writer:
        for i in range(meta.num_row_groups):
            writer.write_table(file.read_row_group(i), row_group_size=meta.row_group(i).num_rows)
(dst / "_done").write_text("ok\n")
EOF
}
plain=${data%/}-nocrc
checked=${data%/}-crc
rewrite False "$plain"
rewrite True "$checked"

rate() { # dir -> rows/s from the RESULT line
  cat "$1"/*.parquet > /dev/null # in the page cache, like the peers' runs
  "$bin" scan "SELECT * FROM '$1/*.parquet'" --result-json 2>/dev/null | sed -n 's/^RESULT //p' |
    "$py" -c 'import json,sys; r=json.load(sys.stdin); print(round(r["rows"] / r["wall_s"]))'
}
a_runs=() b_runs=()
for round in $(seq 1 "$rounds"); do
  a=$(rate "$plain"); b=$(rate "$checked")
  a_runs+=("$a"); b_runs+=("$b")
  echo "round $round: A (no checksums in the file) $a rows/s, B (checksums verified) $b rows/s"
done
"$py" - "${a_runs[*]}" "${b_runs[*]}" <<'EOF'
import statistics, sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
ratios = sorted(y / x for x, y in zip(a, b))
print(f"median A {statistics.median(a):,.0f} rows/s, B {statistics.median(b):,.0f} rows/s; "
      f"B/A per round {', '.join(f'{r:.3f}' for r in ratios)}; "
      f"median B/A {statistics.median(ratios):.3f} "
      f"(cost of verifying: {100 * (1 - statistics.median(ratios)):.1f}%)")
EOF
