"""Shared by the examples: `--data GLOB` or generated data (`sqlfeed gen`)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def sqlfeed_bin() -> str:
    """The sqlfeed CLI: $SQLFEED_BIN, on PATH, or built in this repository."""
    for candidate in (
        os.environ.get("SQLFEED_BIN"),
        shutil.which("sqlfeed"),
        REPO / "target" / "release" / "sqlfeed",
        REPO / "target" / "debug" / "sqlfeed",
    ):
        if candidate and Path(candidate).exists():
            return str(candidate)
    raise SystemExit("no sqlfeed binary: `cargo build --release` or set SQLFEED_BIN")


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--data", help="Parquet glob or URL (default: generated data)")
    p.add_argument("--rows", type=int, default=20_000, help="rows to generate")
    return p


def dataset(args: argparse.Namespace) -> str:
    """The Parquet glob to read: --data, or --rows generated once per size."""
    if args.data:
        return args.data
    out = Path(tempfile.gettempdir()) / f"sqlfeed-python-examples-{args.rows}"
    if not (out / ".done").exists():
        subprocess.run(
            [sqlfeed_bin(), "gen", "--rows", str(args.rows), "--files", "4", "--out", str(out)],
            check=True,
            capture_output=True,
        )
        (out / ".done").touch()
    return f"{out}/*.parquet"
