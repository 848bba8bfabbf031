#!/usr/bin/env bash
# The GPU check: CUDA tests, a PyTorch loop through the Python package and the
# H2D benchmark, on a machine with an NVIDIA GPU and no Rust toolchain, from
# binaries built on a machine with one.
#
# How to run it
#   here (Rust, maturin):   scripts/gpu-check.sh --pack
#       builds, strips and gzips into gpu-bin/ (an ignored folder), and fails
#       if the pack is over the 64 MiB that may travel with the tree:
#         sqlfeed (CLI), lib-tests, integration-tests   (cuda + gpu-check, no Ballista)
#         sqlfeed-*.whl                                  (the Python package, abi3)
#   there (CUDA, PyTorch):  bash scripts/gpu-check.sh
#       with the device tool: run(command="bash scripts/gpu-check.sh",
#       carry=["gpu-bin"], timeout_s=420). It stops itself within 6 minutes
#       (every step has a timeout, all of them a shared deadline), writes
#       its report to $OUT/gpu-check.txt on any exit, and exits 1 if any
#       step failed.
#   to show it can fail:    SQLFEED_TEST_SKIP_RELEASE_WAIT=1 bash scripts/gpu-check.sh
#       turns the release wait off (read only by gpu-check builds): the
#       slow-consumer tests and the PyTorch loop must then FAIL.
#
# Steps (numbers go into the issue's closing note):
#   1. the CUDA unit tests with SQLFEED_TEST_CUDA=require (a skip is a
#      failure): upload round trip; a consumer reading late on its own
#      stream while the two slots are reused at the same size, then grown;
#      copies queued late while the consumer reads at once; a batch held
#      past its feed;
#   2. the same under compute-sanitizer --tool memcheck (racecheck checks
#      shared memory of kernels, and sqlfeed launches none);
#   3. the CUDA integration tests (feed tensors, DLPack, dropping);
#   4. the PyTorch loop (scripts/gpu_torch_check.py): every batch cloned on
#      a slow side stream after it was dropped, compared with the CPU feed;
#   5. feed tensors on cuda:0 equal the CPU backend's (digests of every batch);
#   6. the feed's H2D rate (tensor bytes / copy-engine time) against raw
#      pinned cuMemcpyHtoDAsync of the same sizes (`sqlfeed h2d-bench`),
#      goal >= 0.85x;
#   7. the starvation share with a training step of 1.1x the per-batch
#      production time.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=gpu-bin
TARGET=${CARGO_TARGET_DIR:-target}
PACK_LIMIT=$((64 * 1024 * 1024))

