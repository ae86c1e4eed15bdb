"""A resident tool set that fits a small window (LM-2).

Kept apart from `surface.py` on purpose: the surface decides what a mode admits and
what deferral withholds; this only moves resident tools to the deferred index, the
least used first (ties: the largest schema first), until the resident block takes at
most its budget. The discovery tools and the mode's output action stay resident, or
nothing deferred could ever be found or the run could not answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from engine.catalog.surface import Surface, ToolRecord, name_index
from engine.tokens import estimate_json_tokens

KEEP_RESIDENT = frozenset({"search_tools", "describe_tool", "list_tool_groups"})


def fit_to_window(surface: Surface, *, budget_tokens: int, uses: Mapping[str, int] | None = None) -> Surface:
    """`surface` with its resident block at most `budget_tokens` (or only the tools it must keep)."""
    if not surface.deferral or resident_tokens(surface.resident) <= budget_tokens:
        return surface
    uses = uses or {}
    keep = KEEP_RESIDENT | ({surface.mode.output_action} if surface.mode.output_action else set())
    movable = sorted(
        (tool for tool in surface.resident if tool.name not in keep),
        key=lambda tool: (uses.get(tool.name, 0), -estimate_json_tokens(tool.definition()), tool.name),
    )
    moved: set[str] = set()
    resident = list(surface.resident)
    for tool in movable:
        if resident_tokens(resident) <= budget_tokens:
            break
        resident.remove(tool)
        moved.add(tool.name)
    deferred = (*surface.deferred, *(tool for tool in surface.resident if tool.name in moved))
    return replace(surface, resident=tuple(resident), deferred=deferred, index_text=name_index(deferred))


def resident_tokens(tools: tuple[ToolRecord, ...] | list[ToolRecord]) -> int:
    return estimate_json_tokens([tool.definition() for tool in tools]) if tools else 0
