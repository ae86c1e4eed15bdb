"""Dashboard savings, activations, misses and compactions; the run page's context sections (TD-15, RN-2)."""

from __future__ import annotations

import pytest
from django.test import Client

from agents.dashboard import dashboard_snapshot
from agents.models import ModelRequest, Run
from conversations.models import Compaction, Conversation, Message
from tests.support.catalog import CATALOG_PATH
from toolcatalog.models import RetrievalMiss, Tool, ToolActivation
from toolcatalog.selectors import run_surface, surface_context
from toolcatalog.services import catalog_import

pytestmark = pytest.mark.django_db


def _run(owner, *, requests=2, cache_read=0) -> Run:
    conversation = Conversation.objects.create(owner=owner, title="obs")
    trigger = Message.objects.create(conversation=conversation, role="user", content=[{"type": "text", "text": "hi"}])
    run = Run.objects.create(
        conversation=conversation, trigger=trigger, provider="offline", model="m", status="succeeded"
    )
    for step in range(1, requests + 1):
        ModelRequest.objects.create(
            run=run, step=step, model="m", input_tokens=100, cache_read_input_tokens=cache_read, output_tokens=5
        )
    return run


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.req("TD-15")
def test_cache_savings_price_reads_at_a_tenth(alice):
    _run(alice, requests=2, cache_read=1000)
    saved = dashboard_snapshot(user=alice)["savings"]["cache"]
    assert saved == {"cache_read": 2000, "saved_tokens": 1800}


@pytest.mark.req("TD-15")
def test_deferral_savings_are_withheld_schemas_times_requests_less_what_each_run_loaded(alice):
    catalog_import(text=CATALOG_PATH.read_text())
    withheld = surface_context(run_surface()[0])["withheld_tokens"]
    _run(alice, requests=3)
    loader = _run(alice, requests=2)
    ToolActivation.objects.create(run=loader, tool_name="git_push", trigger="direct")
    git_push = Tool.objects.get(name="git_push").schema_tokens
    savings = dashboard_snapshot(user=alice)["savings"]["deferral"]
    assert savings["requests"] == 5 and savings["withheld_per_request"] == withheld
    assert savings["saved_tokens"] == 3 * withheld + 2 * (withheld - git_push)


@pytest.mark.req("TD-15")
def test_dashboard_lists_most_activated_tools_misses_and_compactions_by_rung_for_the_owner_only(alice, bob):
    first, second = _run(alice), _run(alice)
    for run in (first, second):
        ToolActivation.objects.create(run=run, tool_name="git_push", trigger="search", query="push my branch")
    ToolActivation.objects.create(run=first, tool_name="jira_create", trigger="direct")
    RetrievalMiss.objects.create(run=second, query="order a pizza")
    for rung, before, after in (("elide", 9000, 4000), ("elide", 5000, 3000), ("snapshot", 50000, 9000)):
        Compaction.objects.create(conversation=first.conversation, rung=rung, tokens_before=before, tokens_after=after)
    theirs = _run(bob)
    ToolActivation.objects.create(run=theirs, tool_name="secret_tool", trigger="direct")
    RetrievalMiss.objects.create(run=theirs, query="bob's query")

    snapshot = dashboard_snapshot(user=alice)
    assert snapshot["top_activations"][0] == {
        "tool_name": "git_push", "activations": 2, "runs": 2, "direct": 0, "search": 2
    }  # fmt: skip
    assert [row["tool_name"] for row in snapshot["top_activations"]] == ["git_push", "jira_create"]
    assert [row["query"] for row in snapshot["retrieval_misses"]] == ["order a pizza"]
    assert snapshot["compactions"] == [
        {"rung": "elide", "passes": 2, "before": 14000, "after": 7000, "freed": 7000},
        {"rung": "snapshot", "passes": 1, "before": 50000, "after": 9000, "freed": 41000},
    ]
    html = _client(alice).get("/dashboard/").content.decode()
    assert "<code>git_push</code>" in html and "order a pizza" in html and "41,000" in html
    assert "secret_tool" not in html and "bob&#x27;s query" not in html
    assert 'id="saved-cache"' in html and 'id="saved-deferral"' in html


@pytest.mark.req("TD-15")
@pytest.mark.req("CH-1")
def test_run_page_shows_its_activations_misses_and_compactions(alice, bob):
    run = _run(alice)
    ToolActivation.objects.create(run=run, tool_name="git_push", trigger="search", query="push my branch")
    ToolActivation.objects.create(run=run, tool_name="jira_create", trigger="direct")
    RetrievalMiss.objects.create(run=run, query="order a pizza")
    Compaction.objects.create(
        conversation=run.conversation,
        rung="snapshot",
        tokens_before=50000,
        tokens_after=9000,
        steps=[{"rung": "elide", "freed": 1000}, {"rung": "snapshot", "freed": 40000}],
        run=run,
    )
    # A /shake in the same conversation while the run was in flight: the conversation's, not the run's.
    Compaction.objects.create(
        conversation=run.conversation,
        rung="drop_images",
        tokens_before=777,
        tokens_after=555,
        steps=[{"rung": "drop_images", "freed": 222}],
        trigger="command",
    )
    html = _client(alice).get(f"/runs/{run.pk}/").content.decode()
    assert "drop_images" not in html
    assert "<tr><td><code>git_push</code></td><td>search</td><td>push my branch</td></tr>" in html
    assert "<tr><td><code>jira_create</code></td><td>direct</td><td>—</td></tr>" in html
    assert "found nothing for “order a pizza”" in html
    assert '<span class="chip">snapshot −40,000</span>' in html
    quiet = _run(alice)
    html = _client(alice).get(f"/runs/{quiet.pk}/").content.decode()
    assert "No deferred tool was loaded." in html and "No search came back empty." in html
    assert "This run's turn did not compact." in html  # the other run's pass is not this run's
    assert _client(bob).get(f"/runs/{run.pk}/").status_code == 404
