"""Quarantine (issue 61): a row whose functions fail is left out and
recorded, its slot takes the row before it in the epoch's order, and every
rank keeps its step count — on one process and under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import require

import sqlfeed

#: Ids the damaged data set breaks, by how (id % 300).
TRUNCATED, WRONG_FORMAT, RAISING = 3, 47, 71


def damage(image: bytes, id: int) -> bytes:
    """The image of row ``id`` as the damaged data set stores it."""
    if id % 300 == TRUNCATED:
        return image[: len(image) // 2]
    if id % 300 == WRONG_FORMAT:
        return b"GIF89a" + image[6:]
    return image


def row_id(row: dict) -> int:
    """The id of a quarantined row, from its file (part-N, 500 rows each)
    and row."""
    return int(Path(row["file"]).stem.split("-")[1]) * 500 + row["row"]


def damaged_ids(rows: int = 2000) -> set[int]:
    return {i for i in range(rows) if i % 300 in (TRUNCATED, WRONG_FORMAT, RAISING)}


@pytest.fixture(scope="module")
def damaged(gen_data, tmp_path_factory) -> Path:
    """gen_data's 2,000 ids and JPEG images in 4 files, 1% of the rows
    damaged: truncated, not an image format sqlfeed reads, or marked for
    the test's Python function to raise on."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    out = tmp_path_factory.mktemp("damaged")
    for part, path in enumerate(sorted(gen_data.glob("*.parquet"))):
        table = pq.read_table(path, columns=["id", "image_jpeg"])
        ids = table["id"].to_pylist()
        images = [
            damage(image, id)
            for image, id in zip(table["image_jpeg"].to_pylist(), ids, strict=True)
        ]
        pq.write_table(
            pa.table({"id": pa.array(ids, pa.int64()), "img": pa.array(images, pa.binary())}),
            out / f"part-{part}.parquet",
        )
    return out


def test_a_damaged_image_is_quarantined_and_named(session, damaged):
    feed = session.feed(
        f"SELECT image_resize(image_decode(img), 8, 8) AS x, id FROM '{damaged}/*.parquet'",
        batch_size=100,
        shuffle=5,
        device="cpu",
        format="numpy",
        on_error="quarantine",
    )
    ids = [i for batch in feed for i in batch["id"].tolist()]
    assert len(ids) == 2000, "the epoch keeps its length"
    broken = {i for i in damaged_ids() if i % 300 != RAISING}
    assert not broken & set(ids)
    assert set(ids) == set(range(2000)) - broken
    table = feed.quarantined()
    assert [row["position"] for row in table] == sorted(row["position"] for row in table)
    by_id = {row_id(r): r for r in table}
    assert set(by_id) == broken, "the table lists exactly the damaged rows"
    truncated = by_id[TRUNCATED]
    assert truncated["function"] == "image_decode" and truncated["column"] == "x"
    assert truncated["epoch"] == 0 and truncated["row_group"] == 0
    assert "format Gif is not supported" in by_id[WRONG_FORMAT]["error"]
    assert feed.quarantined(origins=False)[0]["file"] is None


def test_a_raising_python_function_is_quarantined_with_its_error(damaged):
    pa = require("pyarrow", "pyarrow")

    @sqlfeed.udf(pa.int64())
    def checked(ids):
        bad = [i for i in ids.to_pylist() if i % 300 == RAISING]
        if bad:
            raise ValueError(f"id {bad[0]} is marked as unreadable")
        return ids

    session = sqlfeed.Session(memory_limit="512M", target_partitions=2, functions=[checked])
    feed = session.feed(
        f"SELECT checked(id) AS id FROM '{damaged}/*.parquet'",
        batch_size=100,
        shuffle=5,
        device="cpu",
        format="numpy",
        on_error="quarantine",
    )
    ids = [i for batch in feed for i in batch["id"].tolist()]
    assert len(ids) == 2000
    raising = {i for i in damaged_ids() if i % 300 == RAISING}
    assert set(ids) == set(range(2000)) - raising
    table = feed.quarantined(origins=False)
    assert len(table) == len(raising)
    assert {row["function"] for row in table} == {"checked"}
    assert "is marked as unreadable" in table[0]["error"]
    # The state carries the table: a feed resumed from it starts with it.
    state = feed.state_dict()
    assert [(r["epoch"], r["position"]) for r in state["quarantined"]] == [
        (r["epoch"], r["position"]) for r in table
    ]


