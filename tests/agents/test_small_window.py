"""Small windows (LM-2): with an 8K window the tool surface and every threshold scale to it."""

from __future__ import annotations

import pytest

from agents.chat import message_send
from agents.models import Run, RunEvent
from agents.turns import turn_toolboxes
from conversations.services import conversation_create
from engine.catalog.fit import KEEP_RESIDENT, fit_to_window, resident_tokens, tool_block_tokens
from engine.catalog.surface import ModeSpec, build_surface
from engine.context.snapshots import page_for_window
from engine.tokens import estimate_json_tokens
from engine.window import budget_for_window
from tests.support.catalog import CATALOG_PATH, reference_records
from toolcatalog.selectors import run_surface
from toolcatalog.services import catalog_import


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
    catalog, toolbox = turn_toolboxes(run_id=run.pk, conversation_id=conversation.pk)
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
