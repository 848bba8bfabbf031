"""Delta Lake tables (issue 30), written by the ``deltalake`` package (a real
writer, not sqlfeed): read as the table they are, at any version, pinned by
feeds and their checkpoints."""

from __future__ import annotations

import collections
import datetime
import json
import subprocess
import time

import pytest
from conftest import require, sqlfeed_bin

import sqlfeed


def _write(path, ids, mode, **extra):
    deltalake = require("deltalake", "deltalake")
    pa = require("pyarrow", "arrow")
    columns = {"id": pa.array(ids, pa.int64())}
    columns.update({k: pa.array(v) for k, v in extra.items()})
    # Appends merge schemas: a later append may lack a column an earlier added.
    schema_mode = "merge" if mode == "append" else None
    deltalake.write_deltalake(str(path), pa.table(columns), mode=mode, schema_mode=schema_mode)


@pytest.fixture()
def events(tmp_path):
    """v0: ids 0..999 (append); v1: + 1000..1499 (append); v2: overwritten
    with 0..499, whose files replace the others but stay in the folder;
    v3: + 5000..5099 with a new column ``label``."""
    table = tmp_path / "events"
    _write(table, range(1000), "append")
    # Apart in time: TIMESTAMP AS OF compares with the commit files' times.
    time.sleep(0.1)
    _write(table, range(1000, 1500), "append")
    _write(table, range(500), "overwrite")
    _write(table, range(5000, 5100), "append", label=[f"l{i}" for i in range(100)])
    return table


def _ids(session, sql):
    return sorted(row["id"] for row in session.sql(sql).to_pylist())


def test_a_table_reads_each_version_exactly_as_written(session, events):
    latest = _ids(session, f"SELECT id FROM '{events}'")
    assert latest == list(range(500)) + list(range(5000, 5100)), "never the removed files"
    assert _ids(session, f"SELECT id FROM '{events}' VERSION AS OF 0") == list(range(1000))
    assert _ids(session, f"SELECT id FROM '{events}@v1'") == list(range(1500))
    assert _ids(session, f"SELECT id FROM '{events}/' VERSION AS OF 2") == list(range(500))
    # The column added in version 3 is null in the rows written before it.
    labels = session.sql(
        f"SELECT label, count(*) AS n FROM '{events}' GROUP BY label IS NULL, label"
    ).to_pylist()
    assert sum(r["n"] for r in labels if r["label"] is None) == 500
    history = session.sql(f"DESCRIBE HISTORY '{events}'").to_pylist()
    assert [h["version"] for h in history] == [3, 2, 1, 0]
    assert [json.loads(h["operation_parameters"])["mode"] for h in history] == [
        "Append",
        "Overwrite",
        "Append",
        "Append",
    ]
    # A time between the first two commits reads the first version.
    before_second = (history[-2]["timestamp"] - datetime.timedelta(milliseconds=50)).isoformat()
    assert _ids(session, f"SELECT id FROM '{events}' TIMESTAMP AS OF '{before_second}'") == list(
        range(1000)
    )
    with pytest.raises(sqlfeed.PlanError, match="has no version as of 2001-01-01"):
        session.sql(f"SELECT id FROM '{events}' TIMESTAMP AS OF '2001-01-01'").to_pylist()


def test_wrong_versions_and_reads_inside_a_table_are_errors_naming_them(session, events):
    with pytest.raises(
        sqlfeed.PlanError, match=r"version 9 of the Delta Lake table .*newest version is 3"
    ):
        session.sql(f"SELECT * FROM '{events}@v9'").to_pylist()
    with pytest.raises(sqlfeed.PlanError, match="reads inside the Delta Lake table"):
        session.sql(f"SELECT * FROM '{events}/*.parquet'").to_pylist()
    with pytest.raises(sqlfeed.PlanError, match="is not a Delta Lake table"):
        session.sql(f"SELECT * FROM '{events.parent}@v1'").to_pylist()
    with pytest.raises(sqlfeed.Error, match="VERSION AS OF takes a version number"):
        session.sql(f"SELECT * FROM '{events}' VERSION AS OF 'x'").to_pylist()


def test_a_vacuumed_version_is_an_error_naming_the_version_and_file(session, events):
    deltalake = require("deltalake", "deltalake")
    deltalake.DeltaTable(str(events)).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False
    )
    assert len(_ids(session, f"SELECT id FROM '{events}'")) == 600
    with pytest.raises(sqlfeed.PlanError, match=r"version 1 of the Delta Lake table .* is gone"):
        session.sql(f"SELECT id FROM '{events}@v1'").to_pylist()