def test_past_max_quarantined_iteration_raises_a_summary(session, damaged):
    feed = session.feed(
        f"SELECT image_decode(img) AS x, id FROM '{damaged}/*.parquet'",
        batch_size=100,
        shuffle=5,
        device="cpu",
        on_error="quarantine",
        max_quarantined=3,
    )
    with pytest.raises(sqlfeed.ExecutionError) as raised:
        for _ in feed:
            pass
    message = str(raised.value)
    assert "quarantined 4 of the first" in message and "max_quarantined (3 rows)" in message
    assert "image_decode (column x)" in message
    assert len(feed.quarantined(origins=False)) == 4


def test_bad_quarantine_options_are_plan_errors(session, damaged):
    sql = f"SELECT id FROM '{damaged}/*.parquet'"
    with pytest.raises(sqlfeed.PlanError, match="expected 'fail'"):
        list(session.feed(sql, on_error="skip", device="cpu"))
    with pytest.raises(sqlfeed.PlanError, match="needs on_error='quarantine'"):
        list(session.feed(sql, max_quarantined=5, device="cpu"))
    with pytest.raises(sqlfeed.PlanError, match="neither a row count"):
        list(session.feed(sql, on_error="quarantine", max_quarantined="lots", device="cpu"))


def torchrun(world: int, data: Path, out: Path, mode: str) -> None:
    script = Path(__file__).with_name("quarantine_rank.py")
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
            str(world),
            str(script),
            str(data),
            str(out),
            mode,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]


def test_four_torchrun_ranks_train_two_epochs_and_resume_on_three(damaged, tmp_path):
    require("torch", "torch")
    torchrun(4, damaged, tmp_path, "whole")
    whole = [json.loads((tmp_path / f"whole-rank{r}.json").read_text()) for r in range(4)]
    # 2,000 rows, 4 ranks of 25: 20 steps per epoch on every rank, no hang.
    assert all(rank["steps"] == [40] * 4 for rank in whole)
    bad = damaged_ids()
    order: dict[int, list[int]] = {}
    for epoch in (0, 1):
        for step in range(20):
            for rank in range(4):
                fed = whole[rank]["fed"][epoch * 20 + step]
                assert fed[:2] == [epoch, step]
                order.setdefault(epoch, []).extend(fed[2])
        counts = Counter(order[epoch])
        assert len(order[epoch]) == 2000
        assert not bad & set(counts), "no damaged row is fed"
        assert set(counts) == set(range(2000)) - bad, "every good row is fed"
        assert sum(n - 1 for n in counts.values()) == len(bad), "each slot filled once"
    tables = [rank["quarantined"] for rank in whole]
    assert all(table == tables[0] for table in tables), "every rank holds the same table"
    listed = {(r["epoch"], row_id(r)) for r in tables[0]}
    assert listed == {(epoch, i) for epoch in (0, 1) for i in bad}
    by_function = Counter(row["function"] for row in tables[0])
    assert by_function == {"image_decode": 2 * 14, "checked": 2 * 7}

    # Rank 0 saved the state after step 9 of epoch 1: 1,000 rows consumed.
    torchrun(3, damaged, tmp_path, "resume")
    resumed = [json.loads((tmp_path / f"resume-rank{r}.json").read_text()) for r in range(3)]
    # 1,000 rows left in steps of 3 × 25: 13 steps (the last 25 rows dropped).
    assert all(rank["steps"] == [13] * 3 for rank in resumed)
    for rank, run in enumerate(resumed):
        for _, step, ids in run["fed"]:
            start = 1000 + (step * 3 + rank) * 25
            assert ids == order[1][start : start + 25], f"rank {rank} step {step}"
        assert run["quarantined"] == tables[0], "the uninterrupted run's table"
