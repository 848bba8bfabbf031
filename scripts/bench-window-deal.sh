#!/usr/bin/env bash
# A windowed cluster feed dealt per rank on the executors against every rank
# reading whole windows (issue 55, item 3): the image feed of
# bench-window-cluster.sh (generated JPEG 64² → 32², a standardised feature,
# the label; batches of 256), SHUFFLE WINDOW, 2 epochs, on a local scheduler
# and 2 executors read by RANKS training ranks at once (default 2), each
# run on a cluster of its own, A B A B: this build (dealt: each rank fetches
# its own rows of each window) against BASELINE, an older build (every
# rank fetches every window and keeps its own batches).
#
# Prints, per rank, the first batch's latency, the epoch time, the rank's
# CPU seconds (user + system: fetching, decoding and converting rows) and
# peak RSS, and each rank's batch digest, which must be equal across builds
# (the same batches).
#
#   BASELINE=/path/to/old/sqlfeed scripts/bench-window-deal.sh [ROUNDS=2] [WINDOW=8192] [ROWS...=80000]
#   WHERE="label < 8" BASELINE=… scripts/bench-window-deal.sh …
#       WHERE: a filter of the feed's query (its windows' rows are then
#       counted once per run, reading the filter's columns only)
#
# Needs a release build; data and work folders go under
# target/bench-window-deal.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
window=${2:-8192}
shift 2 || shift $#
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(80000)
ranks=${RANKS:-2}
new=$PWD/target/release/sqlfeed
[[ -x $new ]] || { echo "build first: cargo build --release" >&2; exit 1; }
old=${BASELINE:?"BASELINE=<an older sqlfeed binary, whose window jobs are not dealt>"}
work=$PWD/target/bench-window-deal
mkdir -p "$work"
pids=()
# shellcheck source=bench/local_cluster.sh
. scripts/bench/local_cluster.sh
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
printf '%-8s %-9s %-6s %-5s %8s %8s %7s %12s  %s\n' rows build round rank ttfb_s epoch_s cpu_s \
  peak_rss_mb digest
for rows in "${sizes[@]}"; do
  data=$work/data-$rows
  if [[ ! -f $data/_meta.json ]]; then
    "$new" gen --rows "$rows" --out "$data" --files 8 --image-size 64 >/dev/null
  fi
  sql="SELECT image_to_tensor(image_resize(image_decode(image_jpeg), 32, 32)) AS image,
              standardize(f0, 0.0, 1.0) AS x, label AS y FROM '$data/*.parquet'
       ${WHERE:+WHERE $WHERE}"
  for round in $(seq "$rounds"); do
    for build in dealt baseline; do
      bin=$new
      [[ $build == dealt ]] || bin=$old
      start_cluster "$bin"
      feeds=()
      for rank in $(seq 0 $((ranks - 1))); do
        /usr/bin/time -f "%U %S %M" -o "$work/time-$rank" \
          "$bin" --cluster "df://$address" feed "$sql" --shuffle-seed 42 \
          --shuffle-window "$window" --shard "$rank/$ranks" --epochs 2 --batch-size 256 \
          --prefetch 8 --device cpu --run-id "bench-$rows-$build-$round" --digest \
          --result-json > "$work/out-$rank" 2> "$work/err-$rank" &
        feeds+=($!)
      done
      for rank in $(seq 0 $((ranks - 1))); do
        wait "${feeds[$rank]}" || {
          echo "rank $rank of the $build feed of $rows rows failed:" >&2
          tail -5 "$work/err-$rank" >&2
          exit 1
        }
      done
      stop_cluster
      for rank in $(seq 0 $((ranks - 1))); do
        python3 - "$rows" "$build" "$round" "$rank" "$work/out-$rank" "$work/time-$rank" <<'PY'
import hashlib, json, sys
rows, build, round_, rank, out, timing = sys.argv[1:7]
lines = open(out).read().splitlines()
r = json.loads(next(l for l in lines if l.startswith("RESULT "))[7:])
digests = [l for l in lines if not l.startswith("RESULT ")]
digest = hashlib.sha256("\n".join(digests).encode()).hexdigest()[:12]
user, system, rss_kb = open(timing).read().split()[-3:]
epoch = r["epoch_s"][0] if r.get("epoch_s") else float("nan")
print(f"{rows:<8} {build:<9} {round_:<6} {rank:<5} {r['ttfb_s']:8.2f} {epoch:8.2f} "
      f"{float(user) + float(system):7.1f} {int(rss_kb) / 1024:12.1f}  {digest}")
PY
      done
    done
  done
done
