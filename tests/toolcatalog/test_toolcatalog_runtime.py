"""The catalog ToolBox inside the real agent loop: direct calls, search, modes, approval, append-only."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from engine.catalog.ranking import ToolIndex
from engine.catalog.surface import ModeSpec, ToolRecord, build_surface
from engine.catalog.toolbox import CatalogToolBox, search_tool_bm25
from engine.emulator import Emulator, ScriptedPolicy, TestClock
from engine.loop import run_turn
from engine.providers.inprocess import EmulatorProvider
from engine.request import referenced_tools, text_block
from engine.tokens import estimate_json_tokens
from tests.support.catalog import ScriptedModel, final, reference_records, tool_call
from toolcatalog.toolbox import builtin_executor

HISTORY = [{"role": "user", "content": [text_block("go")]}]


def _records(*, list_dir_resident: bool = False, **changes: dict) -> list[ToolRecord]:
    records = []
    for record in reference_records():
        if record.name == "list_dir":
            record = replace(record, resident=list_dir_resident)
        if record.name in changes:
            record = replace(record, **changes[record.name])
        records.append(record)
    return records


def _toolbox(tmp_path, records, mode=None, approve=None) -> CatalogToolBox:
    surface = build_surface(records, mode or ModeSpec(), deferral=True)
    index = ToolIndex(records)
    kwargs = {"approve": approve} if approve else {}
    return CatalogToolBox(surface=surface, index=lambda: index, executor=builtin_executor(tmp_path), **kwargs)


class Recording(EmulatorProvider):
    """The in-process emulator (it refuses a reference to a tool the request lacks), keeping every request."""

    def __init__(self, *replies) -> None:
        super().__init__(Emulator(clock=TestClock(), policy=ScriptedPolicy(list(replies))))
        self.requests: list = []

    def stream(self, request):
        self.requests.append(request)
        return super().stream(request)


def _run(model, toolbox):
    events = []
    outcome = run_turn(
        provider=model,
        model="m",
        system=[text_block("sys"), *toolbox.surface.system_blocks()],
        history=HISTORY,
        toolbox=toolbox,
        emit=lambda kind, payload: events.append((kind, payload)),
    )
    results = [payload["output"] for kind, payload in events if kind == "tool_result"]
    return outcome, results


@pytest.mark.req("TD-5")
def test_a_deferred_tool_called_by_name_at_the_first_step_runs_with_no_extra_model_request(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    toolbox = _toolbox(tmp_path, _records())
    assert "list_dir" in toolbox.surface.deferred_names
    model = ScriptedModel([tool_call("t1", "list_dir", {"path": "."}), final()])
    outcome, results = _run(model, toolbox)
    assert len(model.requests) == 2  # the call and the answer, exactly as for a resident tool
    assert results[0]["ok"] is True
    assert [entry["name"] for entry in results[0]["entries"]] == ["notes.txt"]
    assert [(a.tool_name, a.trigger) for a in toolbox.activations] == [("list_dir", "direct")]
    assert outcome.stop_reason == "end_turn"


@pytest.mark.req("TD-5")
def test_a_direct_call_is_validated_against_the_loaded_schema(tmp_path):
    toolbox = _toolbox(tmp_path, _records())
    observation = toolbox.execute("list_dir", {"depth": 9})
    assert observation["ok"] is False
    assert "depth" in observation["error"] and "9" in observation["error"]
    assert observation["input_schema"]["properties"]["depth"]["maximum"] == 5


@pytest.mark.req("TD-11")
@pytest.mark.req("TD-5")
def test_activated_schemas_are_appended_after_the_resident_block(tmp_path):
    toolbox = _toolbox(tmp_path, _records())
    model = ScriptedModel([tool_call("t1", "list_dir", {}), final()])
    _run(model, toolbox)
    first, second = (request.tools for request in model.requests)
    assert second[: len(first)] == first
    # Deferred, outside the cached prefix; the call's own result loads it (TD-11).
    assert second[len(first) :] == [{**toolbox.surface.admitted["list_dir"].definition(), "defer_loading": True}]
    result = model.requests[1].messages[-1]["content"][0]
    assert result["content"][1:] == [{"type": "tool_reference", "tool_name": "list_dir"}]
    assert json.loads(result["content"][0]["text"])["ok"] is True
    assert model.requests[0].system == model.requests[1].system


@pytest.mark.req("TD-8")
def test_a_name_not_on_the_surface_is_a_clear_error_and_never_runs(tmp_path):
    (tmp_path / "secret").mkdir()
    toolbox = _toolbox(tmp_path, _records(), mode=ModeSpec(name="no-listing", deny=("list_*",)))
    model = ScriptedModel([tool_call("t1", "list_dir", {}), tool_call("t2", "no_such_tool", {}), final()])
    _, results = _run(model, toolbox)
    assert results[0] == {
        "ok": False,
        "error": "There is no tool named 'list_dir' on this run's surface. Use search_tools to find the right "
        "tool, or call one from the tool list or the name index.",
    }
    assert results[1]["ok"] is False and "'no_such_tool'" in results[1]["error"]
    assert toolbox.activations == [] and not toolbox.calls
    assert all(tool["name"] != "list_dir" for tool in model.requests[-1].tools)


@pytest.mark.req("TD-8")
@pytest.mark.req("TD-6")
def test_a_mode_that_denies_a_tool_makes_it_unfindable_by_search(tmp_path):
    query = "assign a ticket to a person"
    open_box = _toolbox(tmp_path, _records())
    found = open_box.execute("search_tools", {"query": query})
    assert "assign_ticket" in [match["name"] for match in found["matches"]]
    closed = _toolbox(tmp_path, _records(), mode=ModeSpec(name="no-tickets", deny=("*ticket*",)))
    result = closed.execute("search_tools", {"query": query})
    assert all("ticket" not in match["name"] for match in result["matches"])
    assert all("ticket" not in name for name in closed.activated)
    assert closed.execute("assign_ticket", {"ticket": "OPS-1", "assignee": "dana"})["ok"] is False


@pytest.mark.req("TD-6")
def test_search_returns_schemas_and_activates_matches_for_the_next_request(tmp_path):
    toolbox = _toolbox(tmp_path, _records())
    model = ScriptedModel([tool_call("t1", "search_tools", {"query": "assign a ticket to someone"}), final()])
    _, results = _run(model, toolbox)
    names = [match["name"] for match in results[0]["matches"]]
    assert "assign_ticket" in names
    # The schemas are loaded by tool_reference blocks in the result, sent as deferred tools (TD-11).
    result = model.requests[1].messages[-1]["content"][0]["content"]
    deferred_matches = [name for name in names if name in toolbox.surface.deferred_names]
    assert [item["tool_name"] for item in result[1:]] == results[0]["loaded"] == deferred_matches
    offered_next = {tool["name"]: tool for tool in model.requests[1].tools}
    assert offered_next["assign_ticket"] == {
        **toolbox.surface.admitted["assign_ticket"].definition(),
        "defer_loading": True,
    }
    assert ("assign_ticket", "search", "assign a ticket to someone") in [
        (a.tool_name, a.trigger, a.query) for a in toolbox.activations
    ]


@pytest.mark.req("TD-6")
@pytest.mark.req("TD-15")
def test_an_empty_search_says_so_plainly_and_suggests_rephrasing(tmp_path):
    toolbox = _toolbox(tmp_path, _records())
    result = toolbox.execute("search_tools", {"query": "zzqx wobblefrump"})
    assert result["ok"] is True and result["matches"] == []
    assert result["message"].startswith("No tool on this run's surface matches 'zzqx wobblefrump'.")
    assert "rephrase" in result["message"] and "more broadly" in result["message"]
    assert toolbox.misses == ["zzqx wobblefrump"] and toolbox.activations == []


@pytest.mark.req("TD-6")
def test_an_over_long_search_query_gets_an_error_that_names_the_limit(tmp_path):
    toolbox = _toolbox(tmp_path, _records())
    result = toolbox.execute("search_tools", {"query": " assign a ticket" * 20_000})
    assert result["ok"] is False and "319,999 characters" in result["error"] and "at most 1,000" in result["error"]
    assert toolbox.misses == [] and toolbox.activations == []


@pytest.mark.req("TD-8")
def test_an_activated_tool_still_needs_approval_when_it_requires_it(tmp_path):
    asked = []

    def gate(tool, arguments):
        asked.append((tool.name, arguments))
        return None  # approved

    records = _records(list_dir={"requires_approval": True})
    approving = _toolbox(tmp_path, records, approve=gate)
    assert approving.execute("list_dir", {})["ok"] is True
    assert asked == [("list_dir", {})]
    # With no approval given (the default gate), the activated tool is loaded but does not run.
    refusing = _toolbox(tmp_path, records)
    observation = refusing.execute("list_dir", {})
    assert observation["ok"] is False and observation["approval_required"] is True
    assert refusing.activated == ["list_dir"] and not refusing.calls


@pytest.mark.req("TD-8")
def test_an_activated_tool_keeps_its_action_limit(tmp_path):
    toolbox = _toolbox(tmp_path, _records(list_dir={"max_calls_per_run": 1}))
    assert toolbox.execute("list_dir", {})["ok"] is True
    second = toolbox.execute("list_dir", {})
    assert second == {"ok": False, "error": "list_dir may be called at most 1 times in one run."}


@pytest.mark.req("TD-6")
def test_describe_tool_loads_schemas_and_names_what_is_missing(tmp_path):
    toolbox = _toolbox(tmp_path, _records())
    result = toolbox.execute("describe_tool", {"names": ["git_log", "nope"]})
    assert [tool["name"] for tool in result["tools"]] == ["git_log"]
    assert "nope" in result["error"]
    assert toolbox.activated == ["git_log"]
    # Sent deferred, and loaded by a tool_reference in this result (TD-11).
    assert toolbox.schemas()[-1] == {**result["tools"][0], "defer_loading": True}
    assert result["_loads_tools"] == ["git_log"]


@pytest.mark.req("TD-7")
def test_search_tool_bm25_ranks_the_same_index_but_only_describes(tmp_path):
    records = _records()
    toolbox = _toolbox(tmp_path, records)
    loaded = toolbox.execute("search_tools", {"query": "open a pull request"})
    described = search_tool_bm25(ToolIndex(records), "open a pull request")
    assert [m["name"] for m in described["matches"]] == [m["name"] for m in loaded["matches"]]
    assert all(set(m) == {"name", "group", "description"} for m in described["matches"])
    assert search_tool_bm25(ToolIndex(records), "zzqx")["message"].startswith("No tool on this run's surface")


@pytest.mark.req("TD-8")
@pytest.mark.req("TD-11")
def test_a_mode_change_after_an_activation_drops_the_references_to_the_tools_it_denies(tmp_path):
    # Turn 1 loads assign_ticket by search; the conversation then switches to a mode that
    # denies it. The next request must not reference a tool it no longer carries (the API
    # refuses that), and the denied tool stays unreachable (TD-8).
    first = _toolbox(tmp_path, _records())
    provider = EmulatorProvider(Emulator(clock=TestClock(), policy=ScriptedPolicy([
        tool_call("t1", "search_tools", {"query": "assign a ticket to someone"}), "found it",
        tool_call("t2", "assign_ticket", {"ticket_id": "T-1", "assignee": "ana"}), "could not",
    ])))  # fmt: skip
    history = [*HISTORY]
    outcome = run_turn(provider=provider, model="claude-sonnet-4-5", system=[text_block("sys")], history=history,
                       toolbox=first, emit=lambda *_: None)  # fmt: skip
    history += [*outcome.messages, {"role": "user", "content": [text_block("assign it")]}]
    assert "assign_ticket" in referenced_tools(history)

    denying = _toolbox(tmp_path, _records(), mode=ModeSpec(name="no-tickets", deny=("assign_ticket",)))
    events = []
    outcome = run_turn(provider=provider, model="claude-sonnet-4-5", system=[text_block("sys")], history=history,
                       toolbox=denying, emit=lambda kind, payload: events.append((kind, payload)))  # fmt: skip
    assert outcome.messages[-1]["content"][0]["text"] == "could not"
    refused = [payload["output"] for kind, payload in events if kind == "tool_result"]
    assert refused and refused[0]["ok"] is False and "assign_ticket" in refused[0]["error"]
    assert "assign_ticket" not in [tool["name"] for tool in denying.schemas()]


@pytest.mark.req("LM-2")
@pytest.mark.req("TD-11")
def test_loaded_tools_count_against_the_budget_and_the_least_recently_used_is_unloaded_once(tmp_path):
    # Three turns load list_dir and git_status, call list_dir, then load list_tables into a budget
    # that holds two of them: git_status (loaded, never called) goes back to the name index; the
    # next turn starts with what that turn ended with, so the unload rewrites the prefix once.
    records = _records()
    sizes = {record.name: estimate_json_tokens(record.definition()) for record in records}
    budget = sizes["list_dir"] + sizes["list_tables"]
    assert sizes["list_dir"] + sizes["git_status"] <= budget
    assert budget < sizes["list_dir"] + sizes["git_status"] + sizes["list_tables"]
    model = Recording(
        tool_call("t1", "describe_tool", {"names": ["list_dir", "git_status"]}), "described",
        tool_call("t2", "list_dir", {"path": "."}), "listed",
        tool_call("t3", "describe_tool", {"names": ["list_tables"]}), "described too",
        "nothing new",
    )  # fmt: skip
    history: list[dict] = []
    toolboxes, events = [], []
    for prompt in ("load them", "list the workspace", "load the table tool", "thanks"):
        toolbox = _toolbox(tmp_path, records)
        toolbox.loaded_budget = budget
        toolboxes.append(toolbox)
        history.append({"role": "user", "content": [text_block(prompt)]})
        outcome = run_turn(provider=model, model="claude-sonnet-4-5", system=[text_block("sys")], history=history,
                           toolbox=toolbox, emit=lambda kind, payload: events.append((kind, payload)))  # fmt: skip
        history += outcome.messages
    for request in model.requests:
        loaded = [tool["name"] for tool in request.tools if tool.get("defer_loading")]
        # The emulator refuses a reference to a tool the request does not carry; and the loaded fit the budget.
        assert set(referenced_tools(request.messages)) <= {tool["name"] for tool in request.tools}
        assert sum(sizes[name] for name in loaded) <= budget, loaded
    assert toolboxes[2].unloaded == ["git_status"] and toolboxes[2].activated == ["list_dir", "list_tables"]
    assert [payload["tools"] for kind, payload in events if kind == "tools_unloaded"] == [["git_status"]]
    # The fourth turn restores list_dir and list_tables (by recency within the budget), not git_status,
    # and sends the same tools and, up to the third turn's end, the same messages: no second rewrite.
    assert toolboxes[3].activated == ["list_dir", "list_tables"]
    third_last, fourth_first = model.requests[5], model.requests[6]
    assert fourth_first.tools == third_last.tools
    assert fourth_first.messages[: len(third_last.messages)] == third_last.messages
    assert "git_status" not in referenced_tools(fourth_first.messages)


@pytest.mark.req("LM-2")
def test_a_search_loads_its_best_matches_that_fit_and_names_the_rest_and_called_tools_unload_last(tmp_path):
    records = _records()
    toolbox = _toolbox(tmp_path, records)
    ranked = [m["name"] for m in toolbox.execute("search_tools", {"query": "assign a ticket to someone"})["matches"]]
    deferred = [name for name in ranked if name in toolbox.surface.deferred_names]
    assert len(deferred) >= 3
    tight = _toolbox(tmp_path, records)
    first, second, third = deferred[:3]
    # Room for the best two together, and for the best with the third, never for all three.
    tight.loaded_budget = max(tight.loaded_tokens([first, second]), tight.loaded_tokens([first, third]))
    result = tight.execute("search_tools", {"query": "assign a ticket to someone"})
    assert result["loaded"] == [first, second] and result["not_loaded"] == deferred[2:]
    assert "call one by name to load it" in result["message"]
    # A tool only loaded unloads before one that was called, even when the called one was used longer ago.
    later = _toolbox(tmp_path, records)
    later.loaded_budget = tight.loaded_budget
    later.execute("describe_tool", {"names": [first]})
    later.execute(first, {})  # a call, even one refused for its arguments, is a use
    later.execute("describe_tool", {"names": [second]})  # loaded after that call, never called
    later.execute("describe_tool", {"names": [third]})
    assert later.activated == [first, third] and later.unloaded == [second]
