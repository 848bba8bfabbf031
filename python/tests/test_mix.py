"""MIX from Python: a weighted mixture in SQL, fed with each source's share
in every batch, resumed from a state_dict, kept in the epoch cache by its
sources, and refused under a feed shuffle."""

from __future__ import annotations

import json

import pytest
from conftest import require

import sqlfeed


def _mix(ids_data, seed=""):
    files = f"'{ids_data}/*.parquet'"
    return (
        f"MIX (SELECT id FROM {files} WHERE id < 100) AS low WEIGHT 3, "
        f"(SELECT id FROM {files} WHERE id >= 900) AS high WEIGHT 1 ROWS 200 {seed}"
    )


def test_a_mixture_gives_each_source_its_share_and_names_it(session, ids_data):
    rows = session.sql(f"SELECT id, source FROM ({_mix(ids_data, 'SEED 1')})").to_pylist()
    assert len(rows) == 200
    low = [r["id"] for r in rows if r["source"] == "low"]
    high = [r["id"] for r in rows if r["source"] == "high"]
    # 150 of 100 rows: every low row once or twice; 50 of 100 high rows, once each.
    assert len(low) == 150 and set(low) == set(range(100))
    assert len(high) == 50 and len(set(high)) == 50 and min(high) >= 900


def _feed(session, ids_data, **options):
    sql = f"SELECT id FROM ({_mix(ids_data)})"
    options = dict(dict(batch_size=8, epochs=2, device="cpu", format="numpy"), **options)
    return session.feed(sql, **options)


def test_every_batch_holds_the_shares_and_a_state_dict_resumes_it(session, ids_data):
    require("numpy", "numpy")
    feed = _feed(session, ids_data)
    # A mixture's rows are known from its plan: 200 rows, batches of 8.
    assert len(feed) == 25
    it = iter(feed)
    first = [next(it)["id"].tolist() for _ in range(10)]
    state = feed.state_dict()
    rest = [b["id"].tolist() for b in it]
    batches = first + rest
    assert len(batches) == 2 * 200 // 8
    for ids in batches:
        # Two sources, 3:1 of 8 rows: exactly 6 and 2 in every batch.
        assert sum(1 for i in ids if i < 100) == 6, ids
    # Each epoch is another draw of the high source.
    epoch0 = {i for b in batches[:25] for i in b if i >= 900}
    epoch1 = {i for b in batches[25:] for i in b if i >= 900}
    assert len(epoch0) == 50 and len(epoch1) == 50 and epoch0.isdisjoint(epoch1)
    mixture = feed.stats()["mixture"]
    assert sorted(mixture) == [0, 1]
    assert mixture[1]["low"] == {"rows": 150, "share": 0.75}
    assert mixture[1]["high"] == {"rows": 50, "share": 0.25}
    resumed = _feed(session, ids_data)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert [b["id"].tolist() for b in resumed] == rest


def test_the_epoch_cache_keeps_the_sources_and_gives_the_uncached_batches(ids_data, tmp_path):
    require("numpy", "numpy")
    cache = tmp_path / "cache"
    session = sqlfeed.Session(memory_limit="1G", target_partitions=2, cache_dir=cache)
    uncached = [b["id"].tolist() for b in _feed(session, ids_data, epochs=3)]
    cached = [b["id"].tolist() for b in _feed(session, ids_data, epochs=3, cache=True)]
    assert cached == uncached and len(cached) == 3 * 200 // 8
    # One entry per source; the mixture is drawn from them every epoch.
    assert len(list((cache / "entries").iterdir())) == 2


def test_a_feed_shuffle_over_a_mixture_is_refused_with_the_reason(session, ids_data):
    with pytest.raises(sqlfeed.PlanError, match="orders its rows itself"):
        next(iter(_feed(session, ids_data, shuffle=3)))
