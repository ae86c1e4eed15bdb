"""Breakpoints (TD-13) and append-only requests (TD-11) over the emulator's real cache rules."""

from __future__ import annotations

from typing import Any

import pytest

from engine.breakpoints import place_breakpoints, prefix_bytes
from engine.emulator import Emulator, ScriptedPolicy, TestClock
from engine.loop import run_turn
from engine.providers.inprocess import EmulatorProvider
from engine.request import ModelRequestSpec, text_block
from toolcatalog.builtins import WorkspaceToolBox

MODEL = "claude-sonnet-4-5"
SYSTEM = [text_block("You are a careful agent. " * 40)]


class Recording:
    """The real in-process emulator provider; keeps every request it was sent."""

    def __init__(self, emulator: Emulator) -> None:
        self.inner = EmulatorProvider(emulator)
        self.name = "emulator"
        self.defers_tool_loading = self.inner.defers_tool_loading
        self.requests: list[ModelRequestSpec] = []

    def stream(self, request: ModelRequestSpec):
        self.requests.append(request)
        yield from self.inner.stream(request)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [text_block(text)]}


def tool_call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": arguments}


def thirty_calls_interleaved() -> list[dict[str, Any]]:
    # Text between the calls makes each one its own position: 60 positions, far past the lookback of 20.
    blocks: list[dict[str, Any]] = []
    for n in range(30):
        blocks.append(text_block(f"Looking at folder {n}."))
        blocks.append(tool_call("list_dir", path="."))
    return blocks


def workspace(tmp_path):
    (tmp_path / "notes.txt").write_text("alpha\nbeta\n")
    return WorkspaceToolBox(tmp_path)


