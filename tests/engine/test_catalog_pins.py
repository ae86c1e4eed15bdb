"""Pinned imported tools (MC-4): the pure part, on plain records."""

from __future__ import annotations

import pytest

from engine.catalog.pins import pinnable, pinned_records
from engine.catalog.surface import ModeSpec, ToolRecord, build_surface


def _tool(name: str, schema: dict | None = None, *, resident: bool = False, source: str = "mcp") -> ToolRecord:
    return ToolRecord(
        name=name,
        group="probe",
        description=f"{name} v1",
        input_schema=schema or {"type": "object"},
        resident=resident,
        source=source,
    )


@pytest.mark.req("MC-4")
def test_a_conversation_keeps_changed_and_removed_imported_tools_and_does_not_index_new_ones():
    first = [_tool("probe__echo", resident=True), _tool("probe__gone"), _tool("list_dir", source="built-in")]
    pins = pinnable(first)
    assert set(pins) == {"probe__echo", "probe__gone"}  # built-ins are not pinned

    changed = {"type": "object", "properties": {"times": {"type": "integer"}}}
    now = [
        ToolRecord(name="probe__echo", group="probe", description="v2", input_schema=changed, source="mcp"),
        _tool("probe__novel"),
        _tool("list_dir", source="built-in"),
    ]
    records, unindexed = pinned_records(now, pins)
    surface = build_surface(records, ModeSpec(), deferral=True, unindexed=unindexed)
    before = build_surface(first, ModeSpec(), deferral=True)

    assert surface.resident_schemas() == before.resident_schemas()  # echo as it began, still resident
    assert surface.index_text == before.index_text  # gone still listed, novel not
    assert unindexed == {"probe__novel"} and "probe__novel" in surface.admitted  # search_tools can load it
    assert surface.get("probe__gone").description == "probe__gone v1"
    fresh = build_surface(now, ModeSpec(), deferral=True)
    assert "probe__novel" in fresh.index_text and fresh.get("probe__echo").input_schema == changed

    # Without deferral every admitted tool is resident: a new one waits for the next conversation.
    flat = build_surface(records, ModeSpec(), deferral=False, unindexed=unindexed)
    assert "probe__novel" not in flat.admitted and "probe__gone" in flat.admitted
