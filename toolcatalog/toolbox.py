"""Wires the catalog-backed ToolBox for a run: surface, search index, built-in implementations.

The built-in implementations are reached only through `BUILTINS` below, so the
registry can be swapped for the full `toolcatalog/tools/` package in one place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolcatalog.builtins import BUILTINS
from toolcatalog.runtime import CatalogToolBox, Executor, Observation
from toolcatalog.search import ToolIndex, index_for
from toolcatalog.surface import ToolRecord


def builtin_records() -> list[ToolRecord]:
    """The built-in tools as resident records: what a fresh installation with an empty catalog offers."""
    return [
        ToolRecord(
            name=t.name, group="Files and shell", description=t.description, input_schema=t.input_schema, resident=True
        )
        for t in BUILTINS.values()
    ]


def builtin_names() -> frozenset[str]:
    """Tools this installation implements itself; imported entries with these names are built-ins."""
    return frozenset(BUILTINS)


def builtin_executor(workspace: Path) -> Executor:
    def execute(name: str, arguments: dict[str, Any]) -> Observation | None:
        tool = BUILTINS.get(name)
        return None if tool is None else tool.run(arguments, workspace)

    return execute


def run_toolbox(*, workspace: Path, mode: Any = None, deferral: bool | None = None) -> CatalogToolBox:
    from toolcatalog.selectors import run_surface

    surface, records = run_surface(mode=mode, deferral=deferral)
    index: list[ToolIndex] = []

    def run_index() -> ToolIndex:
        # Looked up once per run, on the first search; shared across runs per catalog version.
        if not index:
            index.append(index_for(records))
        return index[0]

    return CatalogToolBox(surface=surface, index=run_index, executor=builtin_executor(workspace))
