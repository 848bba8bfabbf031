"""The team's Python functions on a cluster: a scheduler and two executors
that host ``functions/`` (``preprocess_image`` of scenario 2, ``tokenize_batch``
of scenario 6), and the same shuffled feeds, dealt to 2 ranks, embedded and on
the cluster: the batches are identical, byte for byte.

    python examples/python/08_cluster_functions.py [--data GLOB]

On real machines, start one executor per machine with the interpreter of an
environment that has sqlfeed and the functions' dependencies:

    sqlfeed scheduler --bind 0.0.0.0:50050 --allow-remote
    sqlfeed executor --scheduler HOST:50050 --allow-remote --bind 0.0.0.0:0 \\
        --python /venv/bin/python --function-dir /opt/team/functions
"""

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _data import dataset, parser, sqlfeed_bin

import sqlfeed

FUNCTIONS = Path(__file__).resolve().parent / "functions"
# Imported by the name the executors import it by.
sys.path.insert(0, str(FUNCTIONS))
import team_prep  # noqa: E402

WORLD = 2


def start(args: list[str], ready: str, log: Path) -> tuple[subprocess.Popen, str]:
    """Starts a server in its own process group, its output in ``log``;
    returns it and its line that contains ``ready``."""
    # The executors' interpreter imports what this one imports.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sqlfeed_bin(), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        for line in log.read_text().splitlines():
            if ready in line:
                return process, line
        time.sleep(0.1)
    process.kill()
    raise SystemExit(f"{args[0]} did not start:\n{log.read_text()}")


def digest(feed: sqlfeed.Feed) -> tuple[str, int]:
    """The feed's batches, hashed in order, and its row count."""
    h, rows = hashlib.sha256(), 0
    for batch in feed:
        for name in sorted(batch):
            h.update(name.encode())
            h.update(batch[name].tobytes())
        rows += len(batch["label"])
    return h.hexdigest()[:16], rows


def ranks(session: sqlfeed.Session, query: str, run_id: str, **options) -> list[tuple[str, int]]:
    """Every rank's digest; the ranks read at once, as a training job's do."""

    def rank(r: int) -> tuple[str, int]:
        feed = session.feed(
            query,
            shard=(r, WORLD),
            shuffle=7,
            epochs=1,
            device="cpu",
            format="numpy",
            run_id=run_id,
            **options,
        )
        return digest(feed)

    with ThreadPoolExecutor(WORLD) as pool:
        return list(pool.map(rank, range(WORLD)))


if __name__ == "__main__":
    args = parser(__doc__).parse_args()
    files = dataset(args)
    side = team_prep.SIDE
    feeds = {
        "images (preprocess_image)": (
            "SELECT p['pixels'] AS image, p['label'] AS label FROM "
            f"(SELECT preprocess_image(image_jpeg, label) AS p FROM '{files}')",
            {"batch_size": 256, "columns": {"image": {"shape": (3, side, side)}}},
        ),
        "text (tokenize_batch)": (
            f"SELECT tokenize_batch(caption)['ids'] AS ids, label FROM '{files}'",
            {"batch_size": 128},
        ),
    }
    functions = [team_prep.preprocess_image, team_prep.tokenize_batch]
    servers = []
    logs = Path(tempfile.mkdtemp(prefix="sqlfeed-example-08-"))
    try:
        scheduler, line = start(
            ["scheduler", "--bind", "127.0.0.1:0"], "listening on", logs / "scheduler.log"
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
                    "--python",
                    sys.executable,
                    "--function-dir",
                    str(FUNCTIONS),
                ],
                "serving",
                logs / f"executor-{i}.log",
            )
            servers.append(executor)
        time.sleep(1)  # both register (heartbeats)
        embedded = sqlfeed.Session(functions=functions, target_partitions=2)
        cluster = sqlfeed.Session(cluster=url, functions=functions)
        for name, (query, options) in feeds.items():
            timings = {}
            results = {}
            for where, session in (("embedded", embedded), ("cluster", cluster)):
                started = time.perf_counter()
                results[where] = ranks(session, query, f"example-08-{name}", **options)
                timings[where] = time.perf_counter() - started
            rows = sum(n for _, n in results["cluster"])
            print(
                f"{name}: {rows} rows to {WORLD} ranks, embedded {timings['embedded']:.2f}s, "
                f"cluster {timings['cluster']:.2f}s; rank digests "
                f"{[d for d, _ in results['cluster']]}"
            )
            assert results["embedded"] == results["cluster"], (name, results)
        print("the cluster's batches are the embedded engine's, byte for byte")
        for function in functions:
            function.close()  # this process's worker processes
        shutil.rmtree(logs)
    finally:
        # SIGTERM ends a server at once; an executor's worker processes
        # follow it (they watch their parent).
        for server in reversed(servers):
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=10)
