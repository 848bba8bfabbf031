"""A team's preprocessing functions: the folder a cluster's executors host.

Executors import this folder's modules at start,

    sqlfeed executor --scheduler HOST:PORT --python "$(which python)" \
        --function-dir examples/python/functions

and clients import the same module by the same name (``import team_prep``,
with this folder on ``sys.path``), so a query calling ``preprocess_image`` runs
the same code embedded and on every executor. The examples of scenarios 2
and 6 (``02_preprocess_own.py``, ``06_text_own.py``) use these functions in
one process; ``08_cluster_functions.py`` runs them on a cluster.
"""

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
from PIL import Image

import sqlfeed

#: Side of the square images preprocess_image returns.
SIDE = 24
#: Tokens tokenize_batch keeps per caption.
MAX_LEN = 64
#: The tokenizer of scenario 6 (the one the Rust tests use).
TOKENIZER = str(Path(__file__).resolve().parents[3] / "udfs/tests/data/all-MiniLM-L6-v2.tokenizer.json")


@sqlfeed.batch_udf(
    {"pixels": pa.list_(pa.float32(), 3 * SIDE * SIDE), "label": pa.int64()},
    inputs=["jpeg", "label"],
    concurrency=2,
)
def preprocess_image(batch):
    """JPEG bytes -> float32 CHW pixels in [0, 1], flattened; labels kept."""
    pixels = np.empty((len(batch["jpeg"]), 3 * SIDE * SIDE), np.float32)
    for i, data in enumerate(batch["jpeg"]):
        image = Image.open(io.BytesIO(data)).convert("RGB").resize((SIDE, SIDE), Image.BILINEAR)
        pixels[i] = (np.asarray(image, np.float32) / 255.0).transpose(2, 0, 1).reshape(-1)
    return {"pixels": pixels, "label": batch["label"]}


_tokenizer = None


# `version=`: the tokenizer file's path differs between machines, and the
# identity would hash it (a global the function reads); the version says what
# matters, the vocabulary and the length.
@sqlfeed.batch_udf({"ids": pa.list_(pa.int32())}, inputs=["text"], version="minilm-64")
def tokenize_batch(batch):
    """Captions -> token ids (special tokens included, truncated to MAX_LEN)."""
    global _tokenizer
    if _tokenizer is None:  # once per process (each worker loads its own)
        from tokenizers import Tokenizer

        _tokenizer = Tokenizer.from_file(TOKENIZER)
        _tokenizer.enable_truncation(MAX_LEN)
        _tokenizer.no_padding()  # the feed pads each batch to its longest row
    encodings = _tokenizer.encode_batch([str(text) for text in batch["text"]])
    return {"ids": [e.ids for e in encodings]}
