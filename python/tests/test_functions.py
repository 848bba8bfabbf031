"""Your own functions from Python (issue 27): scalar and batch functions in
SQL and feeds, worker processes (concurrency), errors that name the function,
dying workers, Ctrl-C, identities for the cache, seeds per epoch, Rust
plugins from ``Session(plugins=...)``, and the refusal on a cluster.

The functions are module-level ``def``s: worker processes import them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import traceback
from pathlib import Path

import pytest
from conftest import REPO, require

import sqlfeed

pa = pytest.importorskip("pyarrow")
pc = pytest.importorskip("pyarrow.compute")


def _session(*functions, **options):
    options.setdefault("memory_limit", "1G")
    options.setdefault("target_partitions", 2)
    return sqlfeed.Session(functions=list(functions), **options)


# -- module-level functions (importable by workers) ----------------------------


def plus_ten(x):
    return pc.add(x, 10)


def double_numpy(x):
    return x * 2.0


def where_am_i(x):
    """The pid of the process that ran the batch, per row."""
    return pa.array([os.getpid()] * len(x), pa.int64())


def split_words(batch):
    words = [len(c.split()) for c in batch["text"]]
    return {"words": words, "label2": batch["label"] * 2}


ROWS_SEEN_BY_PAIR_UP = []


def pair_up(batch):
    """A struct of two fields per row, counting the rows it is called on."""
    ROWS_SEEN_BY_PAIR_UP.append(len(batch["id"]))
    return {"a": batch["id"], "b": pc.multiply(batch["id"], 2)}


def divide_by_zero(x):
    return pc.divide(x, 0) if len(x) else x


def one_short(x):
    return x[1:]


def die_on_seven(x):
    if 7 in x.to_pylist():
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def the_seed(x, seed):
    return pa.array([seed % 1000] * len(x), pa.int64())


def slow_identity(x):
    time.sleep(0.2)
    return x


# -- tests ----------------------------------------------------------------------


def test_a_scalar_function_is_called_in_sql_over_arrow_arrays(ids_data):
    f = sqlfeed.udf(pa.int64())(plus_ten)
    session = _session(f)
    table = session.sql(
        f"SELECT id, plus_ten(id) AS y FROM '{ids_data}/*.parquet' ORDER BY id"
    ).to_arrow()
    assert table.column("y").to_pylist() == [i + 10 for i in range(1000)]
    # Read through the Arrow stream protocol (pyarrow may hold the GIL while
    # it pulls batches): no deadlock with the function's own GIL use.
    streamed = pa.table(session.sql(f"SELECT plus_ten(id) AS y FROM '{ids_data}/*.parquet'"))
    assert sorted(streamed.column("y").to_pylist()) == [i + 10 for i in range(1000)]
    # Still a plain Python function.
    assert f(pa.array([1])).to_pylist() == [11]


def test_numpy_functions_and_declared_input_types_are_coerced(ids_data):
    f = sqlfeed.udf(pa.float64(), input_types=[pa.float64()], batch_format="numpy")(double_numpy)
    session = _session(f)
    table = session.sql(
        f"SELECT double_numpy(id) AS y FROM '{ids_data}/*.parquet' ORDER BY id LIMIT 3"
    ).to_arrow()
    assert table.column("y").to_pylist() == [0.0, 2.0, 4.0]


def test_a_batch_function_returns_declared_columns_and_feeds_them(gen_data):
    require("numpy", "numpy")
    f = sqlfeed.batch_udf({"words": pa.int64(), "label2": pa.int64()}, inputs=["text", "label"])(
        split_words
    )
    session = _session(f)
    query = (
        "SELECT b['words'] AS words, b['label2'] AS label2, caption, label FROM "
        f"(SELECT split_words(caption, label) AS b, caption, label FROM '{gen_data}/*.parquet')"
    )
    rows = session.sql(query + " ORDER BY caption").to_pylist()
    assert len(rows) == 2000
    for row in rows[:50]:
        assert row["words"] == len(row["caption"].split())
        assert row["label2"] == 2 * row["label"]
    feed = session.feed(
        f"SELECT b['label2'] AS y FROM (SELECT split_words(caption, label) AS b "
        f"FROM '{gen_data}/*.parquet')",
        batch_size=100,
        shuffle=3,
        device="cpu",
        format="numpy",
    )
    batches = list(feed)
    assert len(batches) == 20
    assert all(b["y"].shape == (100,) for b in batches)
    # The declared inputs are the arity.
    with pytest.raises(sqlfeed.PlanError, match="expected 2 arguments but received 1"):
        session.sql(f"SELECT split_words(caption) FROM '{gen_data}/*.parquet'")


def test_a_batch_function_read_field_by_field_runs_once_per_row(ids_data):
    # DataFusion 55's leaf-expression push-down rewrote `p['a'], p['b']`
    # into `pair_up(id)['a'], pair_up(id)['b']`: two calls per row (issue 27).
    f = sqlfeed.batch_udf({"a": pa.int64(), "b": pa.int64()}, inputs=["id"])(pair_up)
    session = _session(f)
    ROWS_SEEN_BY_PAIR_UP.clear()
    table = session.sql(
        "SELECT p['a'] AS a, p['b'] AS b FROM "
        f"(SELECT pair_up(id) AS p FROM '{ids_data}/*.parquet')"
    ).to_arrow()
    assert sorted(table.column("b").to_pylist()) == [2 * i for i in range(1000)]
    assert sum(ROWS_SEEN_BY_PAIR_UP) == 1000


def test_a_raising_function_names_itself_with_the_traceback(ids_data):
    session = _session(sqlfeed.udf(pa.float64())(divide_by_zero))
    # The function's own exception comes back (issue 56, item 8).
    with pytest.raises(pa.ArrowInvalid) as err:
        session.sql(f"SELECT divide_by_zero(id) FROM '{ids_data}/*.parquet'").to_arrow()
    text = "".join(traceback.format_exception(err.value))
    assert "divide by zero" in str(err.value)
    assert "Python function 'divide_by_zero' (test_functions.divide_by_zero)" in text
    assert "on a batch of" in text
    assert "Traceback (most recent call last)" in text
    assert "test_functions.py" in text and "in divide_by_zero" in text


class ReadingFailed(Exception):
    """A user's own exception type (module level: workers unpickle it)."""


