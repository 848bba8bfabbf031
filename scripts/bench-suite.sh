#!/usr/bin/env bash
# The side-by-side suite (issue: examples and benchmarks): workloads W1-W5 of
# ../shared/bench/peers.py on the same generated data, sqlfeed and every peer
# (pyarrow, DuckDB, Polars, DataFusion-python, Ray Data, PyTorch DataLoader),
# alternating sqlfeed and the peers round by round (A B A B), each under the
# harness's monitor (page cache warmed, peak PSS of the whole process tree).
# Writes its section of BENCHMARKS.md (between the bench-suite markers; the
# other sections stay): the machine, every run, medians and sqlfeed/peer
# ratios from this one run.
#
#   scripts/bench-suite.sh [PLAN=quick|full] [ROUNDS=2]
#
# quick: 200k rows (W1-W5) with a 60 s cap per case, about 5 minutes for 2
# rounds on 2 cores once the peers are installed; full: W1/W2/W4/W5 on 2M
# rows and W3 on 200k, as in BASELINES.md.
# Installs the peers itself into target/bench-venv (torch's default wheel is
# large, ~2.7 GB) unless PEERS_VENV names a ready one; data goes to
# target/bench-data. Needs a release build (cargo build --release). Not part of
# the CI test command.
set -euo pipefail
cd "$(dirname "$0")/.."
plan=${1:-quick}
rounds=${2:-2}
root=$PWD
bench=$(cd ../shared/bench 2>/dev/null && pwd || echo /work/shared/bench)
bin=$root/target/release/sqlfeed
out=$root/target/bench-suite.jsonl
venv=${PEERS_VENV:-$root/target/bench-venv}
py=$venv/bin/python
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }

if ! "$py" -c 'import numpy, pyarrow, torch, duckdb, polars, datafusion, ray.data, psutil' 2>/dev/null; then
  echo "installing the peers into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet numpy pyarrow torch duckdb polars datafusion "ray[data]" pydantic pandas psutil
fi
small=$root/target/bench-data/small
big=$root/target/bench-data/big
gen() { # dir rows
  [ -f "$1/_meta.json" ] || (cd "$bench" && "$py" gen_data.py --out "$1" --files 16 --rows "$2")
}
gen "$small" 200000
if [ "$plan" = full ]; then gen "$big" 2000000; main=$big; cap=90; else main=$small; cap=60; fi

# x = (f - mean) / std with the generator's constants, as the peers compute it.
x_sql() {
  "$py" - "$1" <<'PY'
import json, sys
meta = json.load(open(f"{sys.argv[1]}/_meta.json"))
terms = [f"standardize(f{j}, {m!r}, {s!r})" for j, (m, s) in enumerate(zip(meta["feature_mean"], meta["feature_std"]))]
print(f"feature_vector({', '.join(terms)})")
PY
}
external() { # name workload data cmd...
  local name=$1 workload=$2 data=$3; shift 3
  (cd "$bench" && "$py" peers.py external --name "$name" --workload "$workload" --data "$data" \
     --out "$out" -- "$@") | tail -1
}
peer() { # workload peer data [extra peers.py args]
  local workload=$1 name=$2 data=$3; shift 3
  external "$name" "$workload" "$data" "$py" "$bench/peers.py" one --workload "$workload" \
    --peer "$name" --data "$data" --cap "$cap" "$@"
}

: > "$out"
w3_data=$small
for round in $(seq "$rounds"); do
  echo "== round $round of $rounds ($plan)"
  # W1: scan every column.
  external sqlfeed W1 "$main" "$bin" scan "SELECT * FROM '$main/*.parquet'" --result-json
  for p in pyarrow duckdb polars datafusion; do peer W1 "$p" "$main"; done
  # W2: the tensor feed.
  w2=(feed "SELECT $(x_sql "$main") AS x, label AS y, image AS img FROM '$main/*.parquet'"
      --batch-size 256 --drop-last --prefetch 8 --device cpu --result-json
      --tensor img:dtype=float32,shape=3x32x32,scale=1/255)
  external sqlfeed W2 "$main" "$bin" "${w2[@]}"
  for p in pyarrow pyarrow_thread dataloader ray; do peer W2 "$p" "$main"; done
  # W3: a global shuffle, then the feed (one epoch).
  w3=(feed "SELECT $(x_sql "$w3_data") AS x, label AS y, image AS img FROM '$w3_data/*.parquet'"
      --batch-size 256 --drop-last --prefetch 8 --device cpu --result-json
      --tensor img:dtype=float32,shape=3x32x32,scale=1/255 --shuffle-seed 42)
  external sqlfeed W3 "$w3_data" "$bin" "${w3[@]}"
  for p in pyarrow_take numpy_perm polars_sample duckdb_order_hash ray_random_shuffle ray_local_buffer; do
    peer W3 "$p" "$w3_data"
  done
  # W4: token lists padded per batch.
  external sqlfeed W4 "$main" "$bin" feed "SELECT tokens AS input_ids FROM '$main/*.parquet'" \
    --batch-size 256 --drop-last --prefetch 8 --device cpu --result-json
  for p in pyarrow dataloader ray naive_pad_sequence; do peer W4 "$p" "$main"; done
done
# W5: a training step as long as each pipeline's own W2 batch time x 1.1;
# the share of time the loop waits for data.
step_of() { # peer
  "$py" - "$out" "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rs = [r["rows_per_s"] for r in rows if r.get("workload") == "W2" and r.get("peer") == sys.argv[2] and r.get("rows_per_s")]
print(round(1.1 * 1000 * 256 / statistics.median(rs), 3) if rs else "")
PY
}
for round in $(seq "$rounds"); do
  step=$(step_of sqlfeed)
  [ -n "$step" ] && external sqlfeed W5 "$main" "$bin" "${w2[@]}" --step-ms "$step"
  for p in pyarrow pyarrow_thread dataloader ray; do
    step=$(step_of "$p")
    [ -n "$step" ] && peer W5 "$p" "$main" --step-ms "$step"
  done
done
"$py" "$root/scripts/bench/benchmarks_md.py" "$out" "$plan" "$rounds" |
  "$py" "$root/scripts/bench/splice_section.py" --command "scripts/bench-suite.sh $*" \
    bench-suite "$root/BENCHMARKS.md"
echo "wrote its section of BENCHMARKS.md (the other sections are kept)"
