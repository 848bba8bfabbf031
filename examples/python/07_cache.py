"""Scenario 7: the epoch cache -- decode and preprocess once, then train
several epochs (each freshly shuffled) from the preprocessed rows.

    python examples/python/07_cache.py [--data GLOB] [--epochs 3]
"""

import tempfile
import time

from _data import dataset, parser

import sqlfeed

p = parser(__doc__)
p.add_argument("--epochs", type=int, default=3)
args = p.parse_args()
files = dataset(args)
session = sqlfeed.Session(cache_dir=tempfile.mkdtemp(prefix="sqlfeed-cache-"))
feed = session.feed(
    f"SELECT image_to_tensor(image_resize(image_decode(image_jpeg), 32, 32)) AS image, label "
    f"FROM '{files}'",
    batch_size=256,
    shuffle=7,
    cache=True,
    device="cpu",
)
for epoch in range(args.epochs):
    started = time.perf_counter()
    rows = sum(batch["image"].shape[0] for batch in feed)
    print(f"epoch {epoch}: {rows} rows in {time.perf_counter() - started:.2f} s")
