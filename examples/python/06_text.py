"""Scenario 6: variable-length text -- tokenize in SQL with a Hugging Face
tokenizer, pad per batch to its longest row (with a mask), or pack batches to
a token budget instead of a row count.

    python examples/python/06_text.py [--data GLOB] [--tokenizer path/or/url/tokenizer.json]
"""

from _data import REPO, dataset, parser

import sqlfeed

p = parser(__doc__)
p.add_argument("--tokenizer", default=str(REPO / "udfs/tests/data/all-MiniLM-L6-v2.tokenizer.json"))
args = p.parse_args()
files = dataset(args)
session = sqlfeed.Session()
query = f"SELECT tokenize(caption, '{args.tokenizer}', 64) AS ids, label FROM '{files}'"

padded = session.feed(query, batch_size=128, device="cpu")
batch = next(iter(padded))
print(f"dynamic padding: ids {tuple(batch['ids'].shape)}, mask {tuple(batch['ids_mask'].shape)}")
padded.close()

packed = session.feed(query, batch_tokens=4096, device="cpu")
sizes = [(b["ids"].shape[0], b["ids"].shape[1]) for b in packed]
assert all(rows * longest <= 4096 or rows == 1 for rows, longest in sizes)
rows = [s[0] for s in sizes]
print(f"token budget 4096: {len(sizes)} batches of {min(rows)}-{max(rows)} rows, {sum(rows)} rows")
