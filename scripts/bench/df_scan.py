"""A plain DataFusion (Python bindings) scan of the W2 columns, touched like
peers.py touches batches; prints the RESULT line peers.py `external` reads.
The yardstick for "the feed keeps up with a plain scan of the same columns"."""
import sys
import time

import datafusion
import numpy as np

data = sys.argv[1]
cols = ["label"] + [f"f{j}" for j in range(32)] + ["image"]
t0 = time.perf_counter()
ctx = datafusion.SessionContext(datafusion.SessionConfig().with_target_partitions(2))
df = ctx.read_parquet(f"{data}/").select(*cols)
rows, first = 0, None
for batch in df.execute_stream():
    rb = batch.to_pyarrow()
    for column in rb.columns:
        for buf in column.buffers():
            if buf is not None and buf.size:
                np.frombuffer(buf, dtype=np.uint8)[::64].sum()
    rows += rb.num_rows
    if first is None:
        first = time.perf_counter() - t0
wall = time.perf_counter() - t0
print(f'RESULT {{"rows": {rows}, "wall_s": {wall:.3f}, "ttfb_s": {first or wall:.3f}}}', flush=True)
