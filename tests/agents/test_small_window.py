"""Small windows (LM-2): with an 8K window the tool surface and every threshold scale to it."""

from __future__ import annotations

import copy
import json

import pytest

from agents.chat import message_send
from agents.lifecycle import run_execute
from agents.models import Run, RunEvent
from agents.turns import turn_toolboxes
from conversations.models import Compaction
from conversations.services import conversation_create
from engine.catalog.fit import KEEP_RESIDENT, fit_to_window, resident_tokens, tool_block_tokens
from engine.catalog.surface import ModeSpec, build_surface
from engine.context.snapshots import page_for_window
from engine.emulator import Emulator
from engine.emulator.server import EmulatorServer
from engine.request import referenced_tools
from engine.tokens import estimate_json_tokens, estimate_text_tokens
from engine.window import budget_for_window
from tests.support.catalog import CATALOG_PATH, reference_records
from toolcatalog.selectors import run_surface
from toolcatalog.services import catalog_import
from toolcatalog.workspace import workspace_root


@pytest.mark.req("LM-2")
def test_a_200k_window_keeps_the_defaults_and_an_8k_one_scales_every_threshold():
    large, small = budget_for_window(200_000), budget_for_window(8192)
    assert (large.prune_min_tokens, large.compact_tail_tokens, large.scratchpad_threshold_bytes) == (20_000, 8000, 4096)
    assert (large.summary_chars, large.max_output_tokens, large.page_pixels) == (500, 4096, 1072)
    assert small.tool_tokens == 2048
    # Each a small share of 8K: what a 200K window used as a threshold would be most of this one.
    assert small.prune_min_tokens <= 820 and small.compact_tail_tokens <= 2048
    assert small.scratchpad_threshold_bytes <= 8192 * 4 // 20 and small.summary_chars <= 330
    assert small.max_output_tokens == 2048
    page = page_for_window(small.page_pixels)
    assert page.width * page.height / 750 <= 0.05 * 8192 and page.rows >= 20


@pytest.mark.req("LM-2")
def test_the_resident_block_is_trimmed_to_a_quarter_of_the_window_least_used_first():
    surface = build_surface(reference_records(), ModeSpec(output_action="final_answer"), deferral=True)
    assert resident_tokens(surface.resident) > 2048  # the reference catalog's resident set: half of 8K
    used = {"read_file": 40, "search_files": 12}
    fitted = fit_to_window(surface, budget_tokens=2048, uses=used)
    names = {tool.name for tool in fitted.resident}
    assert resident_tokens(fitted.resident) <= 2048
    assert KEEP_RESIDENT & {tool.name for tool in surface.resident} <= names
    assert {"read_file", "search_files"} <= names
    moved = {tool.name for tool in surface.resident} - names
    assert moved and all(name in fitted.index_text for name in moved)
    # Nothing is lost: every admitted tool is resident or deferred, once.
    everything = [tool.name for tool in (*fitted.resident, *fitted.deferred)]
    assert sorted(everything) == sorted(tool.name for tool in (*surface.resident, *surface.deferred))
    # A window that holds the whole block changes nothing.
    assert fit_to_window(surface, budget_tokens=50_000) is surface


@pytest.mark.django_db
@pytest.mark.req("LM-2")
def test_a_run_surface_and_the_context_view_follow_the_window(settings, alice, alice_api, client):
    catalog_import(text=CATALOG_PATH.read_text(encoding="utf-8"))
    settings.CC_CONTEXT_WINDOW_TOKENS = 8192
    conversation = conversation_create(owner=alice, title="small")
    _, run = message_send(conversation=conversation, text="hello")
    # What runs called most recently is what stays resident.
    RunEvent.objects.bulk_create(
        RunEvent(run=run, seq=100 + i, type="tool_call", payload={"name": "glob"}) for i in range(5)
    )
    catalog, toolbox = turn_toolboxes(run_id=run.pk, conversation_id=conversation.pk, owner_id=alice.pk)
    surface = catalog.surface
    runtime = [schema for schema in toolbox.schemas() if schema["name"] not in surface.admitted]
    # Everything every request carries: resident schemas, the name index, the runtime's own tools.
    carried = tool_block_tokens(surface.resident, surface.deferred) + estimate_json_tokens(runtime)
    assert carried <= 8192 // 4
    assert "glob" in {tool.name for tool in surface.resident}
    assert "glob" not in {tool.name for tool in run_surface()[0].deferred}  # resident by the catalog, too
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    view = alice_api.get(f"/api/conversations/{conversation.pk}/context/").json()
    assert view["window_tokens"] == 8192
    assert view["budget"]["tool_percent"] <= 25 and view["budget"]["tool_budget_tokens"] == 2048
    assert view["tools"]["resident_tokens"] <= 2048
    client.force_login(alice)
    html = client.get(f"/conversations/{conversation.pk}/context/").content.decode()
    budget = html[html.index('id="window-budget"') :].split("</p>")[0]
    assert "resident tools" in budget and f"{view['budget']['tool_percent']} %" in budget


