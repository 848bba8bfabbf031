"""Image feed peers for scripts/bench-images.sh: decode JPEG photographs,
resize to SIZE x SIZE, normalise to float32 [256, 3, SIZE, SIZE] plus int64
labels, as each tool's users would write it.

    python images.py one --peer P --data DIR --size S [--shuffle] [--cap SECONDS]
    python images.py run --peer P --data DIR --size S [--shuffle] --out FILE [-- CMD ...]

`one` runs a peer in this process and prints `RESULT {json}` (rows, wall_s,
ttfb_s = seconds to the first batch). `run` runs `one` (or, for the peer
name sqlfeed, CMD) under ../shared/bench/peers.py's monitor (peak PSS of the
process tree) and appends the result to FILE.

Peers:
  dali        NVIDIA DALI's CPU pipeline (device_id=None, 2 threads):
              external_source of the JPEG bytes -> decoders.image -> resize ->
              crop_mirror_normalize (DALI's recommended recipe).
  dataloader  torch DataLoader, 2 workers, Pillow decode + bilinear resize +
              ToTensor/Normalize done by hand (torchvision's recipe).
  pillow      the same transforms in the training process, no workers.
  ray         Ray Data read_parquet -> map_batches(Pillow decode/resize) ->
              iter_torch_batches (random_shuffle of the bytes when shuffled).
"""

import argparse
import io
import json
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq

BATCH = 256
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
SEED = 42


def load(data):
    files = sorted(
        os.path.join(data, f) for f in os.listdir(data) if f.endswith(".parquet")
    )
    table = pq.read_table(files, columns=["image_jpeg", "label"])
    return table.column("image_jpeg").combine_chunks(), table.column("label").to_numpy()


def pil_transform(blob, size):
    from PIL import Image

    image = Image.open(io.BytesIO(blob)).convert("RGB")
    image = image.resize((size, size), Image.BILINEAR)
    x = np.asarray(image, dtype=np.float32) / 255.0
    x = (x - MEAN) / STD
    return x.transpose(2, 0, 1)


def order(n, shuffle, epoch=0):
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng(SEED + epoch).permutation(n)


def drain(batches, start, cap):
    """Consumes `batches` (each an image tensor) until they end or `cap`
    seconds have passed since `start`: (rows, wall_s, ttfb_s)."""
    ttfb, rows = None, 0
    for x in batches:
        rows += x.shape[0]
        ttfb = ttfb or time.perf_counter() - start
        if time.perf_counter() - start > cap:
            break
    return rows, time.perf_counter() - start, ttfb


def run_pillow(data, size, shuffle, cap):
    import torch

    start = time.perf_counter()
    blobs, labels = load(data)
    idx = order(len(blobs), shuffle)

    def batches():
        for b in range(len(idx) // BATCH):
            chunk = idx[b * BATCH:(b + 1) * BATCH]
            x = torch.from_numpy(np.stack([pil_transform(blobs[int(i)].as_py(), size) for i in chunk]))
            torch.from_numpy(labels[chunk].astype(np.int64))  # y, as a loader makes it
            yield x

    return drain(batches(), start, cap)


class PhotoDataset:
    def __init__(self, data, size):
        self.blobs, self.labels = load(data)
        self.size = size

    def __len__(self):
        return len(self.blobs)

    def __getitem__(self, i):
        import torch

        x = torch.from_numpy(pil_transform(self.blobs[i].as_py(), self.size))
        return x, int(self.labels[i])


def run_dataloader(data, size, shuffle, cap):
    import torch

    start = time.perf_counter()
    dataset = PhotoDataset(data, size)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=BATCH, shuffle=shuffle, num_workers=2, drop_last=True,
        generator=torch.Generator().manual_seed(SEED), persistent_workers=False,
    )
    return drain((x for x, y in loader), start, cap)


