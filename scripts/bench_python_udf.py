"""Python batch functions: the same Pillow decode -> resize -> normalise
function run (1) in a plain loop over the Parquet batches, (2) as a sqlfeed
batch function with concurrency 1 and (3) 2, (4) in Ray Data's map_batches
with 2 workers and (5) in a PyTorch DataLoader with 2 workers. Every mode
delivers batches of 256 float32 CHW images to this process; rounds run
A B C D E, A B C D E, ... side by side (scripts/bench-python-udf.sh).

    python scripts/bench_python_udf.py --data DIR [--rounds 2] [--modes loop,c1,c2,ray,loader]
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

SIDE = 64
BATCH = 256
ENGINE_BATCH = 64


def preprocess(batch):
    """JPEG bytes -> float32 CHW in [0, 1], normalised per channel."""
    jpegs = batch["jpeg"]
    out = np.empty((len(jpegs), 3, SIDE, SIDE), np.float32)
    for i, data in enumerate(jpegs):
        image = Image.open(io.BytesIO(data)).convert("RGB").resize((SIDE, SIDE), Image.BILINEAR)
        out[i] = (np.asarray(image, np.float32) / 255.0 - 0.5).transpose(2, 0, 1) / 0.25
    return {"pixels": out.reshape(len(jpegs), -1), "label": np.asarray(batch["label"])}


def files(data: str) -> list[str]:
    return sorted(glob.glob(os.path.join(data, "*.parquet")))


def run_loop(data: str) -> tuple[int, float]:
    started = time.perf_counter()
    rows = 0
    for path in files(data):
        for record_batch in pq.ParquetFile(path).iter_batches(
            batch_size=ENGINE_BATCH, columns=["image_jpeg", "label"]
        ):
            batch = {
                "jpeg": record_batch.column(0).to_numpy(zero_copy_only=False),
                "label": record_batch.column(1).to_numpy(),
            }
            rows += len(preprocess(batch)["label"])
    return rows, time.perf_counter() - started


def run_sqlfeed(data: str, concurrency: int) -> tuple[int, float]:
    import sqlfeed

    started = time.perf_counter()
    function = sqlfeed.batch_udf(
        {"pixels": pa.list_(pa.float32(), 3 * SIDE * SIDE), "label": pa.int64()},
        inputs=["jpeg", "label"],
        concurrency=concurrency,
    )(preprocess)
    session = sqlfeed.Session(functions=[function], batch_size=ENGINE_BATCH)
    feed = session.feed(
        "SELECT p['pixels'] AS x, p['label'] AS y FROM "
        f"(SELECT preprocess(image_jpeg, label) AS p FROM '{data}/*.parquet')",
        batch_size=BATCH,
        device="cpu",
        format="numpy",
        columns={"x": {"shape": (3, SIDE, SIDE)}},
    )
    rows = 0
    for batch in feed:
        rows += len(batch["y"])
    elapsed = time.perf_counter() - started
    function.close()
    return rows, elapsed


def run_ray(data: str) -> tuple[int, float]:
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        ignore_reinit_error=True,
    )
    started = time.perf_counter()
    dataset = ray.data.read_parquet(files(data), columns=["image_jpeg", "label"])
    dataset = dataset.rename_columns({"image_jpeg": "jpeg"})
    dataset = dataset.map_batches(
        preprocess, batch_format="numpy", batch_size=ENGINE_BATCH, concurrency=2
    )
    rows = 0
    for batch in dataset.iter_batches(batch_size=BATCH, batch_format="numpy"):
        rows += len(batch["label"])
    elapsed = time.perf_counter() - started
    ray.shutdown()
    return rows, elapsed


def run_loader(data: str) -> tuple[int, float]:
    # Imported here, not at the top: sqlfeed's spawned workers import this
    # script, and torch would slow their start.
    import torch.utils.data

    class Batches(torch.utils.data.IterableDataset):
        """The Parquet batches of every file, split among DataLoader workers."""

        def __init__(self, data: str) -> None:
            self.paths = files(data)

        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
            index = 0
            for path in self.paths:
                for record_batch in pq.ParquetFile(path).iter_batches(
                    batch_size=ENGINE_BATCH, columns=["image_jpeg", "label"]
                ):
                    if index % workers == worker:
                        yield preprocess(
                            {
                                "jpeg": record_batch.column(0).to_numpy(zero_copy_only=False),
                                "label": record_batch.column(1).to_numpy(),
                            }
                        )
                    index += 1

    started = time.perf_counter()
    loader = torch.utils.data.DataLoader(Batches(data), batch_size=None, num_workers=2)
    rows = 0
    pending = 0
    for batch in loader:
        pending += len(batch["label"])
        while pending >= BATCH:  # what a trainer receives: batches of 256
            pending -= BATCH
            rows += BATCH
    return rows + pending, time.perf_counter() - started


MODES = {
    "loop": run_loop,
    "c1": lambda data: run_sqlfeed(data, 1),
    "c2": lambda data: run_sqlfeed(data, 2),
    "ray": run_ray,
    "loader": run_loader,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", required=True)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--mode", help="run one mode once (used by the rounds)")
    args = p.parse_args()
    if args.mode:
        rows, elapsed = MODES[args.mode](args.data)
        print(json.dumps({"mode": args.mode, "rows": rows, "seconds": elapsed}))
        return
    import subprocess
    import sys

    results: dict[str, list[float]] = {}
    # One warm-up read of the files (page cache), then the rounds.
    for path in files(args.data):
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
    for round_ in range(args.rounds):
        for mode in args.modes.split(","):
            out = subprocess.run(
                [sys.executable, __file__, "--data", args.data, "--mode", mode],
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode != 0:
                print(f"{mode}: failed\n{out.stderr[-2000:]}")
                continue
            line = json.loads(out.stdout.strip().splitlines()[-1])
            rate = line["rows"] / line["seconds"]
            results.setdefault(mode, []).append(rate)
            print(
                f"round {round_} {mode:7} {line['rows']} rows {line['seconds']:.2f}s {rate:,.0f} rows/s"
            )
    median = {m: float(np.median(r)) for m, r in results.items()}
    print(json.dumps({"rows_per_s_median": median}))
    if "c1" in median and "c2" in median:
        print(f"concurrency 2 / 1: {median['c2'] / median['c1']:.2f}x")
    if "c1" in median and "loop" in median:
        print(
            f"hand-off overhead (c1 vs plain loop): {100 * (1 - median['c1'] / median['loop']):+.1f}%"
        )
    peers = [median[m] for m in ("ray", "loader") if m in median]
    if "c2" in median and peers:
        print(f"concurrency 2 / best of Ray Data and DataLoader: {median['c2'] / max(peers):.2f}x")


if __name__ == "__main__":
    main()
