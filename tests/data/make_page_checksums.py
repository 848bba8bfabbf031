"""Writes tests/data/page_checksums.parquet: a file with a CRC-32 in every
page header (parquet-rs cannot write them; pyarrow can). Run once with
pyarrow >= 14; the output is committed, so tests need no Python."""

import pathlib

import pyarrow as pa
import pyarrow.parquet as pq

rows = 4000
table = pa.table(
    {
        "id": pa.array(range(rows), pa.int64()),
        "word": pa.array([f"word-{i % 37:03d}" for i in range(rows)]),
    }
)
pq.write_table(
    table,
    pathlib.Path(__file__).with_name("page_checksums.parquet"),
    compression="none",
    use_dictionary=False,
    write_page_checksum=True,
    data_page_size=4096,
    row_group_size=2000,
)
