"""The Python examples (examples/python) run on small generated data, and
the DDP example resumes mid-epoch with exactly the batches of an
uninterrupted run."""

from __future__ import annotations

import collections
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
    "02_preprocess_own.py",
    "03_prefetch_training.py",
    "04_global_shuffle.py",
    "06_text.py",
    "06_text_own.py",
    "07_cache.py",
    "08_cluster_functions.py",
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
            step, _epoch, digest, loss, _ids = line.split()
            steps[int(step)] = (digest, float(loss))
    return steps


def read_ids(path: Path) -> dict[int, list[int]]:
    """Each logged step's sample ids."""
    steps = {}
    for line in path.read_text().split("\n"):
        if line:
            step, _epoch, _digest, _loss, ids = line.split()
            steps[int(step)] = [int(i) for i in ids.split(",")]
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


def test_ddp_example_restarts_on_three_ranks_from_a_two_rank_checkpoint(tmp_path):
    """Issue 33: preempted on 2 ranks after step 20, back on 3: the epoch goes
    on from the same row of the same order, so across both runs every row of
    the epoch is trained on once, but the new shape's dropped tail."""
    require("torch", "torch")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    script = [str(EXAMPLES / "05_ddp_train.py"), "--rows", "3000"]
    ckpt = ["--checkpoint", str(tmp_path / "ckpt")]
    log = str(tmp_path / "log")
    two = [*torchrun, "--nproc_per_node", "2", *script, *ckpt]
    run([*two, "--steps", "60", "--stop-after", "20", "--step-log", log + ".two"])
    # 20 steps of 2 x 32 rows: 1280 of 3000 rows consumed; the 1720 left make
    # 17 steps of 3 x 32 (drop_last): the epoch ends after global step 37.
    three = [*torchrun, "--nproc_per_node", "3", *script, *ckpt, "--resume"]
    out = run([*three, "--steps", "37", "--step-log", log + ".three"])
    assert "3 ranks" in out and "starting at step 20" in out, out
    seen = collections.Counter()
    for world, ranks in (("two", 2), ("three", 3)):
        for rank in range(ranks):
            steps = read_ids(Path(f"{log}.{world}.rank{rank}"))
            expected = range(1, 21) if world == "two" else range(21, 38)
            assert sorted(steps) == list(expected), f"{world} rank {rank}"
            for ids in steps.values():
                assert len(ids) == 32
                seen.update(ids)
    assert max(seen.values()) == 1, "no row trained on twice in the epoch"
    assert len(seen) == 20 * 64 + 17 * 96 == 3000 - 88, "only the 88-row tail is dropped"
