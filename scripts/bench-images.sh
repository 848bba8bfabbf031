#!/usr/bin/env bash
# Image feeds at decoder speed (issue 16): photo-like JPEGs (crops of real
# photographs, scripts/bench/photos.py) decoded, resized, normalised into
# float32 [256, 3, S, S] + labels, unshuffled and shuffled, by sqlfeed and
# its peers (scripts/bench/images.py: DALI's CPU pipeline, a torch
# DataLoader with 2 workers + Pillow, Pillow in-process, Ray Data), side by
# side, A B A B, under the shared harness's memory monitor.
#
#   scripts/bench-images.sh [ROUNDS=2] [PEERS="sqlfeed dali dataloader pillow ray"]
#
# Needs a release CLI (cargo build --release) and $PY: a Python with
# pyarrow, numpy, Pillow, scikit-image, torch, psutil, and for their rows
# nvidia-dali-cuda130 and ray[data] (a peer that is not installed is
# reported as an error row, not skipped silently). Data: 50,000 128x128
# photos resized to 64 and 20,000 256x256 photos resized to 128, generated
# under $DATA (default /tmp/bench-data) when missing. Appends to
# target/bench-images.jsonl and prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
peers=${2:-"sqlfeed dali dataloader pillow ray"}
py=${PY:-python3}
root=${DATA:-/tmp/bench-data}
bin=$PWD/target/release/sqlfeed
out=$PWD/target/bench-images.jsonl
runner=$PWD/scripts/bench/images.py
export BENCH=${BENCH:-$(cd ../shared/bench 2>/dev/null && pwd || echo /work/shared/bench)}
mkdir -p target

sets=("photos128:50000:128:64" "photos256:20000:256:128")
for set in "${sets[@]}"; do
  IFS=: read -r name rows side _ <<<"$set"
  if [ ! -f "$root/$name/_meta.json" ]; then
    "$py" scripts/bench/photos.py "$root/$name" "$rows" "$side"
  fi
done

sqlfeed_cmd() { # data size shuffle
  local sql="SELECT image_to_tensor(image_resize(image_decode(image_jpeg), $2, $2), \
[0.485, 0.456, 0.406], [0.229, 0.224, 0.225]) AS x, label AS y FROM '$1/*.parquet'"
  local args=(feed "$sql" --batch-size 256 --drop-last --prefetch 8 --device cpu --result-json)
  if [ "$3" = yes ]; then args+=(--shuffle-seed 42); fi
  echo "$bin" "${args[@]@Q}"
}

for round in $(seq "$rounds"); do
  for set in "${sets[@]}"; do
    IFS=: read -r name _ _ size <<<"$set"
    data=$root/$name
    for shuffle in no yes; do
      flag=(); [ "$shuffle" = yes ] && flag=(--shuffle)
      echo "== round $round, $name -> ${size}x${size}, shuffle $shuffle"
      for peer in $peers; do
        if [ "$peer" = sqlfeed ]; then
          eval "cmd=($(sqlfeed_cmd "$data" "$size" "$shuffle"))"
          "$py" "$runner" run --peer sqlfeed --data "$data" --size "$size" "${flag[@]}" \
            --out "$out" -- "${cmd[@]}" || true
        else
          "$py" "$runner" run --peer "$peer" --data "$data" --size "$size" "${flag[@]}" \
            --out "$out" --cap 90 || true
        fi
      done
    done
  done
done
"$py" scripts/bench/images_table.py "$out"
