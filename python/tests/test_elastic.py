"""Elastic resume from Python (issue 33): one state, saved by any rank,
resumes every rank of a run with another world size or batch size; skipped
steps leave every other batch where it was."""

from __future__ import annotations

import collections
import json
import subprocess

import pytest
from conftest import require, sqlfeed_bin

import sqlfeed


def _feed(session, ids_data, **options):
    options = dict(dict(batch_size=64, shuffle=5, device="cpu", format="numpy"), **options)
    return session.feed(f"SELECT id FROM '{ids_data}/*.parquet'", **options)


def _ids_of_first(feeds, batches):
    """How often each id came in the first `batches` batches of `feeds`."""
    ids = collections.Counter()
    for feed in feeds:
        it = iter(feed)
        for _ in range(batches):
            ids.update(next(it)["id"].tolist())
    return ids


def test_a_two_rank_checkpoint_resumes_on_three_ranks_with_every_row_once(session, ids_data):
    require("numpy", "numpy")
    before = [_feed(session, ids_data, shard=(rank, 2)) for rank in (0, 1)]
    consumed = _ids_of_first(before, 4)
    states = [feed.state_dict() for feed in before]
    assert states[0]["rows"] == 4 * 64 * 2
    assert {k: v for k, v in states[0].items() if k != "rank"} == {
        k: v for k, v in states[1].items() if k != "rank"
    }, "every rank's state is the same"
    state = json.loads(json.dumps(states[0]))
    after = [_feed(session, ids_data, batch_size=96, shard=(rank, 3)) for rank in range(3)]
    counts = []
    for feed in after:
        feed.load_state_dict(state)
        batches = [b["id"].tolist() for b in feed]
        counts.append(len(batches))
        consumed.update(i for b in batches for i in b)
        assert (feed.epoch, feed.step) == (1, 0)
    assert len(set(counts)) == 1, f"equal batch counts per rank: {counts}"
    assert set(consumed) == set(range(1000)), "no row skipped"
    # 488 rows left in steps of 288: a padded last step of 200 rows + 1 pad.
    assert sum(consumed.values()) == 1001
    # The next epoch is a fresh 3-rank run's.
    fresh = _feed(session, ids_data, batch_size=96, shard=(2, 3))
    fresh.set_epoch(1)
    again = list(after[2])
    assert [b["id"].tolist() for b in again] == [b["id"].tolist() for b in fresh]


def test_version_1_states_still_load(session, ids_data):
    require("numpy", "numpy")
    feed = _feed(session, ids_data, shard=(1, 2))
    it = iter(feed)
    for _ in range(3):
        next(it)
    state = feed.state_dict()
    old = {k: v for k, v in state.items() if k not in ("rows", "skipped")}
    old["version"] = 1
    resumed = _feed(session, ids_data, shard=(1, 2))
    resumed.load_state_dict(old)
    expected = [b["id"].tolist() for b in it]
    assert [b["id"].tolist() for b in resumed] == expected
    # Another query or seed is still refused, naming what differs.
    other = _feed(session, ids_data, shuffle=6)
    with pytest.raises(sqlfeed.PlanError, match="seed=5.*seed=6"):
        other.load_state_dict(state)


def test_skipped_steps_leave_the_other_batches_where_they_were(session, ids_data):
    require("numpy", "numpy")
    whole = [(b["id"].tolist()) for b in _feed(session, ids_data)]
    feed = _feed(session, ids_data)
    feed.skip_steps(0, [1, 5])
    assert [b["id"].tolist() for b in feed] == [b for i, b in enumerate(whole) if i not in (1, 5)]
    state = feed.state_dict()
    assert state["skipped"] == {"0": [1, 5]}
    resumed = _feed(session, ids_data)
    resumed.load_state_dict(dict(state, epoch=0, step=0, rows=0))
    assert len(list(resumed)) == len(whole) - 2, "the state keeps the skips"


