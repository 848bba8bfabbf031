"""Scenario 4: a seeded global shuffle of data larger than the memory limit
(``random_shuffle()``): the same seed and epoch give the same order on any
machine, another epoch another order.

    python examples/python/04_global_shuffle.py [--data GLOB]
"""

from _data import dataset, parser

import sqlfeed

args = parser(__doc__).parse_args()
files = dataset(args)
session = sqlfeed.Session(memory_limit="64M")  # spills instead of failing
query = f"SELECT id, image_png FROM '{files}'"
feed = session.feed(query, batch_size=1000, shuffle=42, format="numpy", device="cpu")
epoch0 = [int(i) for batch in feed for i in batch["id"]]
epoch1 = [int(i) for batch in feed for i in batch["id"]]
assert sorted(epoch0) == sorted(epoch1) == list(range(len(epoch0))), "a permutation"
assert epoch0 != epoch1, "another order per epoch"
feed.set_epoch(0)
assert [int(i) for batch in feed for i in batch["id"]] == epoch0, "reproducible"
print(f"shuffled {len(epoch0)} rows under a 64 MB limit; first ids of epoch 0: {epoch0[:5]}")
# The same shuffle in SQL, for exploration: epoch e of the feed is SHUFFLE SEED 42 EPOCH e.
in_sql = [row["id"] for row in session.sql(f"{query} SHUFFLE SEED 42 EPOCH 0").to_pylist()]
assert in_sql == epoch0
print("SQL's SHUFFLE SEED 42 EPOCH 0 gives the feed's epoch 0")
