"""A Ballista executor that hosts a team's Python functions.

``sqlfeed executor --python /venv/bin/python --function-dir /opt/team-prep``
becomes this module's :func:`main` inside that interpreter::

    sqlfeed executor … (binary) ── exec ──► python -c bootstrap … ─► main(argv)
        import every module of each --function-dir (by name, as clients do)
        collect their sqlfeed functions (sqlfeed.udf, sqlfeed.batch_udf)
        └─► _sqlfeed.serve_executor(argv, declarations)   GIL released
              Ballista executor: its tasks call the functions as an embedded
              session does (in this process, or in concurrency=N workers)

Only the executor's own folders are imported: a client's plan names a
function (its name, ``module.qualname`` and identity, the content hash of its
code), it never carries code, since Ballista has no authentication and code
from a client could do anything here. An executor whose copy of a function
has another identity refuses the plan, naming both hashes. The scheduler
plans with the declarations the client sends and runs no Python.

A module that fails to import, or two functions with one name and different
code, stop the executor at start with the module named: a half-loaded
executor would fail later, in the middle of someone's job.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from sqlfeed.functions import Function


class FunctionDirError(Exception):
    """A ``--function-dir`` that cannot be served: missing, a module that does
    not import, or two functions that claim one name."""


def _module_names(folder: Path) -> list[str]:
    """Top-level modules and packages of ``folder``, sorted."""
    names = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith((".", "_")):
            continue
        if entry.is_file() and entry.suffix == ".py" and entry.stem.isidentifier():
            names.append(entry.stem)
        elif entry.is_dir() and (entry / "__init__.py").is_file() and entry.name.isidentifier():
            names.append(entry.name)
    return names


def _import(name: str, folder: Path) -> ModuleType:
    try:
        return importlib.import_module(name)
    except BaseException as e:  # noqa: BLE001 - any failure stops the start
        detail = "".join(traceback.format_exception(e)).rstrip()
        raise FunctionDirError(
            f"module '{name}' of --function-dir {folder} does not import; fix it or move "
            f"it out of the folder:\n{detail}"
        ) from e


def _modules(folder: Path) -> list[ModuleType]:
    """Every module of ``folder``: its top-level modules, and every submodule
    of its packages."""
    modules = []
    for name in _module_names(folder):
        module = _import(name, folder)
        modules.append(module)
        for sub in pkgutil.walk_packages(getattr(module, "__path__", []), prefix=f"{name}."):
            modules.append(_import(sub.name, folder))
    return modules


def load_function_dirs(folders: Sequence[str | os.PathLike[str]]) -> list[Function]:
    """The sqlfeed functions defined in the modules of ``folders``, which go
    first on ``sys.path`` (so worker processes, which inherit it, import them
    too). Raises :class:`FunctionDirError` naming what is wrong."""
    paths = []
    for folder in folders:
        path = Path(folder).resolve()
        if not path.is_dir():
            raise FunctionDirError(f"--function-dir {folder}: not a folder")
        paths.append(path)
    for path in reversed(paths):
        sys.path.insert(0, str(path))
    found: dict[str, Function] = {}
    seen: set[int] = set()
    for path in paths:
        for module in _modules(path):
            for value in list(vars(module).values()):
                if not isinstance(value, Function) or id(value) in seen:
                    continue
                seen.add(id(value))
                other = found.get(value.name)
                if other is not None and other.identity != value.identity:
                    raise FunctionDirError(
                        f"two functions are named '{value.name}': {other.qualname} "
                        f"(content {other.identity}) and {value.qualname} (content "
                        f"{value.identity}); a query could not say which it means: give one "
                        "another name (name=...)"
                    )
                found.setdefault(value.name, value)
    return sorted(found.values(), key=lambda f: f.name)


def _describe(function: Function) -> str:
    where = (
        "in process" if function.concurrency == 1 else f"{function.concurrency} worker processes"
    )
    return f"{function.name} ({function.qualname}, content {function.identity}, {where})"


def main(argv: Sequence[str] | None = None, expect_version: str | None = None) -> int:
    """Serves ``sqlfeed executor`` with the arguments ``argv`` (those after
    the program name) until stopped; returns the exit status.
    ``expect_version``: the version of the ``sqlfeed`` binary that started
    this interpreter, which must be the package's."""
    from sqlfeed import _sqlfeed

    args = ["sqlfeed", *(sys.argv[1:] if argv is None else argv)]
    if expect_version is not None and expect_version != _sqlfeed.__version__:
        print(
            f"Error: the sqlfeed binary is {expect_version} but this interpreter's sqlfeed "
            f"package ({sys.executable}) is {_sqlfeed.__version__}: install the same "
            "version in both",
            file=sys.stderr,
        )
        return 1
    try:
        options = _sqlfeed.executor_options(args)
        functions = load_function_dirs(options["function_dirs"])
    except (ValueError, FunctionDirError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    for function in functions:
        if not function.concurrency_given:
            # Every task slot calls at once: in one process they would take
            # turns at the GIL.
            function.concurrency = options["task_slots"]
    hosted = ", ".join(_describe(f) for f in functions)
    print(
        f"sqlfeed executor hosts {len(functions)} Python function(s)"
        + (f": {hosted}" if hosted else ""),
        file=sys.stderr,
        flush=True,
    )
    # The binary's executor keeps the signals' default actions (Ctrl-C ends
    # it); Python's SIGINT handler would wait for Python code to run, which
    # the serving thread never does.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    return int(_sqlfeed.serve_executor(args, [f._declaration() for f in functions]))


if __name__ == "__main__":
    sys.exit(main())
