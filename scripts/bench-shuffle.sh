#!/usr/bin/env bash
# Side-by-side benchmark of SHUFFLE: the same query with and without the
# clause, alternating A B A B in one run, with wall time and peak RSS.
#
#   scripts/bench-shuffle.sh [ROWS] [MEMORY_LIMIT]      (defaults: 2000000, 4G)
#
# Builds the release binary, generates ROWS rows once under target/bench-shuffle,
# and prints one line per run plus the shuffled/plain throughput ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-2000000}
limit=${2:-4G}
data=target/bench-shuffle/rows-$rows
bin=target/release/sqlfeed

cargo build --release --quiet
if [ ! -f "$data/_meta.json" ]; then
    "$bin" gen --rows "$rows" --files 16 --out "$data"
fi
columns="id, label, f0, f1, f2, f3, f4, f5, f6, f7, caption, tokens"
plain="SELECT $columns FROM '$data/*.parquet'"
shuffled="$plain SHUFFLE SEED 1"

run() { # name sql
    local lines wall rss
    lines=$(/usr/bin/time -f "%e %M" -o "$timing" "$bin" --memory-limit "$limit" \
        --format csv -c "$2" | wc -l)
    read -r wall rss < "$timing"
    printf '%-9s rows=%d wall_s=%s rows_per_s=%.0f peak_rss_mb=%.0f\n' \
        "$1" "$((lines - 1))" "$wall" "$(echo "($lines - 1) / $wall" | bc -l)" \
        "$(echo "$rss / 1024" | bc -l)"
    echo "$1 $wall" >> "$tmp"
}
timing=$(mktemp)
tmp=$(mktemp)
for _ in 1 2; do
    run plain "$plain"
    run shuffled "$shuffled"
done
awk '{ t[$1] += $2 } END { printf "shuffled/plain throughput: %.2fx\n", t["plain"] / t["shuffled"] }' "$tmp"
rm -f "$tmp" "$timing"
