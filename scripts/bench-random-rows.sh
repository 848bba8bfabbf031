#!/usr/bin/env bash
# The floor under an exact shuffle's first batch that would not wait for
# the epoch (issue 55, docs/scaling.md item 9): what one batch of B
# uniformly random rows costs to read from Parquet (the share of pages and
# bytes it falls in, and the time), against one scan of the same columns,
# as the data grows:
#   - narrow: 8 float32 features and a label in 16 files (the data of
#     bench-epochs.sh), batches of 4096, at each NARROW row count;
#   - images: `sqlfeed gen --image-size 64` (a JPEG of about 7 KB a row, 8
#     files, row groups of at most 8,192 rows), batches of 256, at each
#     IMAGES row count.
#
#   scripts/bench-random-rows.sh
#   NARROW="200000 2000000 20000000" IMAGES="20000 80000 320000" scripts/bench-random-rows.sh
#
# Needs a release build (for the narrow data); data goes under target/.
set -euo pipefail
cd "$(dirname "$0")/.."
narrow=(${NARROW:-200000 2000000 20000000})
images=(${IMAGES:-20000 80000 320000})
bin=$PWD/target/release/sqlfeed
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 1; }
cargo bench --bench random_rows --no-run -q 2>/dev/null
bench() { cargo bench -q --bench random_rows -- "$@" 2>/dev/null; }
echo "narrow rows (f0..f7, label):"
for rows in "${narrow[@]}"; do
  scripts/bench-epochs.sh "$rows" 0 >/dev/null
  bench "target/bench-epochs/unique-$rows" f0,f1,f2,f3,f4,f5,f6,f7,label 256 4096
done | awk 'NR == 1 || !/^rows/'
echo
echo "image rows (image_jpeg, f0, label):"
for rows in "${images[@]}"; do
  data=target/bench-random-rows/images-$rows
  [[ -f $data/_meta.json ]] || "$bin" gen --rows "$rows" --out "$data" --files 8 --image-size 64 >/dev/null
  bench "$data" image_jpeg,f0,label 256 4096
done | awk 'NR == 1 || !/^rows/'
