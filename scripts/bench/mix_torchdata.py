#!/usr/bin/env python3
"""The W2 tensor feed of a 3-source mixture (0.6 / 0.25 / 0.15 of DATA's
rows) through torchdata's MultiNodeWeightedSampler, as a torchdata user
writes it: one node per source (rows of its files, repeating), the weighted
sampler, a Batcher of 256 and a collate into float32 tensors. Prints a
RESULT line like `sqlfeed feed --result-json`.

    python scripts/bench/mix_torchdata.py DATA
"""

import glob
import json
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import torch
from torchdata.nodes import Batcher, IterableWrapper, Loader, MultiNodeWeightedSampler

data = sys.argv[1]
meta = json.load(open(f"{data}/_meta.json"))
mean = np.asarray(meta["feature_mean"], np.float32)
std = np.asarray(meta["feature_std"], np.float32)
features = [f"f{j}" for j in range(len(mean))]
sources = {
    "web": sorted(glob.glob(f"{data}/part-000[0-9].parquet")),
    "code": sorted(glob.glob(f"{data}/part-001[0-3].parquet")),
    "math": sorted(glob.glob(f"{data}/part-001[45].parquet")),
}
weights = {"web": 0.6, "code": 0.25, "math": 0.15}
total = sum(pq.ParquetFile(f).metadata.num_rows for fs in sources.values() for f in fs)


def rows(files):
    """Rows of `files`, standardised, over and over (a source repeats)."""
    while True:
        for path in files:
            for batch in pq.ParquetFile(path).iter_batches(
                batch_size=8192, columns=[*features, "label", "image"]
            ):
                x = np.stack([batch.column(f).to_numpy() for f in features], axis=1)
                x = ((x - mean) / std).astype(np.float32)
                y = batch.column("label").to_numpy()
                img = batch.column("image").to_pylist()
                for i in range(batch.num_rows):
                    yield x[i], y[i], img[i]


def collate(items):
    x = torch.from_numpy(np.stack([i[0] for i in items]))
    y = torch.from_numpy(np.asarray([i[1] for i in items]))
    img = np.frombuffer(b"".join(i[2] for i in items), np.uint8)
    img = torch.from_numpy(img.reshape(len(items), 3, 32, 32).astype(np.float32) / 255)
    return x, y, img


nodes = {name: IterableWrapper(rows(files)) for name, files in sources.items()}
sampler = MultiNodeWeightedSampler(nodes, weights, seed=1)
loader = Loader(Batcher(sampler, batch_size=256, drop_last=True))
start = time.perf_counter()
fed = 0
for items in loader:
    x, y, img = collate(items)
    fed += len(items)
    if fed + 256 > total:
        break
wall = time.perf_counter() - start
print("RESULT " + json.dumps({"rows": fed, "wall_s": wall}))
