#!/usr/bin/env python3
"""Prints the W2 feature expression of ../shared/bench: x = (f - mean) / std
with the generator's constants from DATA/_meta.json, as sqlfeed SQL.

    python scripts/bench/w2_features.py /tmp/bench-data/big
"""

import json
import sys

meta = json.load(open(f"{sys.argv[1]}/_meta.json"))
terms = [
    f"standardize(f{j}, {m!r}, {s!r})"
    for j, (m, s) in enumerate(
        zip(meta["feature_mean"], meta["feature_std"], strict=True)
    )
]
print(f"feature_vector({', '.join(terms)})")
