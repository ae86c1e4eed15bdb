"""The pure surface: mode filter first, deferral second, grouped index, deferral off."""

from __future__ import annotations

import pytest

from engine.catalog.surface import ModeSpec, build_surface
from engine.catalog.toolbox import CatalogToolBox
from engine.request import ModelRequestSpec, text_block
from engine.tokens import estimate_json_tokens, estimate_text_tokens
from tests.support.catalog import reference_records


@pytest.mark.req("TD-2")
def test_resident_tools_carry_schemas_and_the_rest_is_a_grouped_name_index():
    records = reference_records()
    surface = build_surface(records, ModeSpec(), deferral=True)
    assert {tool.name for tool in surface.resident} == {tool.name for tool in records if tool.resident}
    assert len(surface.resident) == 24
    assert len(surface.deferred) == 126 - 24
    assert all("input_schema" in schema for schema in surface.resident_schemas())
    lines = surface.index_text.splitlines()
    assert lines[1].startswith("Files and shell: ")
    assert any(line.startswith("Tickets and projects: ") and "assign_ticket" in line for line in lines)
    assert any(line.startswith("Memory and knowledge: ") for line in lines)
    # Every deferred name is listed whole, once, exactly as the model must call it; no resident one is.
    listed = [name for line in lines[1:] for name in line.partition(": ")[2].split(" ")]
    assert sorted(listed) == sorted(tool.name for tool in surface.deferred)
    assert estimate_text_tokens(surface.index_text) < 600


@pytest.mark.req("TD-2")
def test_surface_order_is_deterministic_whatever_the_input_order():
    records = reference_records()
    forward = build_surface(records, ModeSpec(), deferral=True)
    backward = build_surface(list(reversed(records)), ModeSpec(), deferral=True)
    assert forward.resident_schemas() == backward.resident_schemas()
    assert forward.index_text == backward.index_text


@pytest.mark.req("TD-3")
def test_deferred_tool_block_is_at_most_a_fifth_of_the_full_one():
    records = reference_records()
    full = build_surface(records, ModeSpec(), deferral=False)
    deferred = build_surface(records, ModeSpec(), deferral=True)
    full_tokens = estimate_json_tokens(full.resident_schemas())
    deferred_tokens = estimate_json_tokens(deferred.resident_schemas()) + estimate_text_tokens(deferred.index_text)
    assert deferred_tokens / full_tokens <= 0.20


@pytest.mark.req("TD-4")
def test_a_modes_output_action_is_always_resident():
    records = reference_records()
    mode = ModeSpec(name="reporter", allow=("git_*", "read_file"), output_action="create_document")
    surface = build_surface(records, mode, deferral=True)
    assert "create_document" in {tool.name for tool in surface.resident}
    assert "create_document" not in surface.deferred_names


@pytest.mark.req("TD-8")
def test_a_denied_tool_is_neither_resident_nor_in_the_index():
    records = reference_records()
    mode = ModeSpec(name="no-shell", deny=("bash*", "git_push"))
    surface = build_surface(records, mode, deferral=True)
    names = {tool.name for tool in surface.resident} | surface.deferred_names
    assert "bash" not in names and "bash_background" not in names and "git_push" not in names
    assert "git_push" not in surface.index_text
    assert surface.get("bash") is None


@pytest.mark.req("TD-8")
def test_deferral_never_reveals_what_the_mode_denies_even_when_turned_off():
    records = reference_records()
    mode = ModeSpec(name="read-only", allow=("read_*", "search_*", "list_*"))
    surface = build_surface(records, mode, deferral=False)
    assert all(tool.name.startswith(("read_", "search_", "list_")) for tool in surface.resident)


@pytest.mark.req("TD-10")
def test_deferral_off_makes_every_admitted_tool_resident_with_no_index():
    records = reference_records()
    surface = build_surface(records, ModeSpec(), deferral=False)
    assert len(surface.resident) == 126
    assert surface.deferred == ()
    assert surface.index_text == ""
    assert surface.system_blocks() == []


@pytest.mark.req("TD-10")
def test_deferral_off_request_is_byte_identical_to_one_built_without_deferral_logic():
    records = reference_records()
    system = [text_block("You are an agent.")]
    messages = [{"role": "user", "content": [text_block("hello")]}]
    surface = build_surface(records, ModeSpec(), deferral=False)
    with_switch = ModelRequestSpec(
        model="m", system=[*system, *surface.system_blocks()], tools=surface.resident_schemas(), messages=messages
    )
    # What a server with no deferral at all sends: every tool, by name, and the plain system prompt.
    plain_tools = [
        {"name": t.name, "description": t.description, "input_schema": t.input_schema}
        for t in sorted(records, key=lambda t: t.name)
    ]
    without = ModelRequestSpec(model="m", system=system, tools=plain_tools, messages=messages)
    assert with_switch.serialize() == without.serialize()


@pytest.mark.req("TD-2", "TD-8")
def test_the_index_sends_the_model_to_search_tools_only_where_the_mode_admits_it():
    """QA: a mode without search_tools was told "find one with search_tools", and its refusal said the same."""
    records = reference_records()
    searching = build_surface(records, ModeSpec(allow=("git_*", "search_tools")), deferral=True)
    assert searching.index_text.splitlines()[0] == "Deferred tools (call one by name, or find one with search_tools):"
    reading = build_surface(records, ModeSpec(allow=("git_*", "read_file")), deferral=True)
    assert reading.index_text.splitlines()[0] == "Deferred tools (call one by name):"
    toolbox = CatalogToolBox(surface=reading, index=lambda: None, executor=lambda name, arguments: None)
    refused = toolbox.execute("search_tools", {"query": "x"})
    assert "search_tools" not in refused["error"].replace("'search_tools'", "")
