"""The peers of sqlfeed's packed feed (scripts/bench-pack.sh), on the same
documents and tokenizer: one epoch from the Parquet files to batches of
token ids, timed from the start; prints one JSON line.

    python pack_peers.py hf|grain CORPUS_DIR TOKENIZER_JSON MAX_TOKENS SEQUENCES

- ``hf``: a Hugging Face ``datasets`` Dataset read from the Parquet files,
  tokenized with ``Dataset.map`` (batched, the ``tokenizers`` library the
  same tokenizer.json), and ``DataCollatorWithFlattening`` over batches of
  as many documents as fill ``SEQUENCES × MAX_TOKENS`` tokens on average
  (it flattens a batch into one row with restarting positions; it does not
  pack to a length).
- ``grain``: Grain's ``BestFitPackIterDataset`` (its best packer) over the
  documents tokenized in a ``map``, ``SEQUENCES`` bins of ``MAX_TOKENS``,
  then batched by ``SEQUENCES``.
"""

from __future__ import annotations

import glob
import json
import sys
import time

import numpy as np


def whole_documents(tokenizer):
    """The tokenizer without the file's truncation and padding (the
    repository's tokenizer.json pads and truncates to 128): documents of
    their own length, as sqlfeed's ``tokenize(text, path, max_len)`` with a
    large ``max_len`` gives them."""
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def hf(corpus: str, tokenizer_json: str, max_tokens: int, sequences: int) -> dict:
    import datasets
    from tokenizers import Tokenizer
    from transformers import DataCollatorWithFlattening

    datasets.disable_caching()
    start = time.perf_counter()
    tokenizer = whole_documents(Tokenizer.from_file(tokenizer_json))
    files = sorted(glob.glob(f"{corpus}/*.parquet"))
    dataset = datasets.Dataset.from_parquet(files, keep_in_memory=True)

    def tokenize(batch):
        return {"input_ids": [e.ids for e in tokenizer.encode_batch(batch["text"])]}

    dataset = dataset.map(tokenize, batched=True, remove_columns=["text"], keep_in_memory=True)
    collator = DataCollatorWithFlattening(return_tensors="np", return_flash_attn_kwargs=True)
    tokens = 0
    batches = 0
    first = None
    pending: list[dict] = []
    pending_tokens = 0
    target = sequences * max_tokens
    for example in dataset:
        pending.append({"input_ids": example["input_ids"]})
        pending_tokens += len(example["input_ids"])
        if pending_tokens >= target:
            batch = collator(pending)
            tokens += int(batch["input_ids"].size)
            batches += 1
            first = first or time.perf_counter() - start
            pending, pending_tokens = [], 0
    if pending:
        batch = collator(pending)
        tokens += int(batch["input_ids"].size)
        batches += 1
    seconds = time.perf_counter() - start
    return {"peer": "hf", "tokens": tokens, "batches": batches, "seconds": seconds, "ttfb_s": first}


def grain_run(corpus: str, tokenizer_json: str, max_tokens: int, sequences: int) -> dict:
    import grain
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    start = time.perf_counter()
    tokenizer = whole_documents(Tokenizer.from_file(tokenizer_json))
    texts: list[str] = []
    for path in sorted(glob.glob(f"{corpus}/*.parquet")):
        texts.extend(pq.read_table(path, columns=["text"])["text"].to_pylist())

    def tokenize(text: str) -> dict:
        # Grain's packer takes documents of at most max_tokens: longer ones
        # are cut, as its users do (sqlfeed splits them into pieces).
        ids = np.asarray(tokenizer.encode(text).ids, dtype=np.int32)[:max_tokens]
        return {"input_ids": ids}

    dataset = grain.MapDataset.source(texts).map(tokenize).to_iter_dataset()
    packed = grain.experimental.BestFitPackIterDataset(
        dataset,
        length_struct={"input_ids": max_tokens},
        num_packing_bins=sequences,
        shuffle_bins=False,
    )
    batched = packed.batch(sequences)
    tokens = 0
    padding = 0
    batches = 0
    first = None
    for batch in batched:
        segments = batch["input_ids_segment_ids"]
        tokens += int((segments > 0).sum())
        padding += int((segments == 0).sum())
        batches += 1
        first = first or time.perf_counter() - start
    seconds = time.perf_counter() - start
    return {
        "peer": "grain",
        "tokens": tokens,
        "batches": batches,
        "seconds": seconds,
        "ttfb_s": first,
        "padding_frac": padding / max(tokens + padding, 1),
    }


def main() -> None:
    peer, corpus, tokenizer_json = sys.argv[1], sys.argv[2], sys.argv[3]
    max_tokens, sequences = int(sys.argv[4]), int(sys.argv[5])
    run = {"hf": hf, "grain": grain_run}[peer]
    print(json.dumps(run(corpus, tokenizer_json, max_tokens, sequences)))


if __name__ == "__main__":
    main()
