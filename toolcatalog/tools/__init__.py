"""The built-in tools, one module per family; `registry()` is every tool by name."""

from __future__ import annotations

from toolcatalog.tools import files, memory, output, search, shell, todo, web
from toolcatalog.tools.base import BuiltinTool, Observation, ToolContext, ToolFailure

FAMILIES = (files, search, shell, web, memory, todo, output)


def registry() -> dict[str, BuiltinTool]:
    return {tool.name: tool for family in FAMILIES for tool in family.TOOLS}


__all__ = ["BuiltinTool", "Observation", "ToolContext", "ToolFailure", "registry"]
