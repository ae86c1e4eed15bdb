"""AR-1: the engine imports no Django piece and the apps form a DAG, as import-linter reads the code."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.req("AR-1")
def test_the_engine_is_pure_and_the_apps_import_only_downwards():
    checked = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports"))], cwd=ROOT, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "2 kept, 0 broken" in checked.stdout


PACKAGES = ("engine", "agents", "conversations", "scratchpad", "toolcatalog", "controlcenter")


def _deferred_imports_without_a_reason(source: str) -> list[int]:
    """Line numbers of imports inside a function with no comment on the lines just above the import
    (or, for a run of imports, above the first of the run) and none at the end of the line."""
    lines = source.splitlines()
    tree = ast.parse(source)
    # An optional package's import says why by what it catches: `except ImportError` or
    # `contextlib.suppress(ImportError)`.
    optional = {
        id(inner)
        for node in ast.walk(tree)
        if (isinstance(node, ast.Try) and "ImportError" in " ".join(ast.unparse(h) for h in node.handlers))
        or (isinstance(node, ast.With) and "suppress(ImportError)" in ast.unparse(node.items[0]))
        for inner in ast.walk(node)
    }
    missing = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if not isinstance(node, ast.Import | ast.ImportFrom) or id(node) in optional:
                continue
            row = node.lineno - 1
            if "#" in lines[row]:
                continue
            above = row - 1
            # A run of imports (and the blank lines isort puts between their sections) shares one reason.
            while above >= 0 and (not lines[above].strip() or lines[above].lstrip().startswith(("from ", "import "))):
                above -= 1
            if above < 0 or not lines[above].lstrip().startswith("#"):
                missing.append(node.lineno)
    return missing


@pytest.mark.req("AR-1")
def test_every_import_deferred_into_a_function_says_why_on_the_line_above():
    unexplained = [
        f"{path.relative_to(ROOT)}:{line}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
        for line in _deferred_imports_without_a_reason(path.read_text(encoding="utf-8"))
    ]
    assert not unexplained, "imports deferred into a function with no one-line reason above them:\n" + "\n".join(
        unexplained
    )


def test_the_deferred_import_check_tells_a_reason_from_none():
    source = (
        "def explained():\n"
        "    # Heavy: the SDK costs a second at import.\n"
        "    from a import b\n\n"
        "    from c import d\n"
        "    return b, d\n\n"
        "def inline():\n"
        "    import e  # optional extra\n\n"
        "def bare():\n"
        "    x = 1\n"
        "    from f import g\n"
        "    return x, g\n\n"
        "def optional():\n"
        "    try:\n"
        "        import h\n"
        "    except ImportError:\n"
        "        return None\n"
        "    return h\n"
    )
    assert _deferred_imports_without_a_reason(source) == [13]
