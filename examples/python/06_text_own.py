"""Scenario 6 with your own code: tokenizing written as a Python batch
function over the Hugging Face ``tokenizers`` package (``tokenize_batch`` in
``functions/team_prep.py``),
next to sqlfeed's built-in ``tokenize``: the same ids, padded per batch by the
feed either way.

    python examples/python/06_text_own.py [--data GLOB] [--tokenizer path/tokenizer.json]
"""

import sys
from pathlib import Path

from _data import dataset, parser

import sqlfeed

# The team's functions live in a folder a cluster's executors can host too
# (08_cluster_functions.py); here they run in this process.
sys.path.insert(0, str(Path(__file__).resolve().parent / "functions"))
from team_prep import MAX_LEN, TOKENIZER, tokenize_batch  # noqa: E402


if __name__ == "__main__":
    args = parser(__doc__).parse_args()
    files = dataset(args)
    session = sqlfeed.Session(functions=[tokenize_batch], target_partitions=2)
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
