#!/usr/bin/env bash
# The cost of verifying Parquet page checksums (issue 18, item 2; goal: at most
# 3% on W1). W1 (`sqlfeed scan "SELECT * FROM ..."`, every column) runs on a
# copy of the data rewritten with a CRC-32 in every page header (pyarrow's
# write_page_checksum), with two release binaries side by side, A B A B:
#
#   A  a build without the `page-checksums` feature (the pages' CRCs are not
#      read), e.g. cargo build --release --no-default-features \
#        --features cuda,ballista --target-dir target/no-checksums
#   B  a default build (checksums verified)
#
#   scripts/bench-page-checksums.sh A_BIN B_BIN DATA_DIR [ROUNDS=3]
#
# DATA_DIR is a ../shared/bench/gen_data.py folder (e.g. 2M rows for the
# BASELINES.md W1); its checksummed copy goes to DATA_DIR-crc (made once, same
# row groups and compression). Prints rows/s per run and the B/A ratio of the
# medians. Needs python3 with pyarrow (PY=...). Not part of the CI test command.
set -euo pipefail
a_bin=${1:?A_BIN (no checksums)} b_bin=${2:?B_BIN (checksums)} data=${3:?DATA_DIR}
rounds=${4:-3}
py=${PY:-python3}
crc=${data%/}-crc

if [ ! -f "$crc/_done" ]; then
  echo "rewriting $data with page checksums into $crc"
  mkdir -p "$crc"
  "$py" - "$data" "$crc" <<'EOF'
import pathlib, sys
import pyarrow.parquet as pq
src, dst = map(pathlib.Path, sys.argv[1:])
for path in sorted(src.glob("*.parquet")):
    file = pq.ParquetFile(path)
    meta = file.metadata
    compression = meta.row_group(0).column(0).compression.lower()
    with pq.ParquetWriter(dst / path.name, file.schema_arrow, compression=compression,
                          write_page_checksum=True) as writer:
        for i in range(meta.num_row_groups):
            writer.write_table(file.read_row_group(i), row_group_size=meta.row_group(i).num_rows)
(dst / "_done").write_text("ok\n")
EOF
fi

sql="SELECT * FROM '$crc/*.parquet'"
cat "$crc"/*.parquet > /dev/null # warm the page cache once
declare -a a_runs b_runs
rate() { # bin -> rows/s from the RESULT line
  "$1" scan "$sql" --result-json | sed -n 's/^RESULT //p' |
    "$py" -c 'import json,sys; r=json.load(sys.stdin); print(round(r["rows"] / r["wall_s"]))'
}
for round in $(seq 1 "$rounds"); do
  a=$(rate "$a_bin"); b=$(rate "$b_bin")
  a_runs+=("$a"); b_runs+=("$b")
  echo "round $round: A (no checksums) $a rows/s, B (checksums) $b rows/s"
done
"$py" - "${a_runs[*]}" "${b_runs[*]}" <<'EOF'
import statistics, sys
a = statistics.median(map(float, sys.argv[1].split()))
b = statistics.median(map(float, sys.argv[2].split()))
print(f"median A {a:,.0f} rows/s, B {b:,.0f} rows/s: B/A = {b / a:.3f} "
      f"(cost of verifying checksums: {100 * (1 - b / a):.1f}%)")
EOF