def fail_reading(x):
    raise ReadingFailed(f"cannot read row {x[0]}")


def test_a_users_exception_comes_back_as_itself_and_sqlfeeds_are_sqlfeed_errors(ids_data):
    """Issue 56, item 8: ``except MyError`` matches, in-process and from a
    worker process; FunctionFailed is a sqlfeed.Error."""
    for concurrency in (1, 2):
        f = sqlfeed.udf(pa.int64(), concurrency=concurrency)(fail_reading)
        session = _session(f)
        try:
            with pytest.raises(ReadingFailed, match="cannot read row") as err:
                session.sql(f"SELECT fail_reading(id) FROM '{ids_data}/*.parquet'").to_arrow()
            text = "".join(traceback.format_exception(err.value))
            assert "raised in Python function 'fail_reading' (test_functions.fail_reading)" in text
            if concurrency > 1:
                assert "in worker process" in text and "in fail_reading" in text
            # Through a feed too.
            feed = session.feed(
                f"SELECT fail_reading(id) AS x FROM '{ids_data}/*.parquet'",
                batch_size=64,
                device="cpu",
                format="numpy",
            )
            with pytest.raises(ReadingFailed):
                list(feed)
        finally:
            f.close()
    assert issubclass(sqlfeed.FunctionFailed, sqlfeed.ExecutionError)
    assert issubclass(sqlfeed.FunctionFailed, sqlfeed.Error)
    session = _session(sqlfeed.udf(pa.int64())(one_short))
    with pytest.raises(sqlfeed.Error) as err:
        session.sql(f"SELECT one_short(id) FROM '{ids_data}/*.parquet'").to_arrow()
    assert isinstance(err.value, sqlfeed.FunctionFailed), type(err.value)


def test_a_result_of_the_wrong_length_or_type_is_an_error(ids_data):
    session = _session(sqlfeed.udf(pa.int64())(one_short))
    with pytest.raises(sqlfeed.ExecutionError, match="values for a batch of .* rows"):
        session.sql(f"SELECT one_short(id) FROM '{ids_data}/*.parquet'").to_arrow()
    session = _session(sqlfeed.udf(pa.int64(), name="wrong_type")(lambda x: ["a"] * len(x)))
    with pytest.raises(sqlfeed.ExecutionError, match="Python function 'wrong_type'.*returned"):
        session.sql(f"SELECT wrong_type(id) FROM '{ids_data}/*.parquet'").to_arrow()