def test_a_resume_over_changed_data_is_refused_naming_the_files(session, ids_data, tmp_path):
    require("numpy", "numpy")
    pa = require("pyarrow", "arrow")
    import shutil

    import pyarrow.parquet as pq

    data = tmp_path / "data"
    shutil.copytree(ids_data, data)
    query = f"SELECT id FROM '{data}/*.parquet'"
    feed = session.feed(query, batch_size=64, shuffle=5, device="cpu", format="numpy")
    it = iter(feed)
    next(it)
    state = json.loads(json.dumps(feed.state_dict()))
    assert len(state["data"]) == 4 and all(f[1] > 0 for f in state["data"])
    # The same files: resumes.
    same = session.feed(query, batch_size=64, shuffle=5, device="cpu", format="numpy")
    same.load_state_dict(state)
    assert [b["id"].tolist() for b in same] == [b["id"].tolist() for b in it]
    # An appended file moves every row of a shuffled epoch: refused by name.
    pq.write_table(pa.table({"id": pa.array(range(1000, 1100), pa.int64())}), data / "new.parquet")
    resumed = session.feed(query, batch_size=64, shuffle=5, device="cpu", format="numpy")
    with pytest.raises(sqlfeed.PlanError, match=r"1 added: .*new\.parquet.*restart_epoch"):
        resumed.load_state_dict(state)
    # A rewritten file is named as changed.
    pq.write_table(pa.table({"id": pa.array(range(7), pa.int64())}), data / "part-0.parquet")
    with pytest.raises(sqlfeed.PlanError, match=r"changed .*part-0\.parquet"):
        resumed.load_state_dict(state)
    # Asked for, the epoch starts anew over the data as it is now.
    resumed.load_state_dict(state, on_data_change="restart_epoch")
    assert (resumed.epoch, resumed.step) == (0, 0)
    ids = sorted(i for b in resumed for i in b["id"].tolist())
    assert len(ids) == 750 + 7 + 100


def _origin_ids(origins):
    """The ids `explain_batch`'s rows name (ids_data: id = 250 x part + row)."""
    ids = []
    for origin in origins:
        part = int(origin["file"].rsplit("/", 1)[1].removeprefix("part-").removesuffix(".parquet"))
        assert origin["file"].startswith("file:/")
        assert origin["row_group"] == 0, "pyarrow writes 250 rows as one row group"
        ids.append(250 * part + origin["row"])
    return ids


def test_explain_batch_names_the_rows_of_the_batch(session, ids_data):
    require("numpy", "numpy")
    feed = _feed(session, ids_data, batch_size=48, shard=(1, 3), epochs=2)
    batches = [(*b["_position"], b["id"].tolist()) for b in _with_positions(feed)]
    assert len(batches) == 2 * 7
    for epoch, step, ids in batches[5:9]:
        assert _origin_ids(feed.explain_batch(epoch, step)) == ids, (epoch, step)
    # Another rank's batch, as that rank's feed hands it over.
    other = _feed(session, ids_data, batch_size=48, shard=(0, 3))
    first = next(iter(other))["id"].tolist()
    assert _origin_ids(feed.explain_batch(0, 0, rank=0)) == first
    with pytest.raises(sqlfeed.PlanError, match="has no step 7"):
        feed.explain_batch(0, 7)
    with pytest.raises(sqlfeed.PlanError, match="ranks are 0..2"):
        feed.explain_batch(0, 0, rank=3)


def _with_positions(feed):
    """Yields the feed's batches; the feed's position, read before each
    batch, is that batch's (epoch, step)."""
    it = iter(feed)
    while True:
        epoch, step = feed.epoch, feed.step
        try:
            batch = next(it)
        except StopIteration:
            return
        batch["_position"] = (epoch, step)
        yield batch


