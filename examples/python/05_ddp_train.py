"""Scenario 5: distributed data-parallel training with torchrun -- one shard per
rank, equal batch counts (no hand-written padding), and a mid-epoch resume
from a checkpoint that holds the feed's ``state_dict()``, also on another
number of ranks (elastic: preempted on 2 GPUs, back on 3).

    torchrun --standalone --nproc_per_node 2 examples/python/05_ddp_train.py --steps 300
    # preempted? the same command with --resume picks up at the next batch:
    torchrun --standalone --nproc_per_node 2 examples/python/05_ddp_train.py --steps 300 \\
        --stop-after 120 --checkpoint /tmp/ckpt      # stops after step 120
    torchrun --standalone --nproc_per_node 2 examples/python/05_ddp_train.py --steps 300 \\
        --checkpoint /tmp/ckpt --resume             # continues at step 121
    # or on 3 ranks: the epoch goes on from the same row of the same order
    torchrun --standalone --nproc_per_node 3 examples/python/05_ddp_train.py --steps 300 \\
        --checkpoint /tmp/ckpt --resume

Trains a small CNN on the images (resized to 8x8) and labels of `sqlfeed gen` (gloo on the
CPU, NCCL on GPUs). One checkpoint serves every rank: the model and optimizer are the same
on all ranks (DDP), and so is the feed's state. ``--step-log FILE`` writes each step's batch
digest, loss and sample ids.
"""

import hashlib
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from _data import dataset, parser

import sqlfeed

p = parser(__doc__)
p.add_argument("--steps", type=int, default=300, help="global training steps")
p.add_argument("--stop-after", type=int, help="checkpoint and exit after this step")
p.add_argument("--checkpoint", default="ddp-checkpoint", help="checkpoint folder")
p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
p.add_argument("--step-log", help="write per-step batch digests and losses here (per rank)")
args = p.parse_args()

use_cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if use_cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else "cpu"
files = dataset(args) if rank == 0 else None
files = [files]
dist.broadcast_object_list(files, src=0)  # rank 0 generated the data

session = sqlfeed.Session(target_partitions=max(1, (os.cpu_count() or 2) // world))
feed = session.feed(
    "SELECT image_to_tensor(image_resize(image_decode(image_png), 8, 8)) AS image, "
    f"label % 10 AS y, id FROM '{files[0]}'",
    batch_size=32,
    shuffle=1234,
    drop_last=True,
    shard="auto",
    device=str(device) if use_cuda else "cpu",
)

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3, padding=1),
    torch.nn.ReLU(),
    torch.nn.Flatten(),
    torch.nn.Linear(16 * 8 * 8, 10),
).to(device)
model = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
step = 0
checkpoint = Path(args.checkpoint)
if args.resume:
    state = torch.load(checkpoint / "state.pt", weights_only=False)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    feed.load_state_dict(json.loads(state["feed"]))  # a few numbers, nothing else
    step = state["step"]

log = open(f"{args.step_log}.rank{rank}", "a") if args.step_log else None
if rank == 0:
    print(f"{world} ranks, {len(feed)} batches per rank per epoch, starting at step {step}")
while step < args.steps:
    for batch in feed:
        loss = torch.nn.functional.cross_entropy(model(batch["image"]), batch["y"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if log:
            digest = hashlib.sha256(batch["image"].cpu().numpy().tobytes()).hexdigest()[:16]
            ids = ",".join(str(i) for i in batch["id"].tolist())
            log.write(f"{step} {feed.epoch} {digest} {loss.item():.6f} {ids}\n")
        if step % 100 == 0 and rank == 0:
            print(f"step {step} (epoch {feed.epoch}): loss {loss.item():.3f}")
        if step == args.stop_after or step == args.steps:
            break
    if step == args.stop_after:
        # Rank 0's state is every rank's, whatever the next run's world size.
        if rank == 0:
            checkpoint.mkdir(parents=True, exist_ok=True)
            torch.save(
                {
                    "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "feed": json.dumps(feed.state_dict()),
                    "step": step,
                },
                checkpoint / "state.pt",
            )
            print(f"checkpointed after step {step} at {feed.state_dict()}")
        dist.barrier()
        break
if log:
    log.close()
dist.destroy_process_group()
