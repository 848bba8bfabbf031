"""Python functions on a Ballista cluster (issue 57), on real processes: a
scheduler and two executors started with ``--python`` and ``--function-dir``
run the same scalar, batch and seeded functions as the embedded engine, with
the same results; a function whose code differs, one the executors do not
host, one that raises and a worker killed on an executor reach the client as
errors naming them; an executor whose folder or interpreter is unusable does
not start."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import sqlfeed_bin

import sqlfeed

pa = pytest.importorskip("pyarrow")

MODULE = "cluster_prep"
FUNCTIONS = textwrap.dedent(
    '''
    """Functions the test's executors host."""

    import os
    import signal

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    import sqlfeed


    @sqlfeed.udf(pa.float64())
    def doubled(x):
        return pc.multiply(pc.cast(x, pa.float64()), 2.0)


    @sqlfeed.udf(pa.float64(), seeded=True, seed=5)
    def jittered(row_id, seed):
        """A draw per row from (row, seed): the same however rows are batched."""
        ids = np.asarray(row_id, dtype=np.uint64)
        mixed = (ids * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64(seed)
        return pa.array((mixed % np.uint64(1000)).astype(np.float64) / 1000.0)


    @sqlfeed.batch_udf(
        {"scaled": pa.float32(), "label": pa.int64()}, inputs=["f", "label"], concurrency=2
    )
    def scaled_batch(batch):
        return {"scaled": (batch["f"] * 3).astype(np.float32), "label": batch["label"]}


    @sqlfeed.udf(pa.int64())
    def unlucky(row_id):
        if 1234 in set(row_id.to_pylist()):
            raise ValueError("row 1234 is unlucky")
        return row_id


    @sqlfeed.udf(pa.int64(), concurrency=2)
    def dies_on_4321(row_id):
        if 4321 in set(row_id.to_pylist()):
            os.kill(os.getpid(), signal.SIGKILL)
        return row_id
    '''
)


def start(
    args: list[str], ready: str, log: Path, env: dict[str, str]
) -> tuple[subprocess.Popen, str]:
    with open(log, "w") as out:
        process = subprocess.Popen(
            [str(sqlfeed_bin()), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        for line in log.read_text().splitlines():
            if ready in line:
                return process, line
        time.sleep(0.1)
    process.kill()
    pytest.fail(f"{args[0]} did not start (exit {process.poll()}):\n{log.read_text()}")


def descendants(pid: int) -> set[int]:
    """The live processes below ``pid`` (Linux: /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, stack = set(), [pid]
    while stack:
        parent = stack.pop()
        children = [child for child, of in parents.items() if of == parent]
        found.update(children)
        stack.extend(children)
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting for whoever adopted it is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server alone, as an operator would send it; its worker
    processes must then end by themselves."""
    workers = descendants(process.pid)
    process.terminate()
    process.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in workers):
        time.sleep(0.1)
    left = [p for p in workers if alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes {left} outlived the server {process.pid}"


@pytest.fixture(scope="module")
def function_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("functions")
    (folder / f"{MODULE}.py").write_text(FUNCTIONS)
    return folder


@pytest.fixture(scope="module")
def prep(function_dir):
    """The module, imported by the name the executors import it by."""
    sys.path.insert(0, str(function_dir))
    try:
        import cluster_prep

        yield cluster_prep
        for value in vars(cluster_prep).values():
            if isinstance(value, sqlfeed.Function):
                value.close()
    finally:
        sys.path.remove(str(function_dir))
        sys.modules.pop(MODULE, None)


def executor_env() -> dict[str, str]:
    """The executors' interpreter imports what this one imports."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


@pytest.fixture(scope="module")
def cluster(function_dir, tmp_path_factory):
    """A scheduler and two executors hosting ``function_dir``: its URL."""
    logs = tmp_path_factory.mktemp("cluster-logs")
    env = executor_env()
    servers = []
    try:
        scheduler, line = start(
            ["scheduler", "--bind", "127.0.0.1:0"], "listening on", logs / "scheduler.log", env
        )
        servers.append(scheduler)
        url = line.split("listening on ")[1].split()[0]
        for i in range(2):
            executor, _ = start(
                [
                    "executor",
                    "--scheduler",
                    url,
                    "--concurrent-tasks",
                    "2",
                    "--heartbeat-interval",
                    "1",
                    "--python",
                    sys.executable,
                    "--function-dir",
                    str(function_dir),
                ],
                "serving",
                logs / f"executor-{i}.log",
                env,
            )
            servers.append(executor)
        hosts = (logs / "executor-0.log").read_text()
        for name in ("doubled", "jittered", "scaled_batch", "unlucky", "dies_on_4321"):
            assert f"{name} ({MODULE}.{name}, content " in hosts, hosts
        # Unset concurrency: as many workers as the executor's task slots.
        assert re.search(r"doubled \([^)]*, 2 worker processes\)", hosts), hosts
        time.sleep(2)  # both executors register (heartbeats every second)
        yield url
    finally:
        for server in reversed(servers):
            stop(server)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("cluster-data")
    subprocess.run(
        [str(sqlfeed_bin()), "gen", "--rows", "6000", "--files", "3", "--out", str(out)],
        check=True,
        capture_output=True,
    )
    return f"{out}/*.parquet"


def sessions(cluster: str, functions: list) -> dict[str, sqlfeed.Session]:
    return {
        "embedded": sqlfeed.Session(functions=functions, target_partitions=2),
        "cluster": sqlfeed.Session(cluster=cluster, functions=functions),
    }


def test_scalar_batch_and_seeded_functions_give_the_embedded_rows(cluster, prep, data):
    query = (
        f"SELECT id, doubled(f0) AS d, jittered(id) AS j, "
        f"scaled_batch(f1, label)['scaled'] AS s FROM '{data}' ORDER BY id"
    )
    functions = [prep.doubled, prep.jittered, prep.scaled_batch]
    tables = {where: s.sql(query).to_arrow() for where, s in sessions(cluster, functions).items()}
    assert tables["cluster"].num_rows == 6000
    assert tables["cluster"].equals(tables["embedded"])


def feed_digests(
    session: sqlfeed.Session, query: str, run_id: str, tables: list | None = None, **options
) -> list[list[str]]:
    """Per rank of 2, the digest of every batch of a shuffled 2-epoch feed;
    each rank's quarantine table appended to ``tables``, if given."""

    def rank(r: int) -> list[str]:
        feed = session.feed(
            query,
            batch_size=200,
            shuffle=11,
            epochs=2,
            shard=(r, 2),
            device="cpu",
            format="numpy",
            run_id=run_id,
            **options,
        )
        digests = []
        for batch in feed:
            h = hashlib.sha256()
            for name in sorted(batch):
                h.update(name.encode() + batch[name].tobytes())
            digests.append(h.hexdigest())
        if tables is not None:
            tables.append(feed.quarantined())
        return digests

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(rank, range(2)))


def test_a_shuffled_feed_with_seeded_and_costly_functions_deals_the_embedded_batches(
    cluster, prep, data
):
    # `scaled_batch` is costly (it runs after the permutation, on the rows
    # each rank gets); `jittered` draws from the feed's seed and epoch.
    query = (
        f"SELECT s['scaled'] AS x, jittered(id) AS j, s['label'] AS label FROM "
        f"(SELECT id, scaled_batch(f0, label) AS s FROM '{data}')"
    )
    functions = [prep.jittered, prep.scaled_batch]
    digests = {
        where: feed_digests(s, query, f"test-57-{where}")
        for where, s in sessions(cluster, functions).items()
    }
    assert [len(d) for d in digests["cluster"]] == [30, 30]  # 6000 rows, 2 epochs, 2 ranks
    assert digests["cluster"] == digests["embedded"]
    # The draws change with the epoch.
    assert digests["cluster"][0][:15] != digests["cluster"][0][15:]


def test_a_quarantining_feed_fills_the_embedded_slots_on_the_cluster(cluster, prep, data):
    # Row 1234 raises in the hosted `unlucky`; 1 in 97 images is no image.
    query = (
        f"SELECT unlucky(id) AS id, image_resize(image_decode(CASE WHEN id % 97 = 5 "
        f"THEN CAST('no image' AS BYTEA) ELSE image_jpeg END), 4, 4) AS px FROM '{data}'"
    )
    tables: dict[str, list] = {"embedded": [], "cluster": []}
    digests = {
        where: feed_digests(
            s, query, f"test-61-{where}", tables[where], on_error="quarantine", max_quarantined=200
        )
        for where, s in sessions(cluster, [prep.unlucky]).items()
    }
    assert [len(d) for d in digests["cluster"]] == [30, 30]  # 6000 rows, 2 epochs, 2 ranks
    assert digests["cluster"] == digests["embedded"]
    table = tables["cluster"][0]
    assert tables["cluster"] == [table, table], "every rank holds the same table"

    def rows(table: list[dict]) -> list[tuple]:
        # The traceback differs (the executors run the function in worker
        # processes); where it failed and what was raised do not.
        return [(*(r[k] for k in r if k != "error"), r["error"].split("\n")[-2:]) for r in table]

    assert rows(table) == rows(tables["embedded"][0])
    functions = [(row["epoch"], row["function"]) for row in table]
    # Per epoch: the 62 ids of 6,000 that are 5 (mod 97), and row 1234.
    for epoch in (0, 1):
        assert functions.count((epoch, "image_decode")) == 62
        assert functions.count((epoch, "unlucky")) == 1
    raised = next(row for row in table if row["function"] == "unlucky")
    assert "row 1234 is unlucky" in raised["error"] and raised["column"] == "id"


def test_a_function_whose_code_differs_is_refused_naming_both_hashes(cluster, prep, data):
    @sqlfeed.udf(pa.float64(), name="doubled")
    def doubled(x):
        return pa.compute.multiply(pa.compute.cast(x, pa.float64()), 3.0)

    session = sqlfeed.Session(cluster=cluster, functions=[doubled])
    with pytest.raises(sqlfeed.ExecutionError) as failed:
        session.sql(f"SELECT doubled(f0) FROM '{data}'").to_arrow()
    text = str(failed.value)
    assert "'doubled' differs between the client and this process" in text, text
    assert f"this executor's is Python function '{MODULE}.doubled'" in text, text
    assert f"content {doubled.identity}" in text, text
    assert f"content {prep.doubled.identity}" in text, text


def test_a_function_the_executors_do_not_host_is_refused_with_what_to_do(cluster, data):
    @sqlfeed.udf(pa.float64())
    def tripled(x):
        return x

    session = sqlfeed.Session(cluster=cluster, functions=[tripled])
    with pytest.raises(sqlfeed.ExecutionError, match="is not hosted by this executor") as failed:
        session.sql(f"SELECT tripled(f0) FROM '{data}'").to_arrow()
    assert "--function-dir" in str(failed.value)


def test_a_raising_function_reaches_the_client_with_its_traceback(cluster, prep, data):
    session = sqlfeed.Session(cluster=cluster, functions=[prep.unlucky])
    with pytest.raises(sqlfeed.ExecutionError) as failed:
        session.sql(f"SELECT unlucky(id) FROM '{data}'").to_arrow()
    text = str(failed.value)
    assert "ValueError: row 1234 is unlucky" in text, text
    assert "in unlucky\n" in text and "Traceback" in text, text
    assert "Python function 'unlucky' (cluster_prep.unlucky)" in text, text


def test_a_worker_killed_on_an_executor_is_an_error_naming_how_it_died(cluster, prep, data):
    session = sqlfeed.Session(cluster=cluster, functions=[prep.dies_on_4321])
    with pytest.raises(sqlfeed.ExecutionError, match="SIGKILL") as failed:
        session.sql(f"SELECT dies_on_4321(id) FROM '{data}'").to_arrow()
    assert "dies_on_4321" in str(failed.value)
    # The executors still serve (the next call starts a new worker).
    rows = session.sql(f"SELECT dies_on_4321(id) AS i FROM '{data}' WHERE id < 10").to_arrow()
    assert sorted(rows.column("i").to_pylist()) == list(range(10))


def run_executor(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(sqlfeed_bin()), "executor", "--scheduler", "127.0.0.1:9", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_an_executor_whose_module_does_not_import_does_not_start(tmp_path):
    (tmp_path / "broken_prep.py").write_text("import sqlfeed\nraise RuntimeError('no GPU here')\n")
    done = run_executor(
        ["--python", sys.executable, "--function-dir", str(tmp_path)], executor_env()
    )
    assert done.returncode == 1, done
    assert "module 'broken_prep' of --function-dir" in done.stderr, done.stderr
    assert "RuntimeError: no GPU here" in done.stderr, done.stderr


def test_two_functions_with_one_name_stop_the_executor(tmp_path):
    body = (
        "import pyarrow as pa\nimport sqlfeed\n\n"
        "@sqlfeed.udf(pa.int64(), name='same')\ndef f{n}(x):\n    return x{tail}\n"
    )
    (tmp_path / "one.py").write_text(body.format(n=1, tail=""))
    (tmp_path / "two.py").write_text(body.format(n=2, tail=" if x else x"))
    done = run_executor(
        ["--python", sys.executable, "--function-dir", str(tmp_path)], executor_env()
    )
    assert done.returncode == 1, done
    assert "two functions are named 'same'" in done.stderr, done.stderr


def test_an_interpreter_without_sqlfeed_is_named(tmp_path):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    # An interpreter whose sys.path has neither site-packages nor PYTHONPATH.
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    python.chmod(0o755)
    done = run_executor(["--python", str(python), "--function-dir", str(tmp_path)], env)
    assert done.returncode == 1, done
    assert "cannot import the sqlfeed package" in done.stderr, done.stderr


def test_a_cached_feed_on_the_cluster_gives_the_embedded_batches_from_its_cache(
    cluster, prep, data, tmp_path
):
    # The cache key covers the function's identity, sent with the plan; the
    # second epoch reads the first's entry instead of running the job.
    query = f"SELECT doubled(f0) AS x, jittered(id) AS j, label FROM '{data}'"
    functions = [prep.doubled, prep.jittered]
    digests = {}
    for where, folder in (("embedded", None), ("cluster", cluster)):
        cache = tmp_path / where
        session = sqlfeed.Session(cluster=folder, functions=functions, cache_dir=cache)
        feed = session.feed(
            query,
            batch_size=500,
            shuffle=3,
            epochs=2,
            device="cpu",
            format="numpy",
            cache=True,
            run_id=f"test-57-cache-{where}",
        )
        digests[where] = [
            hashlib.sha256(b"".join(b[n].tobytes() for n in sorted(b))).hexdigest() for b in feed
        ]
        assert any(cache.rglob("*")), f"{where}: nothing was cached in {cache}"
    assert len(digests["cluster"]) == 24
    assert digests["cluster"] == digests["embedded"]


def test_a_feed_by_position_runs_python_functions_on_the_cluster_as_embedded(cluster, prep, data):
    # Issue 55: each row keyed by its file and row on the executors, dealt
    # to 2 ranks; the functions run after the shuffle, on the executors too.
    # A filter calling a Python function has its rows counted by the rank
    # (the scheduler only declares the function).
    for query, functions in (
        (
            f"SELECT doubled(f0) AS x, jittered(id) AS j, label FROM '{data}'",
            [prep.doubled, prep.jittered],
        ),
        (f"SELECT doubled(f0) AS x, label FROM '{data}' WHERE doubled(f0) > 1.0", [prep.doubled]),
    ):
        digests = {
            where: feed_digests(
                session,
                query,
                f"test-55-position-{where}-{len(functions)}",
                shuffle_by_position=True,
            )
            for where, session in sessions(cluster, functions).items()
        }
        assert all(digests["cluster"]), f"no rows kept: {query}"
        assert digests["cluster"] == digests["embedded"], query
    # A plain query's filter calling a Python function: its kept rows are
    # counted by the client, which runs the function, and sent with the job.
    query = (
        f"SELECT id, doubled(f0) AS x FROM '{data}' WHERE doubled(f0) > 1.0 "
        "SHUFFLE BY POSITION SEED 7"
    )
    tables = {
        where: s.sql(query).to_arrow() for where, s in sessions(cluster, [prep.doubled]).items()
    }
    assert 0 < tables["cluster"].num_rows < 6000, tables["cluster"].num_rows
    assert tables["cluster"].equals(tables["embedded"])


def test_an_executor_of_another_version_than_its_binary_does_not_start(capsys, tmp_path):
    from sqlfeed.executor import main

    argv = ["executor", "--python", sys.executable, "--function-dir", str(tmp_path)]
    assert main(argv, expect_version="0.0.0-other") == 1
    err = capsys.readouterr().err
    assert "the sqlfeed binary is 0.0.0-other" in err, err
    assert "install the same version in both" in err, err


def test_a_call_on_constants_gives_the_embedded_value(cluster, prep):
    # Constant folding may evaluate an immutable call while planning; on the
    # scheduler the function is only declared, so it must stay a call there.
    query = "SELECT doubled(CAST(1.25 AS DOUBLE)) AS d"
    values = {
        where: s.sql(query).to_pylist() for where, s in sessions(cluster, [prep.doubled]).items()
    }
    assert values["cluster"] == values["embedded"] == [{"d": 2.5}]
