"""Scenario 3: prefetched tensors into a training loop (``iter_torch_batches``
with prefetching); reports how much of the time the loop waited for data.

    python examples/python/03_prefetch_training.py [--data GLOB] [--device cuda:0]
"""

import torch
from _data import dataset, parser

import sqlfeed

p = parser(__doc__)
p.add_argument("--device", default="auto")
args = p.parse_args()
files = dataset(args)
session = sqlfeed.Session()
feed = session.feed(
    f"""SELECT feature_vector(f0, f1, f2, f3) AS x,
               image_to_tensor(image_decode(image_png)) AS image, label AS y
        FROM '{files}'""",
    batch_size=256,
    drop_last=True,
    prefetch=8,
    shuffle=0,
    device=args.device,
)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(2):
    feed.set_epoch(epoch)
    for batch in feed:
        image = batch["image"]
        logits = model(image.to(torch.float32))
        loss = torch.nn.functional.cross_entropy(logits, batch["y"] % 10)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
stats = feed.stats()
print(
    f"{stats['rows_per_s']:.0f} rows/s, the loop waited {100 * stats['wait_share']:.1f}% "
    f"of the time, first batch after {stats['first_batch_s'][0]:.3f} s on {stats['device']}"
)
