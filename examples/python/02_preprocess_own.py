"""Scenario 2 with your own code: the image preprocessing of 02_preprocess.py
written as a Python batch function (Pillow decode -> resize -> float32 CHW in
[0, 1], ``preprocess_image`` in ``functions/team_prep.py``), the
``map_batches`` a Ray Data user already has, called in SQL next to the
built-in version and run in N worker processes.

    python examples/python/02_preprocess_own.py [--data GLOB] [--concurrency N]
"""

import sys
import time
from pathlib import Path

import pyarrow as pa
from _data import dataset, parser

import sqlfeed

# The team's functions live in a folder a cluster's executors can host too
# (08_cluster_functions.py); here they run in this process.
sys.path.insert(0, str(Path(__file__).resolve().parent / "functions"))
import team_prep  # noqa: E402
from team_prep import SIDE  # noqa: E402


if __name__ == "__main__":
    p = parser(__doc__)
    p.add_argument("--concurrency", type=int, default=2)
    args = p.parse_args()
    files = dataset(args)
    ours = sqlfeed.batch_udf(
        {"pixels": pa.list_(pa.float32(), 3 * SIDE * SIDE), "label": pa.int64()},
        inputs=["jpeg", "label"],
        concurrency=args.concurrency,
    )(team_prep.preprocess_image.fn)
    session = sqlfeed.Session(functions=[ours], target_partitions=2)

    python_query = (
        "SELECT p['pixels'] AS image, p['label'] AS label FROM "
        f"(SELECT preprocess_image(image_jpeg, label) AS p FROM '{files}')"
    )
    builtin_query = (
        f"SELECT image_to_tensor(image_resize(image_decode(image_jpeg), {SIDE}, {SIDE})) "
        f"AS image, label FROM '{files}'"
    )
    # The Python function's pixels arrive flat; the feed shapes them.
    image = {"image": {"shape": (3, SIDE, SIDE)}}
    for name, query, columns in (
        ("built-in", builtin_query, None),
        ("Python", python_query, image),
    ):
        feed = session.feed(
            query,
            batch_size=256,
            shuffle=7,
            device="cpu",
            format="numpy",
            columns=columns,
        )
        started = time.perf_counter()
        rows = 0
        for batch in feed:
            rows += len(batch["label"])
        elapsed = time.perf_counter() - started
        shape = tuple(batch["image"].shape)
        print(
            f"{name:9} {rows} rows in {elapsed:.2f}s ({rows / elapsed:,.0f} rows/s), image {shape}"
        )
    ours.close()