@pytest.mark.req("TD-13")
def test_every_request_carries_the_four_breakpoints_in_ttl_order():
    spec = ModelRequestSpec(
        model=MODEL,
        system=SYSTEM,
        tools=[
            {"name": "a", "input_schema": {}},
            {"name": "b", "input_schema": {}},
            {"name": "c", "defer_loading": True},
        ],
        messages=[user("one"), {"role": "assistant", "content": [text_block("two")]}, user("three")],
    )
    place_breakpoints(spec, previous_end=1)
    assert spec.breakpoints == ["tools", "system", "previous_turn", "current_turn"]
    marked = [(p.section, p.index, p.ttl) for p in spec.cache_points]
    # The last *resident* tool: a deferred schema is outside the cached block.
    assert marked == [("tools", 1, "1h"), ("system", 0, "1h"), ("messages", 1, "5m"), ("messages", 2, "5m")]
    payload = spec.as_payload()
    assert payload["tools"][1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert "cache_control" not in spec.messages[2]["content"][0]  # the history itself is never edited


@pytest.mark.req("TD-13")
def test_a_resident_count_from_the_toolbox_keeps_the_marker_before_appended_activations():
    spec = ModelRequestSpec(model=MODEL, system=SYSTEM, tools=[{"name": n} for n in "abcd"], messages=[user("hi")])
    place_breakpoints(spec, previous_end=None, resident_count=2)
    assert spec.cache_points[0].index == 1
    assert spec.breakpoints == ["tools", "system", "current_turn"]


@pytest.mark.req("TD-13")
def test_after_a_step_with_thirty_parallel_calls_the_next_request_reads_the_whole_previous_prefix(tmp_path):
    emulator = Emulator(clock=TestClock(), policy=ScriptedPolicy([thirty_calls_interleaved(), "All folders seen."]))
    provider = Recording(emulator)
    outcome = run_turn(
        provider=provider,
        model=MODEL,
        system=SYSTEM,
        history=[user("Here is the project brief. " + "The brief goes on. " * 800 + "Look at every folder.")],
        toolbox=workspace(tmp_path),
        emit=lambda kind, payload: None,
    )
    first, second = outcome.steps
    assert len(outcome.messages[0]["content"]) == 60 and len(outcome.messages[1]["content"]) == 30
    assert second.breakpoints == ["tools", "system", "previous_turn", "current_turn"]
    # The whole of the first request is read back, not just tools + system.
    assert second.usage.cache_read_input_tokens == first.usage.prompt_tokens
    assert second.usage.input_tokens + second.usage.cache_creation_input_tokens > 0

    # The same two requests with only the rolling end marker: the end of request 1 lies
    # beyond the lookback, so only the 1h tools+system prefix is read.
    replay = Emulator(clock=TestClock())
    replay.measure(provider.requests[0].as_payload())
    without = provider.requests[1]
    without.cache_points = [p for p in without.cache_points if p.label != "previous_turn"]
    missed = replay.measure(without.as_payload())
    assert missed.cache_read_input_tokens == first.usage.cache_creation_1h_input_tokens
    assert first.usage.prompt_tokens - missed.cache_read_input_tokens > 3000


@pytest.mark.req("TD-11")
def test_across_a_scripted_session_each_request_starts_with_the_bytes_of_the_one_before(tmp_path):
    script: list[Any] = []
    for turn in range(6):
        script += [
            [text_block(f"Turn {turn}: reading."), tool_call("read_file", path="notes.txt")],
            [tool_call("write_file", path=f"out{turn}.txt", content=f"turn {turn}"), tool_call("list_dir", path=".")],
            f"Turn {turn} done.",
        ]
    emulator = Emulator(clock=TestClock(), policy=ScriptedPolicy(script))
    provider = Recording(emulator)
    toolbox = workspace(tmp_path)
    history: list[dict[str, Any]] = []
    for turn in range(6):
        history.append(user(f"Please do step {turn}."))
        outcome = run_turn(
            provider=provider, model=MODEL, system=SYSTEM, history=history, toolbox=toolbox, emit=lambda k, p: None
        )
        history += outcome.messages
    requests = provider.requests
    assert len(requests) == 18
    for before, after in zip(requests, requests[1:], strict=False):
        assert len(after.messages) > len(before.messages)
        assert prefix_bytes(after, messages=len(before.messages)) == prefix_bytes(before)


@pytest.mark.req("TD-11")
def test_prefix_bytes_detects_a_rewritten_message(tmp_path):
    base = ModelRequestSpec(model=MODEL, system=SYSTEM, tools=[], messages=[user("a"), user("b")])
    rewritten = ModelRequestSpec(model=MODEL, system=SYSTEM, tools=[], messages=[user("A"), user("b"), user("c")])
    assert prefix_bytes(rewritten, messages=2) != prefix_bytes(base)


def catalog_toolbox(tmp_path, *, deferral: bool = True):
    from engine.catalog.ranking import ToolIndex
    from engine.catalog.surface import ModeSpec, build_surface
    from engine.catalog.toolbox import CatalogToolBox
    from tests.support.catalog import reference_records
    from toolcatalog.toolbox import builtin_executor

    records = reference_records()
    index = ToolIndex(records)
    surface = build_surface(records, ModeSpec(), deferral=deferral)
    return CatalogToolBox(surface=surface, index=lambda: index, executor=builtin_executor(tmp_path))


def activation_session(tmp_path, *, deferral: bool = True) -> tuple[Recording, list[Any]]:
    """Three turns, each a new run's toolbox as in production: a search, a direct call of a deferred
    name, then plain work; later turns keep the earlier tool_reference blocks in their history."""
    (tmp_path / "notes.txt").write_text("alpha\nbeta\n")
    script: list[Any] = [
        [tool_call("search_tools", query="assign a ticket to a person")],
        "Found the ticket tools.",
        # A deferred tool this installation runs: one it could not run would not be loaded (MC-2).
        [tool_call("save_memory", content="the tickets are loaded")],
        "save_memory answered.",
        [tool_call("read_file", path="notes.txt")],
        "Read the notes.",
    ]
    provider = Recording(Emulator(clock=TestClock(), policy=ScriptedPolicy(script)))
    history: list[dict[str, Any]] = []
    steps: list[Any] = []
    for turn in range(3):
        toolbox = catalog_toolbox(tmp_path, deferral=deferral)
        history.append(user(f"Please do step {turn}. " + "Context for the step. " * 300))
        system = [*SYSTEM, *toolbox.surface.system_blocks()]
        outcome = run_turn(
            provider=provider, model=MODEL, system=system, history=history, toolbox=toolbox, emit=lambda k, p: None
        )
        history += outcome.messages
        steps += outcome.steps
    return provider, steps


@pytest.mark.req("TD-11")
@pytest.mark.req("TD-5")
@pytest.mark.req("TD-6")
def test_activations_by_search_and_by_direct_call_keep_every_request_append_only_and_fully_cached(tmp_path):
    provider, steps = activation_session(tmp_path)
    requests = provider.requests
    assert len(requests) == 6
    for before, after in zip(requests, requests[1:], strict=False):
        assert prefix_bytes(after, messages=len(before.messages)) == prefix_bytes(before)
    # Every request reads the whole of the one before it, activation or not.
    for before, after in zip(steps, steps[1:], strict=False):
        assert after.usage.cache_read_input_tokens == before.usage.prompt_tokens
    loaded_by_search = steps[1].tools_loaded
    assert "assign_ticket" in loaded_by_search and steps[3].tools_loaded == ["save_memory"]
    assert all(step.cache_miss == "" for step in steps)  # the emulator keeps deferred tools out of the prefix
    # A later turn (a new toolbox) offers what the history loaded again, as deferred tools.
    deferred = [tool["name"] for tool in requests[-1].tools if tool.get("defer_loading")]
    assert deferred == [*loaded_by_search, "save_memory"]


@pytest.mark.req("TD-10")
def test_with_deferral_off_nothing_is_deferred_and_results_stay_plain_strings(tmp_path):
    provider, steps = activation_session(tmp_path, deferral=False)
    for request in provider.requests:
        assert not any(tool.get("defer_loading") for tool in request.tools)
        for message in request.messages:
            for block in message["content"]:
                if block["type"] == "tool_result":
                    assert isinstance(block["content"], str)
    assert all(step.tools_loaded == [] for step in steps)
