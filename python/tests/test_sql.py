"""Session.sql: Arrow PyCapsule streams, the dialect, errors."""

from __future__ import annotations

import pytest

import sqlfeed


def test_results_are_arrow_streams_read_without_a_copy(session, ids_data):
    pa = pytest.importorskip("pyarrow")
    result = session.sql(f"SELECT id, id * 2 AS twice FROM '{ids_data}/*.parquet' ORDER BY id")
    assert result.columns == ["id", "twice"]
    table = pa.table(result)  # through __arrow_c_stream__
    assert table.num_rows == 1000
    assert table.column("twice").to_pylist()[:3] == [0, 2, 4]
    assert result.to_arrow().equals(table)
    assert result.to_pylist()[999] == {"id": 999, "twice": 1998}
    # The stream is read lazily and can be read again.
    reader = pa.RecordBatchReader.from_stream(result)
    assert sum(batch.num_rows for batch in reader) == 1000


def test_the_dialect_works_as_in_the_repl(session, ids_data):
    files = f"'{ids_data}/*.parquet'"
    shuffled = session.sql(f"SELECT id FROM {files} SHUFFLE SEED 7").to_pylist()
    ids = [row["id"] for row in shuffled]
    assert sorted(ids) == list(range(1000)) and ids != sorted(ids)
    again = session.sql(f"SELECT id FROM {files} SHUFFLE SEED 7").to_pylist()
    assert ids == [row["id"] for row in again]
    summary = session.sql(f"SUMMARIZE (SELECT id FROM {files})").to_pylist()
    assert summary and summary[0]["column_name"] == "id"
    sample = session.sql(f"SAMPLE (SELECT id FROM {files}) 10 SEED 3").to_pylist()
    assert len(sample) == 10


def test_bad_sql_is_a_plan_error_naming_the_column(session, ids_data):
    with pytest.raises(sqlfeed.PlanError, match="no_such_column"):
        session.sql(f"SELECT no_such_column FROM '{ids_data}/*.parquet'")
    with pytest.raises(sqlfeed.Error):
        session.sql("SELEC 1")


def test_a_corrupt_file_is_an_execution_error_naming_it(session, tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1" + b"\x00" * 100 + b"PAR1")
    with pytest.raises(sqlfeed.Error, match="bad.parquet"):
        session.sql(f"SELECT * FROM '{bad}'").to_arrow()


def test_errors_form_one_hierarchy():
    for cls in (
        sqlfeed.PlanError,
        sqlfeed.ExecutionError,
        sqlfeed.ResourcesExhausted,
        sqlfeed.InternalError,
    ):
        assert issubclass(cls, sqlfeed.Error)
    assert issubclass(sqlfeed.Error, Exception)


def test_memory_limit_accepts_text_and_bytes():
    assert sqlfeed.Session(memory_limit="64M").memory_limit == 64 << 20
    assert sqlfeed.Session(memory_limit=1 << 30).memory_limit == 1 << 30
    with pytest.raises(sqlfeed.PlanError, match="memory_limit"):
        sqlfeed.Session(memory_limit="lots")
