#!/usr/bin/env python3
"""Prints the W2 feature expression of ../shared/bench: x = (f - mean) / std
with the generator's constants from DATA/_meta.json, as sqlfeed SQL
(importable as ``w2_features(data)`` by the scripts beside it).

    python scripts/bench/w2_features.py /tmp/bench-data/big
"""

import json
import sys


def w2_features(data: str) -> str:
    """The W2 feature vector of the bench data in ``data``, as SQL."""
    with open(f"{data}/_meta.json") as f:
        meta = json.load(f)
    terms = [
        f"standardize(f{j}, {m!r}, {s!r})"
        for j, (m, s) in enumerate(
            zip(meta["feature_mean"], meta["feature_std"], strict=True)
        )
    ]
    return f"feature_vector({', '.join(terms)})"


if __name__ == "__main__":
    print(w2_features(sys.argv[1]))
