"""Scenario 1: read lazily and inspect a dataset before training, the way a
Ray Data user calls ``ds.schema()``, ``ds.take(3)`` and ``ds.summary()``.

    python examples/python/01_read_inspect.py [--data 's3://bucket/train/*.parquet']
"""

from _data import dataset, parser

import sqlfeed

args = parser(__doc__).parse_args()
files = dataset(args)
session = sqlfeed.Session()

# Schema and row count come from Parquet footers: no data page is read.
print(session.sql(f"DESCRIBE '{files}'").to_arrow())
print(session.sql(f"SELECT count(*) AS rows FROM '{files}'").to_pylist())
# Three rows, only the columns asked for.
for row in session.sql(f"SELECT id, label, caption FROM '{files}' LIMIT 3").to_pylist():
    print(row)
# Per-column statistics (binary and list columns: of their lengths).
summary = session.sql(f"SUMMARIZE (SELECT label, f0, weight, image_png, tokens FROM '{files}')")
for row in summary.to_pylist():
    print({k: row[k] for k in ("column_name", "count", "null_count", "min", "max", "mean")})