@pytest.mark.parametrize("order", [{}, {"shuffle_by_position": True}], ids=["content", "position"])
def test_an_epoch_continues_over_appended_files(session, ids_data, tmp_path, order):
    require("numpy", "numpy")
    pa = pytest.importorskip("pyarrow")
    import shutil

    import pyarrow.parquet as pq

    data = tmp_path / "ids"
    shutil.copytree(ids_data, data)
    before = [_feed(session, data, shard=(rank, 2), **order) for rank in (0, 1)]
    consumed = _ids_of_first(before, 3)
    state = json.loads(json.dumps(before[0].state_dict()))
    assert state["rows"] == 384 and state["appended"] is None
    added = pa.table({"id": pa.array(range(1000, 1250), pa.int64())})
    pq.write_table(added, data / "part-4.parquet")
    with pytest.raises(sqlfeed.PlanError, match=r"1 added: .*part-4.*on_data_change='continue'"):
        _feed(session, data, **order).load_state_dict(state)
    after = [_feed(session, data, batch_size=50, shard=(rank, 3), **order) for rank in range(3)]
    for feed in after:
        feed.load_state_dict(state, on_data_change="continue")
    # Rank 1 stops after 2 batches of the continued epoch; its checkpoint
    # (which records the continuation) resumes on a new feed.
    it = iter(after[1])
    head = [next(it)["id"].tolist() for _ in range(2)]
    inner = json.loads(json.dumps(after[1].state_dict()))
    assert inner["appended"]["rows"] == 384 and inner["rows"] == 300
    resumed = _feed(session, data, batch_size=50, shard=(1, 3), **order)
    resumed.load_state_dict(inner)
    rest = [b["id"].tolist() for b in resumed]
    assert head + rest == [b["id"].tolist() for b in _continued(session, data, state, 1, order)]
    for rank in (0, 2):
        consumed.update(i for b in after[rank] for i in b["id"].tolist())
    consumed.update(i for b in head + rest for i in b)
    assert set(consumed) == set(range(1250)), "every old and new row"
    # 866 rows left in steps of 150: one pad in the padded last step.
    assert sum(consumed.values()) == 1251
    # Only added files can be continued over.
    (data / "part-2.parquet").unlink()
    with pytest.raises(sqlfeed.PlanError, match=r"1 removed: .*part-2.*only added files"):
        _feed(session, data, **order).load_state_dict(state, on_data_change="continue")


def _continued(session, data, state, rank, order):
    feed = _feed(session, data, batch_size=50, shard=(rank, 3), **order)
    feed.load_state_dict(state, on_data_change="continue")
    return list(feed)


def test_checkpoints_cross_between_the_cli_and_python(session, ids_data, tmp_path):
    require("numpy", "numpy")
    query = f"SELECT id FROM '{ids_data}/*.parquet'"

    def cli(*args):
        return subprocess.run(
            [str(sqlfeed_bin()), "feed", query, "--device", "cpu", "--shuffle-seed", "5", *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        ).stdout

    saved = tmp_path / "cli.json"
    cli(
        "--batch-size",
        "64",
        "--shard",
        "0/2",
        "--max-batches",
        "4",
        "--save-checkpoint",
        str(saved),
    )
    feed = _feed(session, ids_data, shard=(0, 2))
    it = iter(feed)
    for _ in range(4):
        next(it)
    # The CLI writes exactly the state Python's feed has there.
    assert json.loads(saved.read_text()) == json.loads(json.dumps(feed.state_dict()))
    # And reads Python's: three ranks of 96 go on from row 512 (488 rows
    # left in steps of 288: two steps each).
    written = tmp_path / "python.json"
    written.write_text(json.dumps(feed.state_dict()))
    for rank in range(3):
        resumed = _feed(session, ids_data, batch_size=96, shard=(rank, 3))
        resumed.load_state_dict(json.loads(saved.read_text()))
        python_digests = [b["id"].tolist() for b in resumed]
        lines = cli(
            "--batch-size", "96", "--shard", f"{rank}/3", "--resume-from", str(written), "--digest"
        ).splitlines()
        steps = [line for line in lines if line.startswith("batch ")]
        assert len(steps) == len(python_digests) == 2, lines
    # A state that is not a checkpoint is named.
    with pytest.raises(sqlfeed.PlanError, match="the state is not a sqlfeed feed checkpoint"):
        feed.load_state_dict({"epoch": 0})
