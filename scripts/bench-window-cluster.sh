#!/usr/bin/env bash
# A cluster feed's first batch and epoch boundaries as the data grows
# (issue 55, item 3): the image feed (generated JPEG 64² → 32², a
# standardised feature, the label; batches of 256) on a local scheduler
# and 2 executors, 2 epochs with a training step slower than the feed
# (STEP_MS, default 30), SHUFFLE (one job an epoch) against SHUFFLE WINDOW
# (one job a window, the next one running ahead), A B A B at each ROWS.
# Prints the first batch's latency, the share of the run the loop waited
# after its first batch, the feed process's peak RSS (the rank: it fetches
# and converts the rows), and the executors' peak disk (their work folders,
# where Ballista keeps shuffle files, sampled every 0.2 s; each run has a
# cluster of its own). A windowed feed removes each window's result once
# it read `sqlfeed.window_jobs_kept` more (default 1); an epoch's job
# stays for the scheduler's `--job-data-ttl`.
#
#   scripts/bench-window-cluster.sh [ROUNDS=2] [WINDOW=8192] [ROWS...=20000 80000 320000]
#   JOB_DATA_TTL=60 CASES=window SET=sqlfeed.window_jobs_kept=8 scripts/bench-window-cluster.sh …
#       JOB_DATA_TTL: the scheduler's `--job-data-ttl` (default 300);
#       CASES (exact, window or both, the default; position: SHUFFLE BY
#       POSITION, one job an epoch keyed by each row's file and row) picks
#       what runs; SET, a session setting of every feed (`--set`)
#
# `sqlfeed gen` writes 8 files in row groups of at most 8,192 rows (one per
# file at 20k rows, 5 per file at 320k). Needs a release build; data and
# work folders go under target/bench-window-cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
window=${2:-8192}
shift 2 || shift $#
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(20000 80000 320000)
step_ms=${STEP_MS:-30}
bin=$PWD/target/release/sqlfeed
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 1; }
work=$PWD/target/bench-window-cluster
mkdir -p "$work"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
# shellcheck source=bench/local_cluster.sh
. scripts/bench/local_cluster.sh
out=$(mktemp)
err=$(mktemp)
timing=$(mktemp)
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -f "$out" "$err" "$timing"' EXIT
printf '%-8s %-14s %-6s %8s %11s %14s %13s\n' rows case round ttfb_s wait_after client_rss_mb \
  exec_disk_mb
for rows in "${sizes[@]}"; do
  data=$work/data-$rows
  if [[ ! -f $data/_meta.json ]]; then
    "$bin" gen --rows "$rows" --out "$data" --files 8 --image-size 64 >/dev/null
  fi
  sql="SELECT image_to_tensor(image_resize(image_decode(image_jpeg), 32, 32)) AS image,
              standardize(f0, 0.0, 1.0) AS x, label AS y FROM '$data/*.parquet'"
  for round in $(seq "$rounds"); do
    cases=()
    [[ ${CASES:-exact window} == *exact* ]] && cases+=(exact)
    [[ ${CASES:-exact window} == *window* ]] && cases+=("window=$window")
    [[ ${CASES:-exact window} == *position* ]] && cases+=(position)
    for case in "${cases[@]}"; do
      start_cluster "$bin" --job-data-ttl "${JOB_DATA_TTL:-300}"
      args=(--shuffle-seed 42)
      case $case in
        exact) ;;
        position) args+=(--shuffle-by-position) ;;
        *) args+=(--shuffle-window "$window") ;;
      esac
      settings=()
      [[ -z ${SET:-} ]] || settings=(--set "$SET")
      /usr/bin/time -f "%M" -o "$timing" \
        "$bin" --cluster "df://$address" "${settings[@]}" feed "$sql" "${args[@]}" --epochs 2 --batch-size 256 \
        --prefetch 8 --device cpu --step-ms "$step_ms" --run-id "bench-$rows-$case-$round" \
        --result-json >"$out" 2>"$err" &
      feed=$!
      peak=0
      while kill -0 "$feed" 2>/dev/null; do
        # du fails when Ballista removes a file it was reading: sample again.
        used=$({ du -sk "$work"/executor-1 "$work"/executor-2 2>/dev/null || true; } |
          awk '{s += $1} END {print s + 0}')
        (( used > peak )) && peak=$used
        sleep 0.2
      done
      wait "$feed" || { echo "the $case feed of $rows rows failed:" >&2; tail -5 "$err" >&2; exit 1; }
      stop_cluster
      python3 - "$rows" "$case" "$round" "$peak" "$out" "$(tail -1 "$timing")" <<'PY'
import json, sys
rows, case, round_, peak_kb, out, rss_kb = sys.argv[1:7]
line = next(l for l in open(out).read().splitlines() if l.startswith("RESULT "))
r = json.loads(line[7:])
print(f"{rows:<8} {case:<14} {round_:<6} {r['ttfb_s']:8.2f} {100 * r['wait_frac_steady']:10.2f}% "
      f"{int(rss_kb) / 1024:14.1f} {int(peak_kb) / 1024:13.1f}")
PY
    done
  done
done