def run_dali(data, size, shuffle, cap):
    import torch
    from nvidia.dali import fn, pipeline_def, types

    start = time.perf_counter()
    blobs, labels = load(data)
    idx = order(len(blobs), shuffle)
    steps = len(idx) // BATCH
    # Zero-copy views of the Arrow buffers: int32 offsets, then the bytes.
    offsets = np.frombuffer(blobs.buffers()[1], dtype=np.int32)
    values = np.frombuffer(blobs.buffers()[2], dtype=np.uint8)
    base = blobs.offset

    def source(info):
        if info.iteration >= steps:
            raise StopIteration
        chunk = idx[info.iteration * BATCH:(info.iteration + 1) * BATCH]
        images = [values[offsets[base + i]:offsets[base + i + 1]] for i in chunk]
        return images, [np.array([labels[i]], dtype=np.int64) for i in chunk]

    @pipeline_def(batch_size=BATCH, num_threads=2, device_id=None, prefetch_queue_depth=2)
    def pipe():
        jpegs, y = fn.external_source(source=source, num_outputs=2, batch=True,
                                      batch_info=True, dtype=[types.UINT8, types.INT64])
        images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=size, resize_y=size)
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="CHW",
            mean=(MEAN * 255).tolist(), std=(STD * 255).tolist())
        return images, y

    p = pipe()
    p.build()

    def batches():
        for _ in range(steps):
            try:
                x, _y = p.run()
            except StopIteration:
                return
            yield torch.from_numpy(np.array(x.as_tensor()))

    return drain(batches(), start, cap)


def run_ray(data, size, shuffle, cap):
    import ray

    # ray.init (seconds of daemons starting) is excluded, as in BASELINES.md.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    start = time.perf_counter()
    ds = ray.data.read_parquet(data, columns=["image_jpeg", "label"])
    if shuffle:
        ds = ds.random_shuffle(seed=SEED)

    def transform(batch):
        x = np.stack([pil_transform(b, size) for b in batch["image_jpeg"]])
        return {"x": x, "y": batch["label"].astype(np.int64)}

    ds = ds.map_batches(transform, batch_size=BATCH, batch_format="numpy")
    batches = ds.iter_torch_batches(batch_size=BATCH, drop_last=True)
    return drain((batch["x"] for batch in batches), start, cap)


PEERS = {"pillow": run_pillow, "dataloader": run_dataloader, "dali": run_dali, "ray": run_ray}


def one(a):
    rows, wall, ttfb = PEERS[a.peer](a.data, a.size, a.shuffle, a.cap)
    print("RESULT " + json.dumps({"rows": rows, "wall_s": round(wall, 3),
                                  "ttfb_s": round(ttfb or float("nan"), 3)}), flush=True)


def run(a, cmd):
    here = os.path.dirname(os.path.abspath(__file__))
    bench = os.environ.get("BENCH") or os.path.join(here, "..", "..", "..", "shared", "bench")
    sys.path.insert(0, bench)
    from peers import monitored  # the shared harness's process-tree monitor

    subprocess.run(f"cat {a.data}/*.parquet > /dev/null", shell=True, check=False)
    if not cmd:
        cmd = [sys.executable, os.path.abspath(__file__), "one", "--peer", a.peer,
               "--data", a.data, "--size", str(a.size), "--cap", str(a.cap)]
        if a.shuffle:
            cmd.append("--shuffle")
    res, peak, nprocs, text, rc = monitored(cmd, timeout=a.cap + 300)
    if res is None:
        res = {"error": f"rc={rc}", "tail": text[-1500:]}
    else:
        res["rows_per_s"] = round(res["rows"] / res["wall_s"], 1)
        res["peak_pss_MB"] = round(peak / 2**20, 1)
        res["max_procs"] = nprocs
    res.update({"peer": a.name or a.peer, "size": a.size, "shuffle": a.shuffle,
                "data": os.path.basename(a.data.rstrip("/"))})
    line = json.dumps(res)
    print(line, flush=True)
    with open(a.out, "a") as f:
        f.write(line + "\n")


def main():
    argv = sys.argv[1:]
    cmd = []
    if "--" in argv:
        i = argv.index("--")
        argv, cmd = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["one", "run"])
    ap.add_argument("--peer", required=True)
    ap.add_argument("--name")
    ap.add_argument("--data", required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--shuffle", action="store_true")
    ap.add_argument("--cap", type=float, default=120)
    ap.add_argument("--out", default="images.jsonl")
    a = ap.parse_args(argv)
    if a.mode == "one":
        one(a)
    else:
        run(a, cmd)


if __name__ == "__main__":
    main()
