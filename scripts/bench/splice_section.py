#!/usr/bin/env python3
"""Replaces one script's section of BENCHMARKS.md, keeping every other one.

    splice_section.py NAME BENCHMARKS.md < SECTION

Each script's part of the file sits between ``<!-- NAME: begin -->`` and
``<!-- NAME: end -->``; the text read from standard input replaces what is
between them. A file without the markers gets the section at its end. A
bench script regenerates its own tables this
way: scripts/bench-suite.sh replaced the whole file and lost the GPU,
timeline and user-function sections (issue 56).
"""

from __future__ import annotations

import sys


def splice(document: str, name: str, section: str) -> str:
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    block = f"{begin}\n{section.rstrip()}\n{end}\n"
    start = document.find(begin)
    if start >= 0:
        stop = document.find(end, start)
        if stop < 0:
            raise SystemExit(f"BENCHMARKS.md has '{begin}' but no '{end}': fix the file by hand")
        rest = document[stop + len(end) :]
        return document[:start] + block + rest.removeprefix("\n")
    if not document:
        return block
    return document.rstrip("\n") + "\n\n" + block


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    name, path = sys.argv[1], sys.argv[2]
    try:
        with open(path, encoding="utf-8") as file:
            document = file.read()
    except FileNotFoundError:
        document = ""
    updated = splice(document, name, sys.stdin.read())
    with open(path, "w", encoding="utf-8") as file:
        file.write(updated)


if __name__ == "__main__":
    main()
