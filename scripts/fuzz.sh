#!/usr/bin/env bash
# Runs each fuzz target of tests/fuzz.rs for SECONDS (default 60) with a fresh
# seed (or SQLFEED_FUZZ_SEED). A panic or hang saves its input under
# tests/fuzz/regressions/<target>/ (commit it with the fix: every later test
# run replays it) and makes this script fail.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]   targets: dialect_parser image_decode
#                                           tokenize parquet_read (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(dialect_parser image_decode tokenize parquet_read)
export SQLFEED_FUZZ_SECONDS=$seconds
export SQLFEED_FUZZ_SEED=${SQLFEED_FUZZ_SEED:-$(date +%s%N)}
echo "seed $SQLFEED_FUZZ_SEED, $seconds s per target"
profile=${FUZZ_PROFILE:-release} # dev builds faster, mutates slower
cargo test --profile "$profile" --test fuzz --no-run
status=0
for target in "${targets[@]}"; do
  log=$(mktemp)
  if cargo test --profile "$profile" --test fuzz -- --exact "$target" --nocapture > "$log" 2>&1; then
    grep -E "mutations" "$log" || true
  else
    grep -E "fuzz target|panicked" "$log" | head -5
    echo "FAILED: $target (the input is under tests/fuzz/regressions/$target/)"
    status=1
  fi
  rm -f "$log"
done
exit $status
