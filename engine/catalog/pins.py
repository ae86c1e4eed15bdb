"""Imported tools as a conversation first saw them (MC-4): a catalog change never rewrites its prefix.

Pure Python. An MCP server may change or drop its tools at any time (a refresh, its
`notifications/tools/list_changed`). A conversation keeps the definitions it started with:

- a tool it saw keeps its pinned description, schema and resident flag, whatever the catalog says now;
- a tool removed since stays offered with its pinned definition (its call says it was removed);
- a tool added since is admitted but left out of the name index: `search_tools` finds it and
  activating it loads it outside the cached prefix; new conversations list it like any other.

Only imported (`mcp`) tools are pinned: built-ins change with a deployment, not mid-conversation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from engine.catalog.surface import ToolRecord

PINNED_SOURCE = "mcp"


def pin_of(record: ToolRecord) -> dict[str, Any]:
    """What a pin keeps of a tool: everything its definition and its place in the prefix depend on."""
    return {
        "group": record.group,
        "group_order": record.group_order,
        "description": record.description,
        "input_schema": record.input_schema,
        "resident": record.resident,
    }


def pinnable(records: Iterable[ToolRecord]) -> dict[str, dict[str, Any]]:
    """The pins a conversation takes at its first turn: every imported tool it is offered."""
    return {record.name: pin_of(record) for record in records if record.source == PINNED_SOURCE}


def pinned_records(
    records: Iterable[ToolRecord], pins: Mapping[str, Mapping[str, Any]]
) -> tuple[list[ToolRecord], frozenset[str]]:
    """`records` with imported tools as pinned; also the imported names added since (kept out of the index)."""
    result: list[ToolRecord] = []
    unpinned: set[str] = set()
    present: set[str] = set()
    for record in records:
        if record.source != PINNED_SOURCE:
            result.append(record)
            continue
        present.add(record.name)
        pin = pins.get(record.name)
        if pin is None:
            unpinned.add(record.name)
            result.append(replace(record, resident=False))
        else:
            result.append(_as_pinned(record, pin))
    for name, pin in pins.items():
        if name not in present:
            result.append(_as_pinned(ToolRecord(name=name, group="", description="", input_schema={}), pin))
    return result, frozenset(unpinned)


def _as_pinned(record: ToolRecord, pin: Mapping[str, Any]) -> ToolRecord:
    return replace(
        record,
        group=pin["group"],
        group_order=pin["group_order"],
        description=pin["description"],
        input_schema=pin["input_schema"],
        resident=pin["resident"],
        source=PINNED_SOURCE,
    )
