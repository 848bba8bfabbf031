#!/usr/bin/env bash
# Every .slt file of DataFusion's sqllogictest suite (the datafusion-sqllogictest
# crate in Cargo.lock) on plain DataFusion and through sqlfeed's SQL layer, and
# sqlfeed's own .slt files (slt/test_files). The test command runs a subset;
# this runs them all (~2.5 min on 2 cores) and prints the counts.
#
#   scripts/slt.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SQLFEED_SLT=all cargo test -p sqlfeed-slt --test conformance -- --nocapture 2>&1 |
  grep -E "DataFusion .slt files|plain DataFusion fails|^--- |test result|panicked"
