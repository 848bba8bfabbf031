"""The Python examples (examples/python) run on small generated data, and
the DDP example resumes mid-epoch with exactly the batches of an
uninterrupted run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, require, sqlfeed_bin

EXAMPLES = REPO / "examples" / "python"
SINGLE = [
    "01_read_inspect.py",
    "02_preprocess.py",
    "03_prefetch_training.py",
    "04_global_shuffle.py",
    "06_text.py",
    "07_cache.py",
]


def run(args: list[str], timeout: int = 600) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), SQLFEED_BIN=str(sqlfeed_bin()))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    assert done.returncode == 0, f"{args}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.mark.parametrize("example", SINGLE)
def test_example_runs(example):
    require("torch", "torch")
    require("pyarrow", "arrow")
    out = run([sys.executable, str(EXAMPLES / example), "--rows", "3000"])
    assert out.strip(), f"{example} printed nothing"


def read_log(path: Path) -> dict[int, tuple[str, float]]:
    steps = {}
    for line in path.read_text().split("\n"):
        if line:
            step, _epoch, digest, loss = line.split()
            steps[int(step)] = (digest, float(loss))
    return steps


def test_ddp_example_resumes_mid_epoch_with_the_same_batches(tmp_path):
    require("torch", "torch")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    script = [str(EXAMPLES / "05_ddp_train.py"), "--rows", "3000", "--steps", "60"]
    # 3000 rows / (32 x 2) = 46 steps per epoch: step 60 is in epoch 1.
    run([*torchrun, "--nproc_per_node", "2", *script, "--step-log", str(tmp_path / "full")])
    ckpt = str(tmp_path / "ckpt")
    base = [*torchrun, "--nproc_per_node", "2", *script, "--checkpoint", ckpt]
    run([*base, "--stop-after", "20", "--step-log", str(tmp_path / "part")])
    run([*base, "--resume", "--step-log", str(tmp_path / "part")])
    for rank in (0, 1):
        full = read_log(tmp_path / f"full.rank{rank}")
        part = read_log(tmp_path / f"part.rank{rank}")
        assert sorted(full) == sorted(part) == list(range(1, 61))
        assert [full[s][0] for s in full] == [part[s][0] for s in full], "the same batches"
        for step in full:
            assert full[step][1] == pytest.approx(part[step][1], rel=1e-4), f"loss at {step}"
