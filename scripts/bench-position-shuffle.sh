#!/usr/bin/env bash
# The exact shuffle keyed by position (SHUFFLE BY POSITION, issue 55)
# against the exact shuffle keyed by content (SHUFFLE, the default) and an
# unshuffled feed of the same query, as the data grows: first batch, epoch
# and peak RSS of the feed, A B C A B C in one run.
#
#   scripts/bench-position-shuffle.sh [ROUNDS=2] [EPOCHS=1] [ROWS...=200000 2000000 20000000]
#
# The data is bench-epochs.sh's (8 float columns and a label in 16 files,
# written first if missing), fed as `x` (the 8 features as one float32
# vector) and `y`, batches of 4096, on the CPU device, seed 42. The
# unshuffled feed is the floor: one plain scan of the columns the feed
# reads, with the same conversion. `digests` hashes every batch: equal
# across rounds of one case (the orders are pure functions of the data and
# seed), different between the cases. With STEP_MS=n each batch is
# followed by a simulated training step of n ms, and `wait_pct` is the share
# of the run after the first batch that the loop waited for batches: with
# EPOCHS=2, what the epoch boundary costs. CASES picks the cases (default
# "content position scan"); the case `spilled` is `position` under
# `--memory-limit $SPILL_LIMIT` (default 128M): an epoch that does not fit
# spilled by position range, in the same order (equal digests); the case
# `baseline` is `spilled` run by the binary $BASELINE (an older build, for
# A B A B against it). Needs a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
epochs=${2:-1}
shift 2 || shift $#
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(200000 2000000 20000000)
bin=$PWD/target/release/sqlfeed
[[ -x $bin ]] || { echo "build first: cargo build --release" >&2; exit 1; }
timing=$(mktemp)
out=$(mktemp)
trap 'rm -f "$timing" "$out"' EXIT

step_ms=${STEP_MS:-}
printf '%-9s %-10s %-6s %8s %9s %12s %14s' rows case round ttfb_s epoch_s peak_rss_mb digests
[[ -z $step_ms ]] || printf ' %9s' wait_pct
printf '\n'
for rows in "${sizes[@]}"; do
  data=target/bench-epochs/unique-$rows
  if [[ ! -f $data/done ]]; then
    scripts/bench-epochs.sh "$rows" 0 >/dev/null
  fi
  sql="SELECT feature_vector(f0, f1, f2, f3, f4, f5, f6, f7) AS x, label AS y \
    FROM '$data/*.parquet'"
  for round in $(seq "$rounds"); do
    for case in ${CASES:-content position scan}; do
      flags=(--shuffle-seed 42)
      global=()
      case $case in
        position) flags+=(--shuffle-by-position) ;;
        spilled | baseline)
          flags+=(--shuffle-by-position)
          global=(--memory-limit "${SPILL_LIMIT:-128M}")
          ;;
        scan) flags=() ;;
      esac
      [[ -z $step_ms ]] || flags+=(--step-ms "$step_ms")
      run=$bin
      if [[ $case == baseline ]]; then
        run=${BASELINE:?the case baseline runs the binary \$BASELINE}
      fi
      /usr/bin/time -f "%M" -o "$timing" "$run" ${global[@]+"${global[@]}"} feed "$sql" "${flags[@]}" \
        --epochs "$epochs" --batch-size 4096 --device cpu --result-json --digest \
        >"$out" 2>&1 || { cat "$out" >&2; exit 1; }
      read -r ttfb epoch digests < <(python3 scripts/bench/feed_result.py "$out")
      printf '%-9s %-10s %-6s %8s %9s %12.0f %14s' "$rows" "$case" "$round" "$ttfb" \
        "$epoch" "$(echo "$(tail -1 "$timing") / 1024" | bc -l)" "$digests"
      if [[ -n $step_ms ]]; then
        printf ' %9s' "$(python3 -c 'import json, sys
line = next(l for l in open(sys.argv[1]) if l.startswith("RESULT "))
print("%.3f" % (100 * json.loads(line[7:])["wait_frac_steady"]))' "$out")"
      fi
      printf '\n'
    done
  done
done
