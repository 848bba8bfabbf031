"""Scenario 6 with your own code: tokenizing written as a Python batch
function over the Hugging Face ``tokenizers`` package (``tokenize_batch``),
next to sqlfeed's built-in ``tokenize``: the same ids, padded per batch by the
feed either way.

    python examples/python/06_text_own.py [--data GLOB] [--tokenizer path/tokenizer.json]
"""

import pyarrow as pa
from _data import REPO, dataset, parser

import sqlfeed

MAX_LEN = 64
TOKENIZER = str(REPO / "udfs/tests/data/all-MiniLM-L6-v2.tokenizer.json")
_tokenizer = None


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


if __name__ == "__main__":
    args = parser(__doc__).parse_args()
    files = dataset(args)
    ours = sqlfeed.batch_udf({"ids": pa.list_(pa.int32())}, inputs=["text"], version="minilm-64")(
        tokenize_batch
    )
    session = sqlfeed.Session(functions=[ours], target_partitions=2)
    both = session.sql(
        f"SELECT tokenize(caption, '{TOKENIZER}', {MAX_LEN}) AS builtin, "
        f"tokenize_batch(caption)['ids'] AS ours FROM '{files}'"
    ).to_pylist()
    same = sum(row["builtin"] == row["ours"] for row in both)
    print(f"{same} of {len(both)} rows tokenized alike by tokenize() and tokenize_batch")
    assert same == len(both), "the two tokenizations differ"

    feed = session.feed(
        f"SELECT tokenize_batch(caption)['ids'] AS ids, label FROM '{files}'",
        batch_size=128,
        device="cpu",
    )
    batch = next(iter(feed))
    print(
        f"dynamic padding: ids {tuple(batch['ids'].shape)}, mask {tuple(batch['ids_mask'].shape)}"
    )
    feed.close()
