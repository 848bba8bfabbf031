"""docs/python-api.md from the ``sqlfeed`` package's own signatures and
docstrings, so the guide's Python reference cannot drift from the code.

    SQLFEED_BLESS=1 pytest python/tests/test_docs.py::test_python_api_page_is_current

rewrites the page; the test fails while the page and the package differ. Run
with an interpreter that imports ``sqlfeed`` (the built extension), torch and
lightning (the test venv).
"""

from __future__ import annotations

import importlib
import inspect
import re

MODULES = ["sqlfeed", "sqlfeed.metrics", "sqlfeed.torch", "sqlfeed.lightning"]

HEADER = """# Python API

<!-- Generated from the package's signatures and docstrings by scripts/docs/python_api.py; do not edit. python/tests/test_docs.py keeps it in sync (SQLFEED_BLESS=1 rewrites it). -->

Everything `import sqlfeed` gives, and the modules for PyTorch, Lightning and metrics. The type
stubs (`python/sqlfeed/*.pyi`, `py.typed`) give editors the same signatures.
"""


def public_names(module) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and getattr(value, "__module__", None) == module.__name__
        ]
    return sorted(n for n in names if n != "__version__")


def signature(name: str, value) -> str:
    try:
        return f"{name}{inspect.signature(value)}"
    except (TypeError, ValueError):
        return name


SECTIONS = ("Args:", "Returns:", "Raises:", "Yields:", "Example:", "Examples:")


def doc(value) -> str:
    """The docstring in Markdown: reST's ``code`` and roles as `code`, the
    Google-style sections as lists, ``::`` blocks as fenced code."""
    text = inspect.getdoc(value) or "(no docstring)"
    text = re.sub(r":(?:class|meth|func|attr|mod|exc):`~?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    out: list[str] = []
    in_code = in_section = False
    for line in text.splitlines():
        if in_code:
            if line.strip() and not line.startswith("    "):
                out.append("```")
                in_code = False
            else:
                out.append(line[4:])
                continue
        if line.strip() in SECTIONS:
            out.append(f"\n**{line.strip()[:-1]}**\n")
            in_section = True
            continue
        if in_section and re.match(r"^    \S", line):
            name, sep, rest = line.strip().partition(": ")
            out.append(
                f"- `{name}`: {rest}"
                if sep and " " not in name
                else f"- {line.strip()}"
            )
            continue
        if in_section and line.startswith("        "):
            out.append("  " + line.strip())
            continue
        if not line.strip():
            in_section = False
        if line.rstrip().endswith("::"):
            out.append(line.rstrip()[:-1])
            out.append("")
            out.append("```python")
            in_code = True
            continue
        out.append(line)
    if in_code:
        out.append("```")
    return "\n".join(out).strip()


def members(cls) -> list[tuple[str, object]]:
    found = []
    for name, value in vars(cls).items():
        if name.startswith("_") and name not in ("__iter__", "__len__", "__getitem__"):
            continue
        if (
            inspect.isfunction(value)
            or inspect.ismethoddescriptor(value)
            or isinstance(value, (property, staticmethod, classmethod))
            or type(value).__name__
            in ("getset_descriptor", "method_descriptor", "builtin_function_or_method")
        ):
            found.append((name, value))
    return sorted(found)


def markdown() -> str:
    out = [HEADER]
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        out.append(f"## `{module_name}`\n")
        if module_name != "sqlfeed":
            out.append(doc(module) + "\n")
        for name in public_names(module):
            value = getattr(module, name)
            kind = "class" if inspect.isclass(value) else "function"
            if inspect.isclass(value) and issubclass(value, BaseException):
                kind = "exception"
            out.append(f"### `{module_name}.{name}`\n")
            shown = signature(name, value) if kind != "exception" else name
            out.append(f"```text\n{kind} {shown}\n```\n")
            out.append(doc(value) + "\n")
            if kind == "class":
                for member, attr in members(value):
                    target = attr.fget if isinstance(attr, property) else attr
                    if isinstance(attr, (staticmethod, classmethod)):
                        target = attr.__func__
                    head = (
                        member
                        if isinstance(attr, property)
                        or type(attr).__name__ == "getset_descriptor"
                        else signature(member, target)
                    )
                    out.append(f"#### `{name}.{head.split('(')[0]}`\n")
                    out.append(f"```text\n{head}\n```\n")
                    out.append(doc(target) + "\n")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
