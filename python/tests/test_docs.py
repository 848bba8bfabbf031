"""The README's and the user guide's examples, run (issue 59).

Every fenced block of README.md and ``docs/*.md`` whose language is ``sh``,
``sql`` or ``python`` is run, in order, in a fresh folder per page that
holds ``data/`` (``sqlfeed gen --rows 2000``), with the debug ``sqlfeed`` on
``PATH`` and this interpreter's ``python`` and ``sqlfeed`` package, and
``udfs/`` linked to the repository's (a page reads from the root):

- ``sh``: ``bash -euo pipefail``, in a session of its own whose processes
  (servers a block starts in the background) are killed when it ends;
- ``sql``: ``sqlfeed -f`` of the block;
- ``python``: ``python`` of the block.

A block must exit 0. A ``text`` block right after a comment
``<!-- doctest: output -->`` is the output the block before it prints: its
lines are compared with stdout, a line ``…`` matching any number of lines.
A block that cannot run here says why in a comment right above it,
``<!-- doctest: not run: REASON -->`` (the nearest non-blank line above
the fence), and ``NOT_RUN`` below lists each
such reason, so that a new one is a decision a reviewer sees, not a silent
skip. ``docs/functions.md`` is generated from the functions' documentation
and its examples are run by the Rust test that generates it
(``function_docs``); ``docs/python-api.md`` is generated from the package's
docstrings and checked here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, require, sqlfeed_bin

RUNNABLE = {"sh", "sql", "python"}
# Pages whose examples other tests run.
GENERATED = {"docs/functions.md", "docs/python-api.md"}
README_MAX_LINES = 250
BLOCK_TIMEOUT_S = 600

# Every block that is not run, by page and the reason its comment gives.
NOT_RUN = {
    ("README.md", "the build itself: the test command has just built both"),
    ("README.md", "the test command itself"),
    ("docs/index.md", "the build itself: the test command has just built both"),
    (
        "docs/functions-own.md",
        "a release build of the template plugin (minutes); tests/integration/plugins.rs loads it",
    ),
    (
        "docs/object-stores.md",
        "needs a bucket and credentials; tests/integration/s3.rs runs globs on moto",
    ),
    ("docs/cluster.md", "the deployment in general; the block below runs one on this machine"),
    (
        "docs/scaling.md",
        "a deployment over several machines; docs/cluster.md runs one on one machine",
    ),
    ("docs/scaling.md", "a benchmark of a release build, minutes long"),
}


@dataclass
class Block:
    page: str
    line: int
    lang: str
    text: str
    not_run: str | None = None
    expected: list[str] | None = None


FENCE = re.compile(r"^(`{3,})([A-Za-z0-9_+-]*)\s*$")
DIRECTIVE = re.compile(r"^<!--\s*doctest:\s*(.*?)\s*-->\s*$")


def pages() -> list[str]:
    docs = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))
    return ["README.md", *[p for p in docs if p not in GENERATED]]


def blocks_of(page: str) -> list[Block]:
    """The fenced blocks of a page, with the directive above each."""
    lines = (REPO / page).read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, lang = opening.group(1), opening.group(2)
        # The directive is the nearest non-blank line above the fence.
        above = i - 1
        while above >= 0 and not lines[above].strip():
            above -= 1
        directive = DIRECTIVE.match(lines[above]) if above >= 0 else None
        start = i
        i += 1
        body = []
        while i < len(lines) and lines[i].rstrip() != fence:
            body.append(lines[i])
            i += 1
        if i == len(lines):
            pytest.fail(f"{page}:{start + 1}: a fenced block that is never closed")
        i += 1
        block = Block(page, start + 1, lang, "\n".join(body) + "\n")
        if directive:
            said = directive.group(1)
            if said == "output":
                if lang != "text" or not found:
                    pytest.fail(
                        f"{page}:{start + 1}: `doctest: output` must come before a text block"
                    )
                found[-1].expected = body
                continue
            if said.startswith("not run:"):
                block.not_run = said.removeprefix("not run:").strip()
            else:
                pytest.fail(f"{page}:{start + 1}: unknown doctest directive {said!r}")
        found.append(block)
    return found


def matches(expected: list[str], actual: list[str]) -> bool:
    """``expected`` equals ``actual`` line by line (trailing spaces aside),
    a line ``…`` matching any run of lines."""
    expected = [line.rstrip() for line in expected]
    actual = [line.rstrip() for line in actual]

    def at(e: int, a: int) -> bool:
        if e == len(expected):
            return a == len(actual)
        if expected[e] == "…":
            return any(at(e + 1, k) for k in range(a, len(actual) + 1))
        return a < len(actual) and expected[e] == actual[a] and at(e + 1, a + 1)

    return at(0, 0)


@pytest.fixture(scope="module")
def gen_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("doc-data")
    subprocess.run(
        [Path(sqlfeed_bin()).resolve(), "gen", "--rows", "2000", "--out", "data", "--files", "2"],
        cwd=folder,
        check=True,
        capture_output=True,
    )
    return folder / "data"


def environment(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    bin_dir = str(Path(sqlfeed_bin()).resolve().parent)
    env["PATH"] = os.pathsep.join([bin_dir, str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python"), env.get("PYTHONPATH", "")])
    env["SQLFEED_CACHE_DIR"] = str(workdir / ".cache")
    env["SQLFEED_HISTORY"] = str(workdir / ".history")
    # Blocks are read by people on a terminal; here the progress bars are off.
    env.pop("COLUMNS", None)
    return env


def run_block(block: Block, workdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    script = (
        workdir / f".block-{block.line}.{ {'sh': 'sh', 'sql': 'sql', 'python': 'py'}[block.lang] }"
    )
    script.write_text(block.text)
    command = {
        "sh": ["bash", "-euo", "pipefail", str(script)],
        "sql": [str(Path(sqlfeed_bin()).resolve()), "-f", str(script)],
        "python": [sys.executable, str(script)],
    }[block.lang]
    # Output goes to files, not pipes: a server the block leaves running in
    # the background keeps a pipe open, and reading to its end would wait
    # for that server, not for the block.
    out_path, err_path = script.with_suffix(".out"), script.with_suffix(".err")
    with out_path.open("w") as out, err_path.open("w") as err:
        process = subprocess.Popen(
            command, cwd=workdir, env=env, stdout=out, stderr=err, text=True, start_new_session=True
        )
        try:
            returncode = process.wait(timeout=BLOCK_TIMEOUT_S)
            timed_out = ""
        except subprocess.TimeoutExpired:
            returncode, timed_out = -9, f"\n(timed out after {BLOCK_TIMEOUT_S} s)"
        finally:
            # Whatever the block left running in the background (a
            # scheduler, executors) goes with it.
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
    return subprocess.CompletedProcess(
        command, returncode, out_path.read_text(), err_path.read_text() + timed_out
    )


def run_page(page: str, workdir: Path, gen_folder: Path | None) -> list[str]:
    """Runs the page's blocks in ``workdir``, with a copy of ``gen_folder``
    as ``data/`` unless None."""
    if gen_folder is not None:
        shutil.copytree(gen_folder, workdir / "data")
    # Pages are read from the repository's root, where the test data of the
    # functions (a real tokenizer.json) lies: the same paths work here.
    (workdir / "udfs").symlink_to(REPO / "udfs", target_is_directory=True)
    env = environment(workdir)
    failures = []
    for block in blocks_of(page):
        if block.lang not in RUNNABLE or block.not_run:
            continue
        done = run_block(block, workdir, env)
        where = f"{page}:{block.line} ({block.lang})"
        if done.returncode != 0:
            failures.append(
                f"{where} exited {done.returncode}\n--- block\n{block.text}--- stdout (end)\n"
                f"{done.stdout[-3000:]}\n--- stderr (end)\n{done.stderr[-3000:]}"
            )
        elif block.expected is not None and not matches(block.expected, done.stdout.splitlines()):
            failures.append(
                f"{where}: the output differs from the page's\n--- page\n"
                + "\n".join(block.expected)
                + f"\n--- printed\n{done.stdout}"
            )
    return failures


@pytest.mark.parametrize("page", [p for p in pages() if p != "README.md"])
def test_page_examples_run(page, tmp_path, gen_folder):
    """Every runnable block of a guide page, in order, in one folder."""
    failures = run_page(page, tmp_path, gen_folder)
    assert not failures, "\n\n".join(failures)


def test_readme_tour_verbatim(tmp_path):
    """A newcomer's path: the README's blocks as written, one after another
    in one folder, after the two commands (which the test command is)."""
    blocks = [b for b in blocks_of("README.md") if b.lang in RUNNABLE and not b.not_run]
    langs = {b.lang for b in blocks}
    assert langs == RUNNABLE, f"the README's tour shows the CLI, SQL and Python: it has {langs}"
    # The tour makes its own data, as a newcomer would.
    failures = run_page("README.md", tmp_path, None)
    assert not failures, "\n\n".join(failures)


def test_blocks_not_run_are_the_listed_ones():
    said = {(b.page, b.not_run) for p in pages() for b in blocks_of(p) if b.not_run}
    assert said == NOT_RUN, (
        "blocks marked `doctest: not run` changed; update NOT_RUN if that is meant:\n"
        f"new: {sorted(said - NOT_RUN)}\ngone: {sorted(NOT_RUN - said)}"
    )


def test_every_code_block_says_its_language():
    """A fence without a language would be neither run nor listed."""
    for page in pages():
        for block in blocks_of(page):
            assert block.lang, (
                f"{page}:{block.line}: say the block's language (sh, sql, python, text, rust …)"
            )


def test_readme_is_short():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, more than {README_MAX_LINES}"


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub and mkdocs make it for plain headings."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return re.sub(r" ", "-", text)


def anchors(path: Path) -> set[str]:
    found, in_fence = set(), False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def test_links_resolve():
    """Relative links of the README, the guide and the other top-level pages
    name files that exist and headings they have (mkdocs checks the guide's
    too; this covers the pages outside it)."""
    broken = []
    for doc in [
        "README.md",
        "DEVELOPERS.md",
        "BENCHMARKS.md",
        *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")),
    ]:
        path = REPO / doc
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            if not resolved.exists():
                broken.append(f"{doc}: {target}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{doc}: {target}: no such heading")
    assert not broken, "\n".join(broken)


def test_guide_builds(tmp_path):
    """mkdocs builds the guide with warnings as errors: a page missing from
    the navigation, a link to a missing page or heading fails."""
    require("mkdocs", "docs")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(REPO / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    assert (tmp_path / "site" / "index.html").exists()


def test_python_api_page_is_current():
    """docs/python-api.md is generated from the package's docstrings and
    signatures; ``SQLFEED_BLESS=1`` rewrites it."""
    sys.path.insert(0, str(REPO / "scripts" / "docs"))
    try:
        import python_api
    finally:
        sys.path.pop(0)
    page = REPO / "docs" / "python-api.md"
    text = python_api.markdown()
    if os.environ.get("SQLFEED_BLESS") == "1":
        page.write_text(text)
    assert page.exists() and page.read_text() == text, (
        "docs/python-api.md is not what the package documents: SQLFEED_BLESS=1 pytest "
        "tests/test_docs.py::test_python_api_page_is_current rewrites it"
    )
