"""Photo-like JPEG data sets for the image benchmarks (scripts/bench-images.sh).

Real photographs shipped inside scikit-image (astronaut, chelsea, coffee,
rocket, the stereo motorcycle, textures of brick, grass and gravel, ...) are
cut into random square windows of random size, resized to SIZE x SIZE with
Pillow's antialiased bilinear filter and re-encoded as baseline JPEG quality
90: every row is a different crop of a real photograph (edges, noise, skin,
fur, sky), not a flat synthetic shape.

    python photos.py OUT_DIR ROWS SIZE [--files N] [--seed S]

Writes OUT_DIR/part-*.parquet with columns id (int64), label (int32: which
photograph), image_jpeg (binary), and OUT_DIR/_meta.json.
"""

import argparse
import io
import json
import os
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image
import skimage.data

# Colour photographs (gray ones are converted: a camera gives gray too).
PHOTOS = [
    "astronaut",
    "chelsea",
    "coffee",
    "rocket",
    "stereo_motorcycle",
    "brick",
    "grass",
    "gravel",
    "camera",
    "hubble_deep_field",
    "retina",
    "immunohistochemistry",
]


def load_photos():
    photos = []
    for name in PHOTOS:
        try:
            array = getattr(skimage.data, name)()
        except Exception as e:  # a photograph that needs a download
            print(f"skipping {name}: {e}")
            continue
        if isinstance(array, tuple):
            array = array[0]
        image = Image.fromarray(np.asarray(array)).convert("RGB")
        photos.append((name, image))
    if not photos:
        raise SystemExit("no photographs found in scikit-image's data")
    return photos


def crops(photos, rows, size, seed):
    rng = random.Random(seed)
    for i in range(rows):
        label = i % len(photos)
        _, photo = photos[label]
        w, h = photo.size
        side = rng.randint(min(size, w, h), min(w, h))
        x = rng.randint(0, w - side)
        y = rng.randint(0, h - side)
        window = photo.crop((x, y, x + side, y + side))
        if rng.random() < 0.5:
            window = window.transpose(Image.FLIP_LEFT_RIGHT)
        window = window.resize((size, size), Image.BILINEAR)
        out = io.BytesIO()
        window.save(out, format="JPEG", quality=90)
        yield i, label, out.getvalue()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("rows", type=int)
    parser.add_argument("size", type=int)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    photos = load_photos()
    per_file = -(-args.rows // args.files)
    schema = pa.schema(
        [("id", pa.int64()), ("label", pa.int32()), ("image_jpeg", pa.binary())]
    )
    rows = crops(photos, args.rows, args.size, args.seed)
    total_bytes = 0
    for f in range(args.files):
        ids, labels, jpegs = [], [], []
        for _ in range(min(per_file, args.rows - f * per_file)):
            i, label, jpeg = next(rows)
            ids.append(i)
            labels.append(label)
            jpegs.append(jpeg)
            total_bytes += len(jpeg)
        table = pa.Table.from_arrays(
            [pa.array(ids, pa.int64()), pa.array(labels, pa.int32()),
             pa.array(jpegs, pa.binary())],
            schema=schema,
        )
        pq.write_table(
            table, os.path.join(args.out, f"part-{f:04d}.parquet"),
            row_group_size=2048, compression="none",
        )
    meta = {
        "rows": args.rows,
        "size": args.size,
        "photos": [name for name, _ in photos],
        "jpeg_bytes": total_bytes,
        "seed": args.seed,
    }
    with open(os.path.join(args.out, "_meta.json"), "w") as f:
        json.dump(meta, f)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
