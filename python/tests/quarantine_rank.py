"""One rank of the torchrun quarantine test (test_quarantine.py runs it): a
small model trains on a shuffled image feed whose damaged rows are
quarantined, and the rank writes what it was fed.

    quarantine_rank.py DATA OUT whole    2 epochs; rank 0 also saves the state
                                         after step 9 of epoch 1
    quarantine_rank.py DATA OUT resume   the rest of epoch 1 from that state
"""

import json
import sys

import pyarrow as pa
import torch
import torch.distributed as dist

import sqlfeed

data, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]


@sqlfeed.udf(pa.int64())
def checked(ids):
    """The ids, raising on the ids the test marked (id % 300 == 71)."""
    bad = [i for i in ids.to_pylist() if i % 300 == 71]
    if bad:
        raise ValueError(f"id {bad[0]} is marked as unreadable")
    return ids


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
session = sqlfeed.Session(memory_limit="512M", target_partitions=2, functions=[checked])
feed = session.feed(
    f"SELECT image_resize(image_decode(img), 8, 8) AS x, checked(id) AS id FROM '{data}/*.parquet'",
    batch_size=25,
    shuffle=11,
    shard="auto",
    device="cpu",
    drop_last=True,
    on_error="quarantine",
    max_quarantined="5%",
)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8 * 8 * 3, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)


def train(batch):
    """One step: every rank's backward all-reduces, so a rank short of steps
    would hang the others here."""
    x = batch["x"].reshape(batch["x"].shape[0], -1).float() / 255.0
    loss = (model(x).squeeze(1) - x.mean(1)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


fed = []
if mode == "whole":
    for epoch in range(2):
        feed.set_epoch(epoch)
        for step, batch in enumerate(feed):
            train(batch)
            fed.append([epoch, step, batch["id"].tolist()])
            if (epoch, step) == (1, 9) and rank == 0:
                with open(f"{out}/state.json", "w") as file:
                    json.dump(feed.state_dict(), file)
else:
    with open(f"{out}/state.json") as file:
        feed.load_state_dict(json.load(file))
    for step, batch in enumerate(feed):
        train(batch)
        fed.append([1, step, batch["id"].tolist()])
steps = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
dist.all_gather(steps, torch.tensor([len(fed)]))
with open(f"{out}/{mode}-rank{rank}.json", "w") as file:
    json.dump(
        {"fed": fed, "steps": [int(s) for s in steps], "quarantined": feed.quarantined()},
        file,
    )
dist.destroy_process_group()
