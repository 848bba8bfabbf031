"""The bench scripts' writer of BENCHMARKS.md (issue 56, item 9): a script
replaces its own section and keeps every other one (bench-suite.sh wrote the
whole file and lost the GPU, timeline and user-function sections)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPLICE = ROOT / "scripts" / "bench" / "splice_section.py"


def _splice(path: Path, name: str, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SPLICE), name, str(path)],
        input=text,
        capture_output=True,
        text=True,
    )


def _sections(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("## ")]


def test_the_suite_replaces_its_section_and_keeps_the_others(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    original = (ROOT / "BENCHMARKS.md").read_text()
    path.write_text(original)
    # Every section but the suite's workloads (## W1 … ## W5).
    others = [s for s in _sections(original) if not re.match(r"## W\d ", s)]
    assert any("On a GPU" in s for s in others) and any("timeline" in s for s in others)
    new = "# BENCHMARKS\n\nOne run of a new suite.\n\n## W1 scan (every column) — data: tiny\n"
    done = _splice(path, "bench-suite", new)
    assert done.returncode == 0, done.stderr
    text = path.read_text()
    assert text.startswith("<!-- bench-suite: begin -->\n# BENCHMARKS\n\nOne run of a new suite.")
    assert _sections(text) == ["## W1 scan (every column) — data: tiny", *others]
    assert text.count("<!-- bench-suite: end -->") == 1
    # Again: the same file, not a second copy.
    assert _splice(path, "bench-suite", new).returncode == 0
    assert path.read_text() == text


def test_a_new_section_goes_at_the_end_and_a_broken_marker_is_refused(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# BENCHMARKS\n\n## Kept\n")
    assert _splice(path, "bench-new", "## New\n").returncode == 0
    assert path.read_text() == (
        "# BENCHMARKS\n\n## Kept\n\n<!-- bench-new: begin -->\n## New\n<!-- bench-new: end -->\n"
    )
    path.write_text("<!-- bench-new: begin -->\n## Half\n")
    broken = _splice(path, "bench-new", "## New\n")
    assert broken.returncode != 0 and "no '<!-- bench-new: end -->'" in broken.stderr
    assert path.read_text() == "<!-- bench-new: begin -->\n## Half\n"
