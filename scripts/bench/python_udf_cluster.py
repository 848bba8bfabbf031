"""Python functions on a cluster (issue 57): the Pillow decode -> resize ->
normalise batch function of scripts/bench_python_udf.py, concurrency 2, as a
shuffled feed dealt to 2 ranks, embedded and on 1 scheduler + 2 executors
that host it (``--python``, ``--function-dir``). Rounds alternate embedded,
cluster, embedded, cluster; each prints the CPU seconds of every process
(the client and its worker processes; the scheduler, the executors and their
worker processes), the CPU per row, and the digest of each rank's batches,
which must be the same in every run.

    python scripts/bench/python_udf_cluster.py --data DIR [--rounds 2]

(scripts/bench-python-udf-cluster.sh runs it with a release build.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1]
REPO = SCRIPTS.parent
TICKS = os.sysconf("SC_CLK_TCK")
WORLD = 2
MODULE = f'''"""The bench's functions, hosted by the executors and imported by the client."""
import io
import sys

sys.path.insert(0, {str(SCRIPTS)!r})

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from bench_python_udf import SIDE, preprocess  # noqa: E402
from PIL import Image  # noqa: E402

import sqlfeed  # noqa: E402

preprocess_udf = sqlfeed.batch_udf(
    {{"pixels": pa.list_(pa.float32(), 3 * SIDE * SIDE), "label": pa.int64()}},
    inputs=["jpeg", "label"],
    concurrency=2,
    name="preprocess",
)(preprocess)


@sqlfeed.batch_udf(
    {{"pixels": pa.list_(pa.uint8(), 3 * SIDE * SIDE), "label": pa.int64()}},
    inputs=["jpeg", "label"],
    concurrency=2,
)
def preprocess_uint8(batch):
    """preprocess without the normalisation: uint8 CHW, which the feed
    scales on the rank (4x fewer bytes between the processes)."""
    jpegs = batch["jpeg"]
    out = np.empty((len(jpegs), 3, SIDE, SIDE), np.uint8)
    for i, data in enumerate(jpegs):
        image = Image.open(io.BytesIO(data)).convert("RGB").resize((SIDE, SIDE), Image.BILINEAR)
        out[i] = np.asarray(image, np.uint8).transpose(2, 0, 1)
    return {{"pixels": out.reshape(len(jpegs), -1), "label": np.asarray(batch["label"])}}
