#!/usr/bin/env bash
# Epoch cache benchmark (issue: epoch cache): a feed that decodes and resizes
# JPEGs, 3 shuffled epochs, side by side in one run:
#   1. without the cache (every epoch decodes again),
#   2. with --cache, cold (epoch 0 fills the cache, epochs 1-2 read it),
#   3. with --cache again, as a second run (the entry is reused from disk).
# Prints each run's per-epoch seconds and the epoch-0 / epoch-1 ratio.
#
#   scripts/bench-cache.sh [ROWS=30000] [IMAGE_SIZE=96] [RESIZE=64]
#
# FEED_FLAGS adds feed options to every run, e.g.
# FEED_FLAGS=--shuffle-by-position for the exact order by position.
#
# Needs a release build (cargo build --release). Data and cache go under
# target/bench-cache/.
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-30000}
size=${2:-96}
resize=${3:-64}
bin=$PWD/target/release/sqlfeed
work=$PWD/target/bench-cache
data=$work/data-$rows-$size
cache=$work/cache
mkdir -p "$work"
if [ ! -f "$data/_meta.json" ]; then
  "$bin" gen --rows "$rows" --out "$data" --files 8 --image-size "$size" >/dev/null
fi
sql="SELECT image_to_tensor(image_resize(image_decode(image_jpeg), $resize, $resize)) AS image,
            label AS y FROM '$data/*.parquet'"
feed() { "$bin" --cache-dir "$cache" feed "$sql" --shuffle-seed 42 --epochs 3 \
           --batch-size 256 --prefetch 8 --device cpu --result-json ${FEED_FLAGS:-} "$@" 2>/dev/null \
         | sed -n 's/^RESULT //p'; }
"$bin" --cache-dir "$cache" -c "CLEAR CACHE" >/dev/null
report() { # name json
  python3 - "$1" "$2" <<'PY'
import json, sys
name, r = sys.argv[1], json.loads(sys.argv[2])
e = r["epoch_s"]
print(f"{name:<22} rows {r['rows']:>7}  epochs " + "  ".join(f"{s:6.2f}s" for s in e)
      + f"   epoch0/epoch1 {e[0] / e[1]:5.2f}x")
PY
}
echo "feed: $rows JPEGs ${size}x${size} -> decode, resize ${resize}x${resize}, float32 CHW; 3 epochs, SHUFFLE SEED 42 ${FEED_FLAGS:-}, $(nproc) cores"
report "no cache" "$(feed)"
report "cache, first run" "$(feed --cache)"
report "cache, second run" "$(feed --cache)"
"$bin" --cache-dir "$cache" -c '\cache' | head -4
