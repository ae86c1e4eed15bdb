"""A resident tool set that fits a small window (LM-2).

Kept apart from `surface.py` on purpose: the surface decides what a mode admits and
what deferral withholds; this only moves resident tools to the deferred index, the
least used first (ties: the largest schema first), until the resident block and the
name index together take at most their budget. The discovery tools and the mode's output action stay resident, or
nothing deferred could ever be found or the run could not answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from engine.catalog.surface import SEARCH_TOOL, Surface, ToolRecord, name_index
from engine.tokens import estimate_json_tokens, estimate_text_tokens

KEEP_RESIDENT = frozenset({"search_tools", "describe_tool", "list_tool_groups"})


def fit_to_window(surface: Surface, *, budget_tokens: int, uses: Mapping[str, int] | None = None) -> Surface:
    """`surface` with its resident block at most `budget_tokens` (or only the tools it must keep)."""
    if not surface.deferral or tool_block_tokens(surface.resident, surface.deferred) <= budget_tokens:
        return surface
    uses = uses or {}
    keep = KEEP_RESIDENT | ({surface.mode.output_action} if surface.mode.output_action else set())
    movable = sorted(
        (tool for tool in surface.resident if tool.name not in keep),
        key=lambda tool: (uses.get(tool.name, 0), -estimate_json_tokens(tool.definition()), tool.name),
    )
    moved: set[str] = set()
    resident = list(surface.resident)
    deferred = list(surface.deferred)
    for tool in movable:
        if tool_block_tokens(resident, deferred) <= budget_tokens:
            break
        resident.remove(tool)
        deferred.append(tool)
        moved.add(tool.name)
    searchable = surface.get(SEARCH_TOOL) is not None
    index = name_index(deferred, searchable=searchable)
    return replace(surface, resident=tuple(resident), deferred=tuple(deferred), index_text=index)


def resident_tokens(tools: Sequence[ToolRecord]) -> int:
    return estimate_json_tokens([tool.definition() for tool in tools]) if tools else 0


def tool_block_tokens(resident: Sequence[ToolRecord], deferred: Sequence[ToolRecord]) -> int:
    """The resident schemas and the name index of the deferred ones: what every request carries."""
    return resident_tokens(resident) + estimate_text_tokens(name_index(deferred))
