# Sourced by scripts/bench-delta.sh and scripts/bench-mix.sh: the W2 tensor
# feed of ../shared/bench (32 standardised features, label, 3x32x32 image
# bytes -> float32/255, batches of 256, CPU device) over any query, and the
# rows/s of its RESULT line. Needs $bin and $data set.

# x = (f - mean) / std with the generator's constants, as the peers do.
x_sql=$(python3 "$PWD/scripts/bench/w2_features.py" "$data")

w2_feed() { # SQL [options…] → RESULT line of the W2 feed
  local sql=$1
  shift
  "$bin" feed "$sql" "$@" --batch-size 256 --drop-last --prefetch 8 --device cpu \
    --tensor img:dtype=float32,shape=3x32x32,scale=1/255 --result-json 2>/dev/null |
    grep '^RESULT '
}

rate() { # RESULT line → rows/s
  python3 -c 'import json,sys; r=json.loads(sys.stdin.read().split(" ",1)[1]); print(round(r["rows"]/r["wall_s"]))'
}
