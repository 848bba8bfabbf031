"""One rank of the 2-process torchrun test (test_torch.py runs it): reads
its shard of a shuffled feed and writes the ids it got."""

import json
import sys

import torch
import torch.distributed as dist

import sqlfeed

data, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
session = sqlfeed.Session(memory_limit="512M", target_partitions=1)
feed = session.feed(
    f"SELECT id FROM '{data}/*.parquet'", batch_size=64, shuffle=3, shard="auto", device="cpu"
)
batches = [batch["id"].tolist() for batch in feed]
# Every rank must take the same number of steps, or DDP's collectives hang.
counts = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
dist.all_gather(counts, torch.tensor([len(batches)]))
with open(f"{out}/rank{dist.get_rank()}.json", "w") as file:
    json.dump(
        {
            "shard": [feed.rank, feed.world],
            "len": len(feed),
            "counts": [int(c) for c in counts],
            "batches": batches,
        },
        file,
    )
dist.destroy_process_group()