WINDOW = 8192
MODEL = "claude-sonnet-4-5"


def _opening(messages: list[dict]) -> int:
    """The message that opened the current turn: the last user message that is not only tool results."""
    return max(
        i
        for i, m in enumerate(messages)
        if m["role"] == "user" and not any(b.get("type") == "tool_result" for b in m["content"])
    )


class Reader:
    """Every turn reads two stretches of the notes, searches the catalog (which loads tools mid-turn), answers.

    Turn N (its prompt ends "step N.") searches `queries[N % len(queries)]`."""

    def __init__(self, queries: tuple[str, ...] = ("show the commit history",)) -> None:
        self.payloads: list[dict] = []
        self.queries = queries

    def __call__(self, payload: dict) -> list[dict]:
        self.payloads.append(copy.deepcopy(payload))
        opening = _opening(payload["messages"])
        step = len(payload["messages"]) - 1 - opening
        if step == 0:
            reads = [{"path": "notes.txt", "offset": offset, "limit": 28} for offset in (0, 60)]
            return [{"type": "tool_use", "name": "read_file", "input": arguments} for arguments in reads]
        if step == 2:
            turn = int(payload["messages"][opening]["content"][0]["text"].rsplit("step ", 1)[1].rstrip("."))
            query = self.queries[turn % len(self.queries)]
            return [{"type": "tool_use", "name": "search_tools", "input": {"query": query}}]
        return [{"type": "text", "text": "The notes say the queue is healthy; the tools I searched for are loaded."}]


@pytest.fixture
def window_8k(settings, tmp_path, request):
    """A worker's settings at an 8K window (every threshold scaled as settings.py scales it), the
    Anthropic adapter pointed at an emulator that refuses what does not fit the same window.
    Indirect parameter: the Reader's search queries."""
    reader = Reader(*([request.param] if hasattr(request, "param") else []))
    budget = budget_for_window(WINDOW)
    settings.CC_CONTEXT_WINDOW_TOKENS = WINDOW
    settings.CC_MAX_OUTPUT_TOKENS = budget.max_output_tokens
    settings.CC_COMPACT_AT_PERCENT = budget.compact_at_percent
    settings.CC_COMPACT_TO_PERCENT = budget.compact_to_percent
    settings.CC_COMPACT_TAIL_TOKENS = budget.compact_tail_tokens
    settings.CC_PRUNE_MIN_TOKENS = budget.prune_min_tokens
    settings.SCRATCHPAD_THRESHOLD_BYTES = budget.scratchpad_threshold_bytes
    settings.SCRATCHPAD_SUMMARY_CHARS = budget.summary_chars
    settings.CC_SNAPSHOT_PAGE_PIXELS = budget.page_pixels
    settings.CC_WORKSPACE_ROOT = tmp_path
    settings.CC_MODEL, settings.CC_MODELS = MODEL, {MODEL: "anthropic"}
    emulator = Emulator(policy=reader, context_window=WINDOW)
    with EmulatorServer(emulator) as server:
        settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "test-key", server.base_url
        yield emulator, reader