def test_names_of_sqlfeed_functions_are_not_taken():
    with pytest.raises(sqlfeed.PlanError, match="a function 'image_decode' exists already"):
        _session(sqlfeed.udf(pa.int64(), name="image_decode")(plus_ten))
    with pytest.raises(TypeError, match="takes functions made with @sqlfeed.udf"):
        _session(plus_ten)


def test_concurrency_runs_batches_in_worker_processes_with_the_same_results(ids_data):
    query = f"SELECT id, where_am_i(id) AS pid FROM '{ids_data}/*.parquet'"
    pooled = sqlfeed.udf(pa.int64(), concurrency=2, costly=True)(where_am_i)
    session = _session(pooled, batch_size=64)
    try:
        table = session.sql(query + " ORDER BY id").to_arrow()
        pids = set(table.column("pid").to_pylist())
        assert os.getpid() not in pids, "ran in this process"
        assert len(pids) == 2, f"two workers shared the batches: {pids}"
        assert sorted(pids) == sorted(pooled._pool.pids())
    finally:
        pooled.close()
    # The same values as in-process.
    f = sqlfeed.udf(pa.int64(), concurrency=2)(plus_ten)
    in_process = sqlfeed.udf(pa.int64(), name="plus_ten_here")(plus_ten)
    session = _session(f, in_process)
    try:
        table = session.sql(
            f"SELECT plus_ten(id) AS a, plus_ten_here(id) AS b FROM '{ids_data}/*.parquet'"
        ).to_arrow()
        assert table.column("a").to_pylist() == table.column("b").to_pylist()
    finally:
        f.close()


def test_a_function_workers_cannot_import_is_refused_with_what_to_do(ids_data):
    session = _session(sqlfeed.udf(pa.int64(), name="lam", concurrency=2)(lambda x: x))
    with pytest.raises(sqlfeed.ExecutionError, match="cannot be sent to worker processes"):
        session.sql(f"SELECT lam(id) FROM '{ids_data}/*.parquet'").to_arrow()


