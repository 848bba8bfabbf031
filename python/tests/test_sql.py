"""Session.sql: Arrow PyCapsule streams, the dialect, errors."""

from __future__ import annotations

import contextlib
import http.server
import threading
from pathlib import Path

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


@contextlib.contextmanager
def _range_server(path: Path):
    """Serves ``path`` on 127.0.0.1 (a free port) with HEAD and ranged GETs,
    which object_store needs (``http.server`` alone ignores ``Range``); yields
    the file's URL and the list of requests seen."""
    body = path.read_bytes()
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, send_body: bool) -> None:
            seen.append(f"{self.command} {self.path}")
            if self.path != f"/{path.name}":
                self.send_error(404)
                return
            start, end, status = 0, len(body) - 1, 200
            spec = self.headers.get("Range", "")
            if spec.startswith("bytes="):
                first, _, last = spec[len("bytes=") :].partition("-")
                if first:
                    start, end = int(first), min(int(last or end), end)
                else:
                    start = max(len(body) - int(last), 0)
                status = 206
            self.send_response(status)
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("Accept-Ranges", "bytes")
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(body)}")
            self.end_headers()
            if send_body:
                self.wfile.write(body[start : end + 1])

        def do_GET(self) -> None:
            self._answer(send_body=True)

        def do_HEAD(self) -> None:
            self._answer(send_body=False)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{path.name}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_plain_http_is_refused_without_allow_http(ids_data, monkeypatch):
    monkeypatch.delenv("SQLFEED_ALLOW_HTTP", raising=False)
    session = sqlfeed.Session(target_partitions=2)
    with _range_server(ids_data / "part-0.parquet") as (url, seen):
        with pytest.raises(sqlfeed.PlanError) as refused:
            session.sql(f"SELECT count(*) AS n FROM '{url}'")
    message = str(refused.value)
    for part in (url, "plain HTTP is refused", "allow_http=True", "--allow-http"):
        assert part in message, f"{part!r} missing from: {message}"
    assert seen == [], "the refusal must come before any request"


def test_allow_http_reads_a_local_http_server(ids_data, monkeypatch):
    pytest.importorskip("pyarrow")
    monkeypatch.delenv("SQLFEED_ALLOW_HTTP", raising=False)
    session = sqlfeed.Session(target_partitions=2, allow_http=True)
    with _range_server(ids_data / "part-1.parquet") as (url, seen):
        rows = session.sql(f"SELECT count(*) AS n, min(id) AS lo FROM '{url}'").to_pylist()
    assert rows == [{"n": 250, "lo": 250}]
    assert seen, "the rows came from the server"