@pytest.mark.django_db
@pytest.mark.req("LM-2")
def test_every_request_of_a_growing_session_fits_an_8k_window_with_room_for_the_reply(alice, window_8k):
    # Tool results and tools loaded during a turn grow its later requests past what the turn-start
    # check saw: before the check ran before every request, the fourth turn's requests passed the window.
    emulator, reader = window_8k
    catalog_import(text=CATALOG_PATH.read_text(encoding="utf-8"))
    conversation = conversation_create(owner=alice, title="small window")
    notes = workspace_root(conversation.pk) / "notes.txt"
    notes.parent.mkdir(parents=True, exist_ok=True)
    notes.write_text("".join(f"note {n}: the service handled its queue in {n % 17} ms, healthy\n" for n in range(99)))
    for turn in range(6):
        conversation.refresh_from_db()
        _, run = message_send(conversation=conversation, text=f"Check the notes, step {turn}.")
        run_execute(run_id=run.pk, worker="test")
        run.refresh_from_db()
        assert run.status == Run.Status.SUCCEEDED, (turn, run.error)
    uses = [(emulator.prompt_tokens(p) + p["max_tokens"]) / WINDOW for p in reader.payloads]
    assert len(uses) == 6 * 3 and max(uses) <= 1.0, uses
    compactions = Compaction.objects.filter(conversation=conversation)
    assert compactions.exists() and not compactions.filter(trigger="reactive").exists()
    assert not RunEvent.objects.filter(run__conversation=conversation, type="compaction", payload__trigger="reactive")


SEARCHES = ("show the commit history", "run a SQL query", "assign a ticket", "schedule a calendar event")


@pytest.mark.django_db
@pytest.mark.req("LM-2")
@pytest.mark.parametrize("window_8k", [SEARCHES], indirect=True)
def test_tools_loaded_turn_after_turn_keep_the_tool_block_within_a_quarter_of_the_window(alice, window_8k):
    # Every turn searches for other tools: loaded ones count against the same 25 % as the resident
    # block, so the least recently used go back to the name index (before, the share reached 0.38).
    emulator, reader = window_8k
    catalog_import(text=CATALOG_PATH.read_text(encoding="utf-8"))
    conversation = conversation_create(owner=alice, title="small window, many tools")
    notes = workspace_root(conversation.pk) / "notes.txt"
    notes.parent.mkdir(parents=True, exist_ok=True)
    notes.write_text("".join(f"note {n}: the service handled its queue in {n % 17} ms, healthy\n" for n in range(99)))
    runs = []
    for turn in range(len(SEARCHES) * 2):
        conversation.refresh_from_db()
        _, run = message_send(conversation=conversation, text=f"Check the notes, step {turn}.")
        run_execute(run_id=run.pk, worker="test")
        run.refresh_from_db()
        assert run.status == Run.Status.SUCCEEDED, (turn, run.error)
        runs.append(run)

    def tool_share(payload: dict) -> float:
        loaded = set(referenced_tools(payload["messages"]))
        schemas = [{k: v for k, v in t.items() if k not in ("cache_control", "defer_loading")}
                   for t in payload["tools"] if not t.get("defer_loading") or t["name"] in loaded]  # fmt: skip
        index = sum(estimate_text_tokens(b["text"]) for b in payload["system"] if b["text"].startswith("Deferred"))
        return (estimate_json_tokens(schemas) + index) / WINDOW

    shares = [tool_share(payload) for payload in reader.payloads]
    assert max(shares) <= 0.25, shares
    results = [
        json.loads(block["content"][0]["text"])
        for payload in reader.payloads
        for block in payload["messages"][-1]["content"]
        if block.get("type") == "tool_result" and isinstance(block["content"], list)
    ]
    searches = [result for result in results if "query" in result]
    assert searches and all(result.get("loaded") for result in searches), [
        (r["query"], r.get("loaded"), r.get("not_loaded"), [m["name"] for m in r["matches"]]) for r in searches
    ]
    unloaded = RunEvent.objects.filter(run__in=runs, type="tools_unloaded")
    assert unloaded.exists()
    uses = [(emulator.prompt_tokens(p) + p["max_tokens"]) / WINDOW for p in reader.payloads]
    assert max(uses) <= 1.0, uses
