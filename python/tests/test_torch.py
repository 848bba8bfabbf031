"""PyTorch integration: DataLoader adapter and a real 2-process torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

import sqlfeed


# The worker is forked while JAX's threads (from another test) run; it only
# raises, so the fork warning does not apply.
@pytest.mark.filterwarnings("ignore:os.fork")
def test_the_iterable_dataset_adapter_works_with_a_dataloader(session, ids_data):
    torch = require("torch", "torch")
    from sqlfeed.torch import FeedDataset

    feed = session.feed(f"SELECT id FROM '{ids_data}/*.parquet'", batch_size=100, device="cpu")
    dataset = FeedDataset(feed)
    assert len(dataset) == 10
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=0)
    ids = torch.cat([batch["id"] for batch in loader])
    assert sorted(ids.tolist()) == list(range(1000))
    workers = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1)
    with pytest.raises(Exception, match="num_workers=0"):
        next(iter(workers))


def test_two_torchrun_ranks_get_equal_disjoint_complete_shards(ids_data, tmp_path):
    require("torch", "torch")
    script = Path(__file__).with_name("ddp_rank.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            str(ids_data),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["shard"] for r in ranks] == [[0, 2], [1, 2]], "shard='auto' read torch.distributed"
    counts = [len(r["batches"]) for r in ranks]
    assert counts[0] == counts[1] == ranks[0]["len"] == 8
    assert ranks[0]["counts"] == counts
    ids = [[i for batch in r["batches"] for i in batch] for r in ranks]
    assert not set(ids[0]) & set(ids[1]), "shards are disjoint"
    assert sorted(ids[0] + ids[1]) == list(range(1000)), "and cover the epoch"
    assert sqlfeed.__version__
