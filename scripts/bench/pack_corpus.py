"""Writes a corpus of real, public-domain text as Parquet documents for the
packing benchmark (scripts/bench-pack.sh).

    python pack_corpus.py OUT_DIR FILE.txt [FILE.txt ...]

Each text file is cut into paragraphs (blank-line separated; a Project
Gutenberg header and licence footer, between "*** START OF" and "*** END
OF", are left out), lines joined by spaces. The documents are written, in
order, as 8 Parquet files with one column, ``text``. Paragraphs of novels
and plays have the heavy-tailed lengths of real documents: most are short, a
few are long.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def paragraphs(text: str) -> list[str]:
    start = text.find("*** START OF")
    if start >= 0:
        text = text[text.index("\n", start) + 1 :]
    end = text.find("*** END OF")
    if end >= 0:
        text = text[:end]
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        joined = " ".join(line.strip() for line in block.splitlines() if line.strip())
        if joined:
            out.append(joined)
    return out


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    documents: list[str] = []
    for path in sys.argv[2:]:
        documents.extend(paragraphs(Path(path).read_text(encoding="utf-8-sig")))
    files = 8
    per_file = -(-len(documents) // files)
    for i in range(files):
        part = documents[i * per_file : (i + 1) * per_file]
        pq.write_table(pa.table({"text": pa.array(part, pa.string())}), out / f"part-{i}.parquet")
    print(f"{len(documents)} documents, {sum(map(len, documents)):,} characters in {out}")


if __name__ == "__main__":
    main()