def _feed(session, table, **options):
    options = dict(dict(batch_size=100, shuffle=3, device="cpu", format="numpy"), **options)
    return session.feed(f"SELECT id FROM '{table}'", **options)


def test_a_feed_reads_its_pinned_version_every_epoch_and_on_resume(session, events):
    require("numpy", "numpy")
    feed = _feed(session, events, epochs=2)
    it = iter(feed)
    first = [next(it)["id"].tolist() for _ in range(3)]
    state = feed.state_dict()
    assert state["delta_versions"] == {str(events): 3}
    # Someone commits while the run goes on: the feed still reads version 3.
    _write(events, range(9000, 9400), "append")
    rest = [b["id"].tolist() for b in it]
    epoch0 = first + rest[: 6 - 3]
    assert sorted(i for b in epoch0 for i in b) == list(range(500)) + list(range(5000, 5100))
    epoch1 = rest[6 - 3 :]
    assert sorted(i for b in epoch1 for i in b) == sorted(i for b in epoch0 for i in b)
    # The checkpoint resumes on the pinned version, after the new commit.
    resumed = _feed(session, events, epochs=2)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert [b["id"].tolist() for b in resumed] == rest
    # A new feed pins the newest version.
    fresh = collections.Counter(i for b in _feed(session, events) for i in b["id"].tolist())
    assert len(fresh) == 1000 and 9399 in fresh
    # '@latest' opts out of pinning: no version is recorded.
    latest = session.feed(
        f"SELECT id FROM '{events}@latest'", batch_size=100, device="cpu", format="numpy"
    )
    next(iter(latest))
    assert "delta_versions" not in latest.state_dict()


def test_the_cli_and_the_cache_key_on_the_version(session, events, tmp_path):
    require("numpy", "numpy")
    out = subprocess.run(
        [
            str(sqlfeed_bin()),
            "-c",
            f"SELECT count(*) AS n FROM '{events}' VERSION AS OF 1",
            "--format",
            "csv",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    assert out.stdout.split() == ["n", "1500"], out
    ckpt = tmp_path / "ckpt.json"
    subprocess.run(
        [
            str(sqlfeed_bin()),
            "feed",
            f"SELECT id FROM '{events}'",
            "--batch-size",
            "100",
            "--shuffle-seed",
            "1",
            "--max-batches",
            "2",
            "--device",
            "cpu",
            "--save-checkpoint",
            str(ckpt),
        ],
        check=True,
        capture_output=True,
    )
    assert json.loads(ckpt.read_text())["delta_versions"] == {str(events): 3}
    # The epoch cache keys on the version: a commit is a new entry.
    cached = [
        sorted(i for b in _feed(session, events, cache=True) for i in b["id"].tolist())
        for _ in range(2)
    ]
    assert cached[0] == cached[1]
    _write(events, range(7000, 7010), "append")
    after = sorted(i for b in _feed(session, events, cache=True) for i in b["id"].tolist())
    assert after == sorted(cached[0] + list(range(7000, 7010)))


def test_partitions_are_pruned_by_the_log_and_read_as_columns(session, tmp_path):
    deltalake = require("deltalake", "deltalake")
    pa = require("pyarrow", "arrow")
    table = tmp_path / "by_day"
    ids = list(range(300))
    days = [i % 3 for i in ids]
    deltalake.write_deltalake(
        str(table),
        pa.table({"id": pa.array(ids, pa.int64()), "day": pa.array(days, pa.int32())}),
        partition_by=["day"],
    )
    rows = session.sql(
        f"SELECT day, count(*) AS n, sum(id) AS s FROM '{table}' WHERE day >= 1 "
        "GROUP BY day ORDER BY day"
    )
    assert rows.to_pylist() == [
        {"day": 1, "n": 100, "s": sum(i for i in ids if i % 3 == 1)},
        {"day": 2, "n": 100, "s": sum(i for i in ids if i % 3 == 2)},
    ]
    # The filter on the partition column reaches the scan: one file per day.
    plan = "\n".join(
        r["plan"]
        for r in session.sql(f"EXPLAIN SELECT id FROM '{table}' WHERE day = 2").to_pylist()
    )
    assert "day=2/" in plan and "day=0" not in plan and "day=1" not in plan, plan
    # A partition folder read as loose files is refused, naming the table.
    with pytest.raises(sqlfeed.PlanError, match="reads inside the Delta Lake table"):
        session.sql(f"SELECT * FROM '{table}/day=1/'").to_pylist()