'''


def tree_cpu(root: int) -> tuple[float, float]:
    """User + system CPU seconds of ``root`` itself and of its live
    descendants (each with the children it has reaped)."""
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        stats[int(entry)] = fields

    def cpu(pid: int) -> float:
        return sum(int(v) for v in stats[pid][11:15]) / TICKS if pid in stats else 0.0

    below, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        children = [child for child, parent in parents.items() if parent == pid]
        below += sum(cpu(child) for child in children)
        stack.extend(children)
    return cpu(root), below


def servers_cpu(servers: list[subprocess.Popen]) -> dict[str, float]:
    """CPU seconds so far: the scheduler, the executors' own processes and
    their worker processes."""
    scheduler, *executors = servers
    own = [tree_cpu(e.pid) for e in executors]
    return {
        "scheduler": sum(tree_cpu(scheduler.pid)),
        "executors": sum(o for o, _ in own),
        "workers": sum(w for _, w in own),
    }


def client(args: argparse.Namespace) -> None:
    """One run: every rank's feed, in threads as a job's ranks read at once."""
    sys.path.insert(0, args.function_dir)
    import pyudf_bench

    import sqlfeed

    from bench_python_udf import BATCH, ENGINE_BATCH, SIDE

    function = (
        pyudf_bench.preprocess_uint8 if args.pixels == "uint8" else pyudf_bench.preprocess_udf
    )
    cluster = None if args.where == "embedded" else args.where
    session = sqlfeed.Session(cluster=cluster, functions=[function], batch_size=ENGINE_BATCH)
    query = (
        "SELECT p['pixels'] AS x, p['label'] AS y FROM "
        f"(SELECT {function.name}(image_jpeg, label) AS p FROM '{args.data}/*.parquet')"
    )
    x = {"shape": (3, SIDE, SIDE)}
    if args.pixels == "uint8":
        # (v / 255 - 0.5) / 0.25, as preprocess normalises, on the rank.
        x.update(dtype="float32", scale=1 / (255 * 0.25), offset=-2.0)
    run_id = uuid.uuid4().hex

    def rank(r: int) -> tuple[int, str]:
        feed = session.feed(
            query,
            batch_size=BATCH,
            shuffle=7,
            epochs=1,
            shard=(r, WORLD),
            device="cpu",
            format="numpy",
            columns={"x": x},
            run_id=run_id,
        )
        h, rows = hashlib.sha256(), 0
        for batch in feed:
            h.update(batch["x"].tobytes())
            h.update(batch["y"].tobytes())
            rows += len(batch["y"])
        return rows, h.hexdigest()[:12]

    started = time.perf_counter()
    with ThreadPoolExecutor(WORLD) as pool:
        ranks = list(pool.map(rank, range(WORLD)))
    seconds = time.perf_counter() - started
    function.close()  # its workers' CPU joins this process's
    print(
        json.dumps(
            {"rows": sum(r for r, _ in ranks), "seconds": seconds, "digests": [d for _, d in ranks]}
        )
    )


def start(binary: str, args: list[str], ready: str, log: Path, env: dict) -> subprocess.Popen:
    with open(log, "w") as out:
        process = subprocess.Popen(
            [binary, *args], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if ready in log.read_text():
            return process
        time.sleep(0.1)
    process.kill()
    raise SystemExit(f"{args[0]} did not start:\n{log.read_text()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", required=True)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--bin", default=str(REPO / "target" / "release" / "sqlfeed"))
    p.add_argument(
        "--pixels",
        choices=["float32", "uint8"],
        default="float32",
        help="float32: the function normalises (bench-python-udf's); uint8: it returns "
        "uint8 pixels and the feed normalises them on the rank",
    )
    p.add_argument("--where", help=argparse.SUPPRESS)
    p.add_argument("--function-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.where:
        client(args)
        return

    folder = Path(tempfile.mkdtemp(prefix="sqlfeed-bench-pyudf-cluster-"))
    (folder / "pyudf_bench.py").write_text(MODULE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    servers = []
    try:
        scheduler = start(
            args.bin,
            ["scheduler", "--bind", "127.0.0.1:0"],
            "listening on",
            folder / "scheduler.log",
            env,
        )
        servers.append(scheduler)
        line = (folder / "scheduler.log").read_text()
        url = line.split("listening on ")[1].split()[0]
        for i in range(2):
            servers.append(
                start(
                    args.bin,
                    [
                        "executor",
                        "--scheduler",
                        url,
                        "--python",
                        sys.executable,
                        "--function-dir",
                        str(folder),
                    ],
                    "serving",
                    folder / f"executor-{i}.log",
                    env,
                )
            )
        time.sleep(3)  # both register
        for path in sorted(Path(args.data).glob("*.parquet")):  # page cache
            path.read_bytes()
        idle_before = servers_cpu(servers)
        time.sleep(5)
        idle = {k: (v - idle_before[k]) / 5 for k, v in servers_cpu(servers).items()}
        print(
            "servers idle, CPU s per s: "
            + ", ".join(f"{k} {v:.3f}" for k, v in idle.items())
        )
        per_row: dict[str, list[float]] = {}
        digests: set[tuple[str, ...]] = set()
        print(f"pixels from the function: {args.pixels}")
        print(
            f"{'round':5} {'mode':9} {'rows':>6} {'wall s':>7} {'client CPU s':>12} "
            f"{'sched/exec/workers CPU s':>24} {'CPU ms/row':>10}  rank digests"
        )
        for round_ in range(args.rounds):
            for mode, where in (("embedded", "embedded"), ("cluster", url)):
                before_servers = servers_cpu(servers)
                before_client = resource.getrusage(resource.RUSAGE_CHILDREN)
                done = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--data",
                        args.data,
                        "--where",
                        where,
                        "--function-dir",
                        str(folder),
                        "--pixels",
                        args.pixels,
                    ],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=False,
                )
                after_client = resource.getrusage(resource.RUSAGE_CHILDREN)
                after_servers = servers_cpu(servers)
                spent = {k: after_servers[k] - before_servers[k] for k in after_servers}
                if done.returncode != 0:
                    raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
                result = json.loads(done.stdout.strip().splitlines()[-1])
                client_cpu = (after_client.ru_utime - before_client.ru_utime) + (
                    after_client.ru_stime - before_client.ru_stime
                )
                on_servers = sum(spent.values()) if mode == "cluster" else 0.0
                ms_per_row = 1000 * (client_cpu + on_servers) / result["rows"]
                per_row.setdefault(mode, []).append(ms_per_row)
                digests.add(tuple(result["digests"]))
                split = (
                    "/".join(f"{spent[k]:.2f}" for k in ("scheduler", "executors", "workers"))
                    if mode == "cluster"
                    else "-"
                )
                print(
                    f"{round_:5} {mode:9} {result['rows']:6} {result['seconds']:7.2f} "
                    f"{client_cpu:12.2f} {split:>24} {ms_per_row:10.3f}  "
                    f"{' '.join(result['digests'])}"
                )
        ratios = [c / e for e, c in zip(per_row["embedded"], per_row["cluster"])]
        print(
            "cluster / embedded CPU per row, by round: "
            + ", ".join(f"{r:.2f}x" for r in ratios)
        )
        print(
            "batches: "
            + ("the same in every run" if len(digests) == 1 else f"DIFFER: {sorted(digests)}")
        )
        if len(digests) != 1:
            raise SystemExit(1)
    finally:
        for server in reversed(servers):
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
