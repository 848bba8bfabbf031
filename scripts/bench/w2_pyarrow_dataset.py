#!/usr/bin/env python3
"""The W2 tensor feed of ../shared/bench through a pyarrow dataset: of a
Delta Lake table (the `deltalake` package's own path,
`DeltaTable(path).to_pyarrow_dataset()`) or of the same Parquet files as a
plain dataset. Batches of exactly 256 rows, x = (f - mean) / std float32,
y int64, img uint8 -> float32 / 255, as torch tensors (peers.py's helpers).
Prints `RESULT {"rows": N, "wall_s": S}`.

    python scripts/bench/w2_pyarrow_dataset.py delta   DATA TABLE
    python scripts/bench/w2_pyarrow_dataset.py parquet DATA
"""

import json
import os
import sys
import time

sys.path.insert(
    0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "bench")
)
import peers  # noqa: E402


def main() -> None:
    kind, data = sys.argv[1], sys.argv[2]
    meta = peers.load_meta(data)
    consts = peers.Consts(meta)
    start = time.perf_counter()
    if kind == "delta":
        import deltalake

        dataset = deltalake.DeltaTable(sys.argv[3]).to_pyarrow_dataset()
    else:
        import pyarrow.dataset as ds

        dataset = ds.dataset(peers.files_of(data), format="parquet")
    rows = 0
    batches = dataset.to_batches(columns=peers.FEED_COLS, batch_size=16384)
    for batch in peers.rebatch(batches):
        tensors = peers.to_torch(peers.to_feed_numpy(batch, consts))
        rows += tensors["img"].shape[0]
    print("RESULT " + json.dumps({"rows": rows, "wall_s": time.perf_counter() - start}))


if __name__ == "__main__":
    main()
