#!/usr/bin/env bash
# Cluster overhead benchmark (issues: scale out on Ballista; a cluster that
# scales): the same preprocessing feed (JPEG decode, resize, float32 CHW
# tensor, a standardised feature, SHUFFLE SEED 42) on the embedded engine
# and on local Ballista clusters of 1 scheduler + N executors (N in
# $EXECUTORS, default "1 2 3"; the cores shared out among them), A B A B in
# one run per N. Prints per run rows/s, the first batch and the CPU seconds
# per row of every process (client, scheduler, executors: /proc), the
# cluster/embedded CPU ratio, what idle servers burn, and where the cluster's
# time went: per stage its tasks, task time, rows, every operator's compute
# time per row (the scheduler's REST API) and the bytes of its shuffle files.
#
#   scripts/bench-cluster.sh [ROWS=40000] [IMAGE_SIZE=64] [RESIZE=32] [ROUNDS=2]
#   PIXELS=uint8 scripts/bench-cluster.sh …   # ship uint8 HWC pixels (4x fewer
#                                            # bytes); the feed converts to float
#   EXECUTOR_CACHE=1 scripts/bench-cluster.sh … # then 3 epochs uncached vs cached
#                                            # on the executors (--executor-cache-dir)
#   COMPARE_SET="sqlfeed.try_unique_rows=false" scripts/bench-cluster.sh …
#                                            # each round also runs the cluster
#                                            # feed with these --set settings
#                                            # (space-separated KEY=VALUE; ';'
#                                            # between variants)
#   RANKS=4 scripts/bench-cluster.sh …         # then W ranks at once on each
#                                            # cluster: bytes each rank fetched
#                                            # vs one rank reading the epoch
#
# Needs a release build (cargo build --release). Data goes under
# target/bench-cluster/.
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-40000}
size=${2:-64}
resize=${3:-32}
rounds=${4:-2}
bin=$PWD/target/release/sqlfeed
work=$PWD/target/bench-cluster
data=$work/data-$rows-$size
mkdir -p "$work"
if [ ! -f "$data/_meta.json" ]; then
  "$bin" gen --rows "$rows" --out "$data" --files 8 --image-size "$size" >/dev/null
fi
cores=$(nproc)

if [ "${PIXELS:-float32}" = uint8 ]; then
  sql="SELECT get_field(image_resize(image_decode(image_jpeg), $resize, $resize), 'pixels') AS image,
              standardize(f0, 0.0, 1.0) AS x, label AS y FROM '$data/*.parquet'"
  tensor=(--tensor "image:dtype=float32,shape=${resize}x${resize}x3,scale=1/255")
else
  sql="SELECT image_to_tensor(image_resize(image_decode(image_jpeg), $resize, $resize)) AS image,
              standardize(f0, 0.0, 1.0) AS x, label AS y FROM '$data/*.parquet'"
  tensor=()
fi
# feed_raw [GLOBAL ARGS…] [-- FEED ARGS…]
feed_raw() {
  local global=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do global+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  "$bin" "${global[@]}" --target-partitions "$cores" feed "$sql" --shuffle-seed 42 \
    --epochs 1 --batch-size 256 --prefetch 8 --device cpu --result-json "${tensor[@]}" "$@" \
    2>/dev/null
}
feed_args=(--shuffle-seed 42 --epochs 1 --batch-size 256 --prefetch 8 --device cpu --result-json
           "${tensor[@]}")
