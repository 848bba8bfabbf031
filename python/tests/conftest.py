"""Shared fixtures: a session, generated datasets, and visible skips that CI
can turn into failures (``SQLFEED_TEST_<NAME>=require``)."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

import sqlfeed

REPO = Path(__file__).resolve().parents[2]


def sqlfeed_bin() -> Path:
    """The sqlfeed binary built next to the extension (scripts/test.sh builds
    both); ``$SQLFEED_BIN`` overrides."""
    path = Path(os.environ.get("SQLFEED_BIN", REPO / "target" / "debug" / "sqlfeed"))
    if not path.exists():
        pytest.fail(f"{path} does not exist: run `cargo build --workspace` (scripts/test.sh does)")
    return path


def require(module: str, what: str):
    """Imports ``module`` or skips the test, visibly; with
    ``SQLFEED_TEST_<WHAT>=require`` a missing module fails instead."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        if os.environ.get(f"SQLFEED_TEST_{what.upper()}") == "require":
            pytest.fail(f"SQLFEED_TEST_{what.upper()}=require but {module} is missing: {err}")
        pytest.skip(
            f"{module} is not installed (SQLFEED_TEST_{what.upper()}=require fails instead)"
        )


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt here and in the processes a test
    starts, as in a terminal. A launcher that runs the tests in the
    background without job control (`nohup cmd &`) leaves SIGINT ignored;
    Python then installs no handler, and an ignored signal stays ignored
    across `exec`, so a Ctrl-C test would measure the launcher, not sqlfeed.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def session() -> sqlfeed.Session:
    return sqlfeed.Session(memory_limit="1G", target_partitions=2)


@pytest.fixture(scope="session")
def gen_data(tmp_path_factory) -> Path:
    """2,000 rows of `sqlfeed gen` data (features, labels, PNG/JPEG images,
    token lists, captions) in 4 Parquet files."""
    out = tmp_path_factory.mktemp("gen")
    subprocess.run(
        [str(sqlfeed_bin()), "gen", "--rows", "2000", "--files", "4", "--out", str(out)],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="session")
def ids_data(tmp_path_factory) -> Path:
    """ids 0..999 in 4 Parquet files of 250 rows."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    out = tmp_path_factory.mktemp("ids")
    for part in range(4):
        ids = pa.array(range(part * 250, (part + 1) * 250), pa.int64())
        pq.write_table(pa.table({"id": ids}), out / f"part-{part}.parquet")
    return out