if [[ "${1:-}" == "--pack" ]]; then
  set -e
  # Without Ballista: with it the sqlfeed binary alone is 57 MB stripped and
  # gzipped, and everything must fit in 64 MiB.
  features=(--no-default-features --features cuda,gpu-check)
  cargo build --release --bins "${features[@]}"
  lib_test=$(cargo test --release --lib --no-run "${features[@]}" 2>&1 | sed -n 's/.*Executable unittests src\/lib.rs (\(.*\))/\1/p' | head -1)
  it_test=$(cargo test --release --test integration --no-run "${features[@]}" 2>&1 | sed -n 's/.*Executable tests\/integration\/main.rs (\(.*\))/\1/p' | head -1)
  rm -rf "$BIN" && mkdir -p "$BIN"
  cp "$TARGET/release/sqlfeed" "$BIN/sqlfeed"
  cp "$lib_test" "$BIN/lib-tests"
  cp "$it_test" "$BIN/integration-tests"
  strip "$BIN"/* && gzip -9 "$BIN"/*
  # The Python package without Ballista or Delta Lake, with the switch.
  maturin build --release -m python/Cargo.toml --no-default-features \
    --features gpu-check --strip --out "$BIN"
  size=$(du -cb "$BIN" | tail -1 | cut -f1)
  ls -l "$BIN"
  if (( size > PACK_LIMIT )); then
    echo "gpu-bin is $size bytes, over the $PACK_LIMIT that may travel with the tree" >&2
    exit 1
  fi
  echo "gpu-bin: $size bytes (limit $PACK_LIMIT)"
  exit 0
fi

work=${TMPDIR:-/tmp}/sqlfeed-gpu-check
rm -rf "$work" && mkdir -p "$work/bin" "$work/py"
report="$work/gpu-check.txt"
: > "$report"
say() { echo "$*" | tee -a "$report"; }
failed=()
# The report reaches $OUT however the script ends.
finish() {
  if (( ${#failed[@]} )); then say "== FAILED: ${failed[*]}"; else say "== all steps passed"; fi
  if [[ -n "${OUT:-}" ]]; then cp "$report" "$OUT/"; fi
}
trap finish EXIT

# Every step shares one deadline: the whole check ends within 6 minutes.
deadline=$((SECONDS + 350))
# step NAME LIMIT_S COMMAND...: runs COMMAND with a timeout (its own limit or
# what is left of the deadline), its output in the report, a failure noted.
step() {
  local name=$1 limit=$2; shift 2
  local left=$((deadline - SECONDS))
  (( left < limit )) && limit=$left
  if (( limit <= 0 )); then say "SKIPPED $name: out of time"; failed+=("$name (no time)"); return 1; fi
  local started=$SECONDS
  timeout --kill-after=5 "$limit" "$@" >> "$report" 2>&1
  local rc=$?
  if (( rc == 0 )); then
    say "ok   $name ($((SECONDS - started)) s)"
  else
    (( rc == 124 )) && say "TIMEOUT $name after ${limit} s"
    say "FAIL $name (exit $rc, $((SECONDS - started)) s)"
    failed+=("$name")
  fi
  return $rc
}

for f in "$BIN"/*.gz; do gunzip -c "$f" > "$work/bin/$(basename "$f" .gz)"; done
chmod +x "$work"/bin/*
# A wheel is a zip: unpacked next to nothing else, no pip needed.
wheel=$(ls "$BIN"/sqlfeed-*.whl 2>/dev/null | head -1)
[[ -n "$wheel" ]] && python3 -m zipfile -e "$wheel" "$work/py"

say "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$report"
if [[ "${SQLFEED_TEST_SKIP_RELEASE_WAIT:-}" == "1" ]]; then
  say "== SQLFEED_TEST_SKIP_RELEASE_WAIT=1: the release wait is OFF; steps 1, 2 and 4 must fail"
fi

export SQLFEED_TEST_CUDA=require
say "== 1. CUDA unit tests (SQLFEED_TEST_CUDA=require: a skip is a failure)"
step "1 unit tests" 90 "$work/bin/lib-tests" device:: --test-threads 1

say "== 2. the same under compute-sanitizer memcheck"
if command -v compute-sanitizer > /dev/null; then
  step "2 memcheck" 120 compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$work/bin/lib-tests" device:: --test-threads 1
else
  say "SKIPPED 2 memcheck: compute-sanitizer not found (the CUDA toolkit is not installed)"
  [[ "${GPU_CHECK_REQUIRE_SANITIZER:-}" == "1" ]] && failed+=("2 memcheck (missing)")
fi

say "== 3. CUDA integration tests"
step "3 integration tests" 90 "$work/bin/integration-tests" feed::cuda feed::dlpack \
  feed::tensors feed::dropping contract::

say "== data"
step "data" 60 "$work/bin/sqlfeed" gen --rows 100000 --files 8 --out "$work/data"
files="$work/data/*.parquet"

say "== 4. PyTorch loop on a slow side stream through the Python package"
if [[ -n "$wheel" ]]; then
  step "4 torch loop" 90 env PYTHONPATH="$work/py" python3 scripts/gpu_torch_check.py "$files" 20000
else
  say "FAIL 4 torch loop: no wheel in $BIN (run --pack with maturin installed)"; failed+=("4 torch loop (no wheel)")
fi

feed_sql="SELECT arrow_cast(make_array(f0, f1, f2, f3, f4, f5, f6, f7), 'FixedSizeList(8, Float32)') AS x,
  label AS y, image_to_tensor(image_decode(image_png)) AS img, tokens FROM '$files'"

say "== 5. cuda:0 tensors equal the CPU backend's (20k rows, shuffled, 2 epochs)"
small_sql="$feed_sql WHERE id < 20000"
step "5a cpu digests" 45 sh -c '"$1" feed "$2" --device cpu --shuffle-seed 5 --epochs 2 --digest > "$3"' \
  _ "$work/bin/sqlfeed" "$small_sql" "$work/cpu.txt"
step "5b cuda digests" 45 sh -c '"$1" feed "$2" --device cuda:0 --shuffle-seed 5 --epochs 2 --digest > "$3"' \
  _ "$work/bin/sqlfeed" "$small_sql" "$work/cuda.txt"
if diff -q <(grep '^batch' "$work/cpu.txt" 2>/dev/null) <(grep '^batch' "$work/cuda.txt" 2>/dev/null) > /dev/null \
  && [[ -s "$work/cuda.txt" ]]; then
  say "equal: $(grep -c '^batch' "$work/cuda.txt") batches"
else
  say "MISMATCH between cpu and cuda:0 digests (first differing lines:)"
  diff <(grep '^batch' "$work/cpu.txt") <(grep '^batch' "$work/cuda.txt") | head -4 | tee -a "$report"
  failed+=("5 digests")
fi

say "== 6. H2D: feed vs raw pinned cuMemcpyHtoDAsync of the same sizes"
w2_sql="SELECT arrow_cast(make_array(f0, f1, f2, f3, f4, f5, f6, f7), 'FixedSizeList(8, Float32)') AS x,
  label AS y, image_to_tensor(image_decode(image_png)) AS img FROM '$files'"
step "6a feed h2d" 60 sh -c '"$1" feed "$2" --device cuda:0 --batch-size 256 --drop-last --prefetch 8 --result-json > "$3"' \
  _ "$work/bin/sqlfeed" "$w2_sql" "$work/feed.json"
# x [256,8] f32, y [256] i64, img [256,3,32,32] f32
step "6b raw h2d" 30 sh -c '"$1" h2d-bench --device cuda:0 --sizes 8192,2048,3145728 --iters 500 > "$2"' \
  _ "$work/bin/sqlfeed" "$work/raw.json"
feed_json=$(sed -n 's/^RESULT //p' "$work/feed.json" 2>/dev/null)
raw_json=$(sed -n 's/^RESULT //p' "$work/raw.json" 2>/dev/null)
if [[ -n "$feed_json" && -n "$raw_json" ]]; then
  python3 - "$feed_json" "$raw_json" <<'PY' | tee -a "$report"
import json, sys
feed, raw = json.loads(sys.argv[1]), json.loads(sys.argv[2])
rate = feed["out_bytes"] / feed["h2d_s"] if feed["h2d_s"] else float("nan")
print(f"feed H2D {rate/1e9:.2f} GB/s vs raw {raw['h2d_bytes_per_s']/1e9:.2f} GB/s: "
      f"{rate/raw['h2d_bytes_per_s']:.2f}x (goal >= 0.85x); feed {feed['rows']/feed['wall_s']:.0f} rows/s, "
      f"first batch {feed['ttfb_s']:.3f}s")
print(f"STEP_MS={1.1 * 1000 * feed['wall_s'] / max(feed['batches'], 1):.3f}")
PY
  step_ms=$(sed -n 's/^STEP_MS=//p' "$report" | tail -1)
  say "== 7. starvation with a step of 1.1x the per-batch production time (${step_ms} ms)"
  step "7 starvation" 60 "$work/bin/sqlfeed" feed "$w2_sql" --device cuda:0 --batch-size 256 \
    --drop-last --prefetch 8 --step-ms "$step_ms" --result-json
else
  say "no H2D numbers (steps 6a/6b failed)"
fi

(( ${#failed[@]} == 0 ))