echo "feed: $rows JPEGs ${size}x${size} -> decode, resize ${resize}x${resize}, ${PIXELS:-float32} pixels," \
     "standardize; SHUFFLE SEED 42; $cores cores"

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for executors in ${EXECUTORS:-1 2 3}; do
  slots=$(( cores / executors > 0 ? cores / executors : 1 ))
  "$bin" scheduler --bind 127.0.0.1:0 > "$work/scheduler.log" 2>&1 &
  pids=($!)
  for _ in $(seq 50); do grep -q 'listening on' "$work/scheduler.log" && break; sleep 0.1; done
  address=$(sed -n 's/.*listening on df:\/\/\([0-9.:]*\).*/\1/p' "$work/scheduler.log" | head -1)
  for i in $(seq "$executors"); do
    "$bin" executor --scheduler "$address" --concurrent-tasks "$slots" \
      --work-dir "$work/executor-$i" > "$work/executor-$i.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 100); do
    [ "$(curl -s "http://$address/api/executors" | grep -o '"host"' | wc -l)" = "$executors" ] && break
    sleep 0.1
  done
  echo "== cluster of $executors executor(s) x $slots task slot(s)"
  servers=("scheduler=${pids[0]}")
  for i in $(seq "$executors"); do servers+=("executor-$i=${pids[$i]}"); done
  idle=$(python3 "$PWD/scripts/bench/cluster_cpu.py" idle 3 "${servers[@]}")
  for round in $(seq "$rounds"); do
    e=$(python3 "$PWD/scripts/bench/cluster_cpu.py" run "${servers[@]}" -- \
        "$bin" --target-partitions "$cores" feed "$sql" "${feed_args[@]}")
    runs=("$e")
    # The default last: the stages printed below are its job's.
    variants=()
    if [ -n "${COMPARE_SET:-}" ]; then
      IFS=';' read -r -a variants <<< "$COMPARE_SET"
    fi
    variants+=("")
    for variant in "${variants[@]}"; do
      set_args=()
      for kv in $variant; do set_args+=(--set "$kv"); done
      runs+=("$(python3 "$PWD/scripts/bench/cluster_cpu.py" run "${servers[@]}" -- \
        "$bin" --cluster "df://$address" --target-partitions "$cores" "${set_args[@]}" \
        feed "$sql" "${feed_args[@]}")")
    done
    python3 - "$round" "$executors" "$idle" "${COMPARE_SET:-}" "${runs[@]}" <<'PY'
import json, sys
rnd, n, idle, compare = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
e, *clusters = (json.loads(a) for a in sys.argv[5:])
rows = e["result"]["rows"]
us = lambda s: 1e6 * s / rows
e_cpu = e["client_cpu_s"]
print(f"round {rnd}: embedded {rows / e['wall_s']:>7.0f} rows/s, CPU {us(e_cpu):5.1f} us/row, "
      f"first batch {e['result']['ttfb_s']:.2f}s")
labels = [f"cluster --set {v.strip()}" for v in compare.split(";") if compare] + ["cluster"]
for label, c in zip(labels, clusters):
    assert c["result"]["rows"] == rows, "the cluster fed another number of rows"
    c_cpu = c["client_cpu_s"] + sum(c["server_cpu_s"].values())
    parts = [f"client {us(c['client_cpu_s']):.1f}"]
    parts += [f"{name} {us(s):.1f}" for name, s in c["server_cpu_s"].items()]
    print(f"  {label} ({n} executors): {rows / c['wall_s']:>7.0f} rows/s, "
          f"CPU {us(c_cpu):5.1f} us/row = {c_cpu / e_cpu:.2f}x embedded "
          f"({', '.join(parts)}), first batch {c['result']['ttfb_s']:.2f}s")
print(f"  idle servers burn {sum(idle.values()):.3f} CPU-s/s "
      f"({', '.join(f'{k} {v:.3f}' for k, v in idle.items())})")
PY
  done
  echo "stages of the last cluster job:"
  stage_args=(--rows "$rows")
  for i in $(seq "$executors"); do stage_args+=(--work-dir "$work/executor-$i"); done
  python3 "$PWD/scripts/bench/cluster_stages.py" "$address" "${stage_args[@]}"
  ranks=${RANKS:-4}
  if [ "$ranks" -ge 2 ]; then
    # One rank reading the whole epoch, then W ranks of one run at once
    # (each fetches its own batches: the job is dealt on the executors).
    one=$(feed_raw --cluster "df://$address" -- --run-id "bench-1-$executors" --explain-analyze)
    outs=() rank_pids=()
    for r in $(seq 0 $((ranks - 1))); do
      outs+=("$work/rank-$r.out")
      feed_raw --cluster "df://$address" -- --run-id "bench-$ranks-$executors" --shard "$r/$ranks" \
        --explain-analyze > "$work/rank-$r.out" &
      rank_pids+=($!)
    done
    wait "${rank_pids[@]}"
    python3 - "$ranks" "$one" "${outs[@]}" <<'PY'
import json, re, sys
ranks, one, outs = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
def size(text):
    m = re.search(r"fetched_bytes=([0-9.]+)\s*([KMG]?)", text)
    return float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[m.group(2)] if m else float("nan")
whole = size(one)
print(f"  1 rank fetched {whole / 1e6:.1f} MB (the epoch's Arrow data)")
for r, path in enumerate(outs):
    text = open(path).read()
    result = json.loads(re.search(r"^RESULT (.*)$", text, re.M).group(1))
    got = size(text)
    print(f"  rank {r}/{ranks}: fetched {got / 1e6:.1f} MB = {got / whole:.3f} of the epoch, "
          f"{result['rows']} rows, {result['rows'] / result['wall_s']:.0f} rows/s")
PY
  fi
  if [ "${EXECUTOR_CACHE:-0}" = 1 ]; then
    # 3 epochs: uncached, then cached by the executors in a fresh folder.
    epochs3() {
      local global=()
      while [ $# -gt 0 ] && [ "$1" != -- ]; do global+=("$1"); shift; done
      [ $# -gt 0 ] && shift
      "$bin" --cluster "df://$address" --target-partitions "$cores" "${global[@]}" feed "$sql" \
        --shuffle-seed 42 --epochs 3 --batch-size 256 --prefetch 8 --device cpu \
        --result-json "${tensor[@]}" --run-id "bench-cache-$executors-$RANDOM" "$@" \
        2>/dev/null | sed -n 's/^RESULT //p'
    }
    rm -rf "$work/executor-cache"
    plain=$(epochs3)
    cached=$(epochs3 --executor-cache-dir "$work/executor-cache" -- --cache)
    python3 - "$plain" "$cached" <<'PY'
import json, sys
plain, cached = json.loads(sys.argv[1]), json.loads(sys.argv[2])
fmt = lambda r: " ".join(f"{s:.2f}s" for s in r["epoch_s"])
print(f"  3 epochs uncached: {fmt(plain)}   cached on the executors: {fmt(cached)}")
PY
  fi
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  pids=()
done
du -sh "$work"/executor-*/ 2>/dev/null | sed 's/^/  executor work dir (shuffle files left, cleaned later): /' || true
