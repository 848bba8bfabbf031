# Sourced by scripts/bench-*.sh: the CLI feeds of the shared bench workloads
# and the harness call. Needs $py, $data and $out set; sets $bench (the
# peer harness), $bin (the release CLI) and $feed_py (the Python feed).

bench=$(cd ../shared/bench 2>/dev/null && pwd || echo /work/shared/bench)
bin=$PWD/target/release/sqlfeed
feed_py=$PWD/scripts/bench/py_feed.py

# x = (f - mean) / std with the generator's constants, as the peers do.
x_sql=$("$py" "$PWD/scripts/bench/w2_features.py" "$data")
w2_sql="SELECT $x_sql AS x, label AS y, image AS img FROM '$data/*.parquet'"
w2_args=(feed "$w2_sql" --batch-size 256 --drop-last --prefetch 8 --device cpu --result-json
         --tensor img:dtype=float32,shape=3x32x32,scale=1/255)
w4_args=(feed "SELECT tokens AS input_ids FROM '$data/*.parquet'" --batch-size 256 --drop-last
         --prefetch 8 --device cpu --result-json)

external() { # name workload args...
  local name=$1 workload=$2; shift 2
  (cd "$bench" && "$py" peers.py external --name "$name" --workload "$workload" --data "$data" --out "$out" -- "$@")
}
