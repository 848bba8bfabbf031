"""sqlfeed: SQL over Parquet into training batches for PyTorch, JAX and NumPy.

Write the input pipeline as SQL over Parquet (local, ``s3://``, ``gs://``,
``az://``, ``https://``) with sqlfeed's functions (image decoding, tokenizers,
normalisation), and iterate globally shuffled, rank-sharded, exact batches of
tensors that arrive without a copy::

    import sqlfeed

    session = sqlfeed.Session(memory_limit="8G")
    feed = session.feed(
        "SELECT image_to_tensor(image_resize(image_decode(jpeg), 64, 64)) AS x, label AS y "
        "FROM 's3://bucket/train/*.parquet'",
        batch_size=256, shuffle=42, shard="auto", device="cuda:0",
    )
    for epoch in range(3):
        feed.set_epoch(epoch)
        for batch in feed:          # {"x": torch.Tensor [256,3,64,64], "y": torch.Tensor [256]}
            ...

``session.sql(query)`` returns a result that pyarrow, Polars and DuckDB read
through the Arrow PyCapsule interface.
"""

from sqlfeed._sqlfeed import (
    Error,
    ExecutionError,
    InternalError,
    PlanError,
    ResourcesExhausted,
    __version__,
    cuda_device_count,
    generate,
    raw_h2d_bytes_per_s,
)
from sqlfeed.feed import EpochDataset, Feed
from sqlfeed.functions import Function, FunctionFailed, batch_udf, udf
from sqlfeed.session import Session, SqlResult

__all__ = [
    "EpochDataset",
    "Error",
    "ExecutionError",
    "Feed",
    "Function",
    "FunctionFailed",
    "InternalError",
    "PlanError",
    "ResourcesExhausted",
    "Session",
    "SqlResult",
    "__version__",
    "batch_udf",
    "cuda_device_count",
    "generate",
    "raw_h2d_bytes_per_s",
    "udf",
]
