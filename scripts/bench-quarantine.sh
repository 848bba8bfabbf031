#!/usr/bin/env bash
# What on_error=quarantine costs (issue 61). One shuffled epoch per run,
# release binary, A B A B:
#
# - images: JPEGs (32²) decoded and resized to 16², batches of 256; the
#   image column goes through `CASE WHEN id % 100 = 7 THEN … END`, which
#   either keeps the image (clean) or gives bytes that are no image (1% of
#   the rows fail): fail vs quarantine on clean rows, and quarantine with
#   1% failing rows (each such morsel is evaluated again in halves);
# - narrow: feature_vector(f0 … f7) and the label, batches of 4096: fail vs
#   quarantine, which also keeps the cheap function after the permutation:
#   fail with that alone (carry off) says how much of the cost it is.
#
# Each line: rows/s of the epoch, the first batch's latency and the rows
# quarantined. The ratios at the end are medians over the rounds.
#
#   scripts/bench-quarantine.sh [IMAGE_ROWS=200000] [NARROW_ROWS=2000000] [ROUNDS=2]
#
# The images are written once under target/bench-quarantine, the narrow rows
# are bench-epochs.sh's (under target/bench-epochs). Needs a release build
# (cargo build --release --workspace --bins).
set -euo pipefail
cd "$(dirname "$0")/.."
image_rows=${1:-200000}
narrow_rows=${2:-2000000}
rounds=${3:-2}
bin=$PWD/target/release/sqlfeed
[[ -x $bin ]] || { echo "build first: cargo build --release --workspace --bins" >&2; exit 1; }
images=target/bench-quarantine/images-$image_rows
narrow=target/bench-epochs/unique-$narrow_rows
[[ -f $images/done ]] || { "$bin" gen --rows "$image_rows" --files 8 --out "$images" >/dev/null && touch "$images/done"; }
# bench-epochs.sh writes the narrow data first; 0 rounds runs nothing else.
[[ -f $narrow/done ]] || scripts/bench-epochs.sh "$narrow_rows" 0 >/dev/null

image_sql() { # what the 1% of rows get
  echo "SELECT image_to_tensor(image_resize(image_decode(CASE WHEN id % 100 = 7 THEN $1 ELSE image_jpeg END), 16, 16)) AS x, label AS y FROM '$images/*.parquet'"
}
narrow_sql="SELECT feature_vector(f0, f1, f2, f3, f4, f5, f6, f7) AS x, label AS y FROM '$narrow/*.parquet'"
out=$(mktemp)
trap 'rm -f "$out"' EXIT

run() { # name batch_size sql setting args...
  local name=$1 batch=$2 sql=$3 setting=$4
  shift 4
  cat "$images"/*.parquet "$narrow"/*.parquet >/dev/null
  "$bin" --set "$setting" feed "$sql" --shuffle-seed 42 --epochs 1 --batch-size "$batch" --device cpu \
    --result-json "$@" >"$out" 2>&1 || { cat "$out" >&2; exit 1; }
  python3 - "$name" "$out" <<'PY'
import json, re, sys
name, path = sys.argv[1], sys.argv[2]
text = open(path).read()
result = json.loads(next(l for l in text.splitlines() if l.startswith("RESULT "))[7:])
rows = result["rows"]
quarantined = re.search(r"quarantined (\d+) rows", text)
print(f"{name:<26} {rows / result['epoch_s'][0]:>12,.0f} rows/s  first batch {result['ttfb_s']:.2f}s"
      f"  quarantined {quarantined.group(1) if quarantined else '-'}")
PY
}

# The setting every run but one leaves at its default.
default=sqlfeed.carry_cheap_outputs=true
q=(--on-error quarantine --max-quarantined 2% --quarantine-out /dev/null)
echo "images: $image_rows rows (JPEG 32² → 16²), narrow: $narrow_rows rows; one shuffled epoch each"
results=$(mktemp)
for round in $(seq "$rounds"); do
  echo "round $round"
  run "images fail (clean)" 256 "$(image_sql image_jpeg)" "$default" | tee -a "$results"
  run "images quarantine (clean)" 256 "$(image_sql image_jpeg)" "$default" "${q[@]}" | tee -a "$results"
  run "images quarantine (1% bad)" 256 "$(image_sql "CAST('no image' AS BYTEA)")" "$default" "${q[@]}" | tee -a "$results"
  run "narrow fail" 4096 "$narrow_sql" "$default" | tee -a "$results"
  run "narrow fail, carry off" 4096 "$narrow_sql" sqlfeed.carry_cheap_outputs=false | tee -a "$results"
  run "narrow quarantine" 4096 "$narrow_sql" "$default" "${q[@]}" | tee -a "$results"
done
python3 - "$results" <<'PY'
import collections, re, statistics, sys
rates = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, rate = re.match(r"(.+?)\s{2,}([\d,]+) rows/s", line).groups()
    rates[name].append(float(rate.replace(",", "")))
def ratio(a, b):
    return statistics.median(y / x for x, y in zip(rates[a], rates[b]))
print(f"images: quarantine/fail on clean rows {ratio('images fail (clean)', 'images quarantine (clean)'):.3f}; "
      f"with 1% failing rows / fail on clean {ratio('images fail (clean)', 'images quarantine (1% bad)'):.3f}")
print(f"narrow: quarantine/fail {ratio('narrow fail', 'narrow quarantine'):.3f}; of which "
      f"keeping the cheap function after the permutation (carry off)/fail "
      f"{ratio('narrow fail', 'narrow fail, carry off'):.3f}")
PY
rm -f "$results"
