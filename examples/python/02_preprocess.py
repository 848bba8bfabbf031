"""Scenario 2: multi-stage preprocessing -- statistics fitted in SQL, then
normalisation, image decode -> resize -> tensor, all in one query -- instead of
chained ``map_batches`` calls.

    python examples/python/02_preprocess.py [--data GLOB]
"""

from _data import dataset, parser

import sqlfeed

args = parser(__doc__).parse_args()
files = dataset(args)
session = sqlfeed.Session(target_partitions=2)  # parallelism under control

stats = session.sql(
    f"SELECT avg(f0) AS mean, stddev(f0) AS std FROM '{files}' WHERE weight IS NOT NULL"
).to_pylist()[0]
feed = session.feed(
    f"""SELECT standardize(f0, {stats["mean"]}, {stats["std"]}) AS f0,
               image_to_tensor(image_resize(image_decode(image_jpeg), 24, 24)) AS image,
               label
        FROM '{files}' WHERE weight IS NOT NULL""",
    batch_size=512,
    device="cpu",
)
count, total, total_sq = 0, 0.0, 0.0
for batch in feed:
    f0 = batch["f0"].double()
    count += f0.numel()
    total += float(f0.sum())
    total_sq += float((f0 * f0).sum())
mean = total / count
std = (total_sq / count - mean**2) ** 0.5
print(f"{count} rows; standardised f0: mean {mean:+.4f}, std {std:.4f}")
print(f"image batch: {tuple(batch['image'].shape)} {batch['image'].dtype}")
