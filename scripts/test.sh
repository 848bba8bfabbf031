#!/usr/bin/env bash
# All of sqlfeed's tests: Rust (`cargo test --workspace`) and Python (pytest
# on the extension module from the same build). The README's test command;
# `.ci/run` runs it on a clean clone.
#
#   scripts/test.sh                 # everything
#   scripts/test.sh -- FILTER       # cargo test filter (Python tests still all run)
#
# Python: uses $SQLFEED_PYTHON if set (it must have python/requirements-test.txt
# installed), else a venv of its own in target/test-venv, made on first use
# (torch, numpy, pyarrow, jax, pytest from the package registry: ~6 GB, ~2 min).
set -euo pipefail
cd "$(dirname "$0")/.."

# The libraries first: the extension (a cdylib) and the sqlfeed binary the
# Python tests use, and the template plugin (examples/udf-plugin) the Rust
# tests load; the same profile and features as the tests, so nothing is
# built twice.
cargo build --workspace --lib --bins
cargo test --workspace "$@"

python=${SQLFEED_PYTHON:-}
if [[ -z "$python" ]]; then
  venv=target/test-venv
  if [[ ! -x "$venv/bin/python" ]] || ! cmp -s python/requirements-test.txt "$venv/requirements-test.txt"; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip
    "$venv/bin/pip" install --quiet -r python/requirements-test.txt
    cp python/requirements-test.txt "$venv/requirements-test.txt"
  fi
  python=$PWD/$venv/bin/python
fi

# The development layout maturin also uses: the module next to the
# pure-Python package (an ignored file).
ln -sf ../../target/debug/lib_sqlfeed.so python/sqlfeed/_sqlfeed.abi3.so
cd python
SQLFEED_BIN=../target/debug/sqlfeed PYTHONPATH=. "$python" -m pytest -ra