def test_a_function_of_python_c_is_refused_as_unimportable_not_as_a_dead_worker(ids_data):
    """Issue 56, item 5: a function defined in ``python -c`` pickles by name
    but no worker can import it; the error said the worker died (out of
    memory?)."""
    script = textwrap.dedent(
        f"""
        import pyarrow as pa, sqlfeed
        def halve(x):
            return x
        f = sqlfeed.udf(pa.int64(), concurrency=2)(halve)
        s = sqlfeed.Session(functions=[f], target_partitions=2)
        try:
            s.sql("SELECT halve(id) FROM '{ids_data}/*.parquet'").to_arrow()
        except sqlfeed.FunctionFailed as err:
            print("REFUSED", err)
        finally:
            f.close()
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "REFUSED worker processes cannot import Python function 'halve'" in done.stdout
    assert "Can't get attribute 'halve'" in done.stdout
    assert "define it in a module" in done.stdout and "concurrency=1" in done.stdout
    assert "out of memory" not in done.stdout


def test_a_decorated_module_level_function_runs_in_workers(tmp_path, ids_data):
    """The guide's form: ``@sqlfeed.udf(..., concurrency=2)`` on a module-level
    ``def`` binds the name to the Function, so pickle refused the function
    itself ("not the same object as __main__.double"). It now goes by module
    and name and the worker takes that Function's function, also from a
    script, which spawned workers import as ``__mp_main__``."""
    script = tmp_path / "decorated.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import pyarrow as pa, pyarrow.compute as pc, sqlfeed

            @sqlfeed.udf(pa.int64(), concurrency=2)
            def double(x):
                return pc.multiply(x, 2)

            if __name__ == "__main__":
                s = sqlfeed.Session(functions=[double], target_partitions=2)
                t = s.sql("SELECT sum(double(id)) AS d, sum(id) AS i FROM '{ids_data}/*.parquet'")
                row = t.to_pylist()[0]
                assert row["d"] == 2 * row["i"], row
                print("OK", row["d"])
                double.close()
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("OK "), done.stdout


def test_the_interpreter_exits_cleanly_after_a_failed_query(tmp_path, ids_data):
    """Issue 56, item 4: engine threads of a failed query were still inside
    Python functions while the interpreter finalized (``Fatal Python error:
    PyGILState_Release``, about 4 runs in 10)."""
    script = tmp_path / "fails_then_exits.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import time
            import pyarrow as pa, pyarrow.compute as pc, sqlfeed

            def boom(x):
                if pc.min(x).as_py() < 50:
                    raise ValueError("boom")
                time.sleep(0.05)
                return x

            f = sqlfeed.udf(pa.int64(), name="boom")(boom)
            s = sqlfeed.Session(functions=[f], target_partitions=4, batch_size=16)
            try:
                s.sql("SELECT sum(boom(id)) FROM '{ids_data}/*.parquet'").to_arrow()
            except ValueError:
                print("FAILED AS EXPECTED", flush=True)
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for run in range(8):
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
        )
        assert "FAILED AS EXPECTED" in done.stdout, (run, done.stdout, done.stderr)
        assert done.returncode == 0 and "Fatal Python error" not in done.stderr, (
            run,
            done.returncode,
            done.stderr[-2000:],
        )


def test_ctrl_c_stops_a_query_that_is_being_collected(tmp_path, ids_data, ctrl_c_raises):
    """Issue 56, item 8: ``to_arrow()`` waited for the whole query before
    Ctrl-C was seen."""
    script = tmp_path / "interrupted_query.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import time
            import pyarrow as pa, sqlfeed

            def slow(x):
                time.sleep(0.5)
                return x

            f = sqlfeed.udf(pa.int64(), name="slow")(slow)
            s = sqlfeed.Session(functions=[f], target_partitions=2, batch_size=8)
            print("started", flush=True)
            s.sql("SELECT slow(id) FROM '{ids_data}/*.parquet'").to_arrow()
            print("finished", flush=True)
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout.readline().strip() == "started"
        time.sleep(1.0)
        child.send_signal(signal.SIGINT)
        sent = time.monotonic()
        # The query takes about a minute (125 batches of half a second on
        # two threads); interrupted, it ends within a few seconds.
        _, stderr = child.communicate(timeout=30)
        took = time.monotonic() - sent
        assert "KeyboardInterrupt" in stderr, stderr[-2000:]
        assert child.returncode != 0
        # It took 15 s while the engine's worker threads were busy in the
        # function: the wait slept on a tokio timer that only they service.
        assert took < 8, f"{took:.1f} s after SIGINT"
    finally:
        child.kill()


def test_a_worker_that_dies_is_an_error_not_a_hang(ids_data):
    f = sqlfeed.udf(pa.int64(), concurrency=2)(die_on_seven)
    session = _session(f)
    try:
        started = time.monotonic()
        with pytest.raises(sqlfeed.ExecutionError) as err:
            session.sql(f"SELECT die_on_seven(id) FROM '{ids_data}/*.parquet'").to_arrow()
        assert time.monotonic() - started < 60
        text = str(err.value)
        assert "a worker process of Python function 'die_on_seven'" in text
        assert "killed by SIGKILL" in text
        # The pool starts a new worker: the next query runs.
        table = session.sql(
            f"SELECT die_on_seven(id) AS x FROM '{ids_data}/*.parquet' WHERE id > 7"
        ).to_arrow()
        assert table.num_rows == 992
    finally:
        f.close()


def test_ctrl_c_stops_the_workers(tmp_path, ids_data, ctrl_c_raises):
    script = tmp_path / "interrupted.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, sys, time
            import pyarrow as pa
            import sqlfeed

            def slow(x):
                time.sleep(0.2)
                return x

            if __name__ == "__main__":
                f = sqlfeed.udf(pa.int64(), concurrency=2)(slow)
                s = sqlfeed.Session(functions=[f], target_partitions=2, batch_size=16)
                feed = s.feed("SELECT slow(id) AS x FROM '{ids_data}/*.parquet'",
                              batch_size=16, device="cpu", format="numpy")
                for i, batch in enumerate(feed):
                    if i == 2:
                        print("pids", *f._pool.pids(), flush=True)
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        line = child.stdout.readline()
        assert line.startswith("pids"), line
        pids = [int(p) for p in line.split()[1:]]
        assert len(pids) == 2
        child.send_signal(signal.SIGINT)
        child.wait(timeout=30)
        deadline = time.monotonic() + 5
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = [p for p in pids if _alive(p)]
            time.sleep(0.1)
        assert not alive, f"workers {alive} outlived the interrupted process"
        assert child.returncode != 0
    finally:
        child.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


def test_the_identity_follows_code_closures_and_versions():
    def make(k):
        def f(x):
            return pc.add(x, k)

        return f

    ident = lambda fn, **kw: sqlfeed.udf(pa.int64(), name="f", **kw)(fn).identity  # noqa: E731
    assert ident(make(1)) == ident(make(1))
    assert ident(make(1)) != ident(make(2)), "a closed-over value changes it"
    assert ident(plus_ten) != ident(one_short), "the code changes it"
    assert ident(make(1), version="3") == ident(make(2), version="3")
    assert ident(plus_ten) != ident(plus_ten, volatility="volatile")


def test_a_cached_feed_misses_when_the_function_changes(tmp_path, ids_data):
    def feed_ys(k):
        def shifted(x):
            return pc.add(x, k)

        f = sqlfeed.udf(pa.int64(), name="shifted")(shifted)
        session = sqlfeed.Session(functions=[f], cache_dir=tmp_path, target_partitions=2)
        feed = session.feed(
            f"SELECT shifted(id) AS y FROM '{ids_data}/*.parquet'",
            batch_size=250,
            device="cpu",
            format="numpy",
            cache=True,
        )
        return sorted(int(v) for b in feed for v in b["y"])

    assert feed_ys(1) == [i + 1 for i in range(1000)]
    assert feed_ys(1) == [i + 1 for i in range(1000)]
    assert feed_ys(5) == [i + 5 for i in range(1000)], "a stale cache served old values"


def test_a_seeded_function_gets_a_seed_per_epoch_that_repeats(ids_data):
    f = sqlfeed.udf(pa.int64(), seeded=True, seed=9)(the_seed)
    session = _session(f)

    def seeds():
        feed = session.feed(
            f"SELECT the_seed(id) AS s FROM '{ids_data}/*.parquet'",
            batch_size=500,
            shuffle=2,
            device="cpu",
            format="numpy",
            epochs=2,
        )
        return [int(b["s"][0]) for b in feed]

    first = seeds()
    assert len(first) == 4
    assert first[0] == first[1] and first[2] == first[3]
    assert first[0] != first[2], "both epochs got the same seed"
    assert seeds() == first
    # Outside a feed, the declared seed itself.
    table = session.sql("SELECT the_seed(1) AS s").to_arrow()
    assert table.column("s").to_pylist() == [9]


def test_rust_plugins_load_from_python():
    library = REPO / "target" / "debug" / "libsqlfeed_udf_plugin.so"
    if not library.exists():
        pytest.fail(f"{library} is missing: cargo build --workspace --lib (scripts/test.sh does)")
    session = sqlfeed.Session(plugins=[library])
    rows = session.sql("SELECT ngram_hash('abc', 2, 1000) AS g").to_pylist()
    assert len(rows[0]["g"]) == 2
    with pytest.raises(sqlfeed.PlanError, match="cannot load it as a shared library"):
        sqlfeed.Session(plugins=[REPO / "README.md"])


def test_a_standalone_cluster_runs_the_sessions_python_functions(ids_data):
    # cluster="standalone" runs its executor in this process, which hosts the
    # functions the session starts with; one registered later is not hosted
    # (a real cluster's executors host their --function-dir:
    # test_cluster_functions.py).
    plus = sqlfeed.udf(pa.int64())(plus_ten)
    query = f"SELECT plus_ten(id) AS y FROM '{ids_data}/*.parquet' ORDER BY y"
    standalone = sqlfeed.Session(cluster="standalone", functions=[plus])
    rows = standalone.sql(query).to_arrow().column("y").to_pylist()
    assert rows == [i + 10 for i in range(1000)]
    standalone.register(sqlfeed.udf(pa.int64(), name="later")(plus_ten))
    with pytest.raises(sqlfeed.ExecutionError, match="is not hosted by this executor"):
        standalone.sql(f"SELECT later(id) FROM '{ids_data}/*.parquet'").to_arrow()
    with pytest.raises(TypeError, match="functions= takes functions made with"):
        sqlfeed.Session(functions=[plus_ten])
