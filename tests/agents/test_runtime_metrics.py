"""Usage per request and the cache ratio per run, conversation, model and day (RN-2)."""

from __future__ import annotations

import datetime as dt

import pytest

from agents.lifecycle import run_execute
from agents.models import ModelRequest, Run, RunEvent
from conversations.models import Conversation, Message
from engine.emulator import Emulator, ScriptedPolicy
from engine.emulator.server import EmulatorServer
from engine.providers.inprocess import EmulatorProvider
from engine.providers.protocol import InvalidRequest

MODEL = "claude-sonnet-4-5"


def make_run(owner, model: str = MODEL, provider: str = "anthropic", title: str = "usage") -> Run:
    conversation = Conversation.objects.create(owner=owner, title=title)
    trigger = Message.objects.create(conversation=conversation, role="user", content=[{"type": "text", "text": "hi"}])
    conversation.tip = trigger
    conversation.save()
    return Run.objects.create(conversation=conversation, trigger=trigger, provider=provider, model=model)


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("RN-2")
def test_a_run_records_the_ttl_split_of_cache_writes_the_breakpoints_and_the_providers_request_id(
    settings, tmp_path, alice
):
    listing = {"type": "tool_use", "name": "list_dir", "input": {"path": "."}}
    with EmulatorServer(Emulator(policy=ScriptedPolicy([[listing], "Nothing there."]), min_cache_tokens=100)) as server:
        settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "test-key", server.base_url
        settings.CC_WORKSPACE_ROOT = tmp_path
        run = make_run(alice)
        run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    first, second = ModelRequest.objects.filter(run=run).order_by("step")
    assert first.breakpoints == ["tools", "system", "current_turn"]
    assert second.breakpoints == ["tools", "system", "previous_turn", "current_turn"]
    # Tools + system are written once with the 1h TTL, the history with 5m; the two add up.
    assert first.cache_creation_1h_input_tokens > 0 and first.cache_creation_5m_input_tokens > 0
    assert first.cache_creation_1h_input_tokens + first.cache_creation_5m_input_tokens == (
        first.cache_creation_input_tokens
    )
    assert second.cache_read_input_tokens == first.prompt_tokens
    assert first.request_id.startswith("msg_emu_") and first.request_id != second.request_id


class _RefusesTheSecondRequest:
    """The API answers the first request and refuses the second (a 400 no retry cures)."""

    name = "anthropic"

    def __init__(self, reply: list[dict]) -> None:
        self.first = EmulatorProvider(Emulator(policy=ScriptedPolicy([reply]), min_cache_tokens=100))
        self.requests = 0

    def stream(self, request):
        self.requests += 1
        if self.requests > 1:
            raise InvalidRequest("HTTP 400: messages.2: the request was refused")
        yield from self.first.stream(request)


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("RN-2")
def test_a_request_is_recorded_when_its_reply_comes_in_so_a_turn_that_fails_later_keeps_what_it_spent(
    settings, tmp_path, alice, alice_api, monkeypatch
):
    from agents import lifecycle

    settings.CC_WORKSPACE_ROOT, settings.ANTHROPIC_API_KEY = tmp_path, "test-key"  # the summarizer's, never called
    provider = _RefusesTheSecondRequest([{"type": "tool_use", "name": "list_dir", "input": {"path": "."}}])
    monkeypatch.setattr(lifecycle, "get_provider", lambda name: provider)
    run = make_run(alice)
    run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED and "refused" in run.error
    assert provider.requests == 2
    [spent] = ModelRequest.objects.filter(run=run)
    assert spent.step == 1 and spent.stop_reason == "tool_use"
    assert spent.prompt_tokens > 0 and spent.output_tokens > 0
    [row] = alice_api.get(f"/api/metrics/cache/?group=run&run={run.pk}").json()
    assert row["requests"] == 1 and row["prompt_tokens"] == spent.prompt_tokens  # what the failed turn cost


def add_usage(
    run: Run,
    *,
    step: int,
    uncached: int,
    written: int,
    read: int,
    day: dt.date | None = None,
    cache_reported: bool = True,
):
    row = ModelRequest.objects.create(
        run=run,
        step=step,
        model=run.model,
        input_tokens=uncached,
        cache_creation_input_tokens=written,
        cache_read_input_tokens=read,
        output_tokens=10,
        cache_reported=cache_reported,
    )
    if day is not None:
        ModelRequest.objects.filter(pk=row.pk).update(created_at=dt.datetime.combine(day, dt.time(12), dt.UTC))
    return row


@pytest.mark.django_db
@pytest.mark.req("RN-2")
def test_cache_metrics_aggregate_reads_over_all_prompt_tokens_per_run_conversation_model_and_day(alice, bob, alice_api):
    one = make_run(alice, model="model-a", title="one")
    two = make_run(alice, model="model-b", title="two")
    theirs = make_run(bob, model="model-a", title="bob's")
    add_usage(one, step=1, uncached=100, written=900, read=0, day=dt.date(2026, 12, 1))
    add_usage(one, step=2, uncached=50, written=50, read=900, day=dt.date(2026, 12, 2))
    add_usage(two, step=1, uncached=200, written=0, read=800, day=dt.date(2026, 12, 2))
    add_usage(theirs, step=1, uncached=1000, written=0, read=0, day=dt.date(2026, 12, 2))

    by_run = {row["key"]: row for row in alice_api.get("/api/metrics/cache/?group=run").json()}
    assert set(by_run) == {str(one.pk), str(two.pk)}  # bob's usage is not alice's
    assert by_run[str(one.pk)]["cache_ratio"] == 0.45  # 900 / 2000
    assert by_run[str(one.pk)]["prompt_tokens"] == 2000 and by_run[str(one.pk)]["requests"] == 2
    by_model = {row["key"]: row["cache_ratio"] for row in alice_api.get("/api/metrics/cache/?group=model").json()}
    assert by_model == {"model-a": 0.45, "model-b": 0.8}
    by_conversation = alice_api.get("/api/metrics/cache/?group=conversation").json()
    # In id order, as numbers: conversation 9 before conversation 10.
    assert [row["key"] for row in by_conversation] == [
        str(pk) for pk in sorted([one.conversation_id, two.conversation_id])
    ]
    by_day = {row["key"]: row["cache_ratio"] for row in alice_api.get("/api/metrics/cache/?group=day").json()}
    assert by_day == {"2026-12-01": 0.0, "2026-12-02": round(1700 / 2000, 4)}
    only = alice_api.get(f"/api/metrics/cache/?group=model&run={two.pk}").json()
    assert [(r["key"], r["requests"]) for r in only] == [("model-b", 1)]


@pytest.mark.django_db
@pytest.mark.req("RN-2")
@pytest.mark.req("TD-15")
def test_requests_whose_server_reported_no_cache_count_in_token_totals_and_in_no_cache_ratio(
    alice, bob, alice_api, client
):
    hosted = make_run(alice, model="shared-model", title="hosted")
    local = make_run(alice, model="shared-model", provider="local", title="local")
    add_usage(hosted, step=1, uncached=100, written=0, read=300)
    # llama.cpp's server: its 1,000 prompt tokens are known, what it cached is not.
    add_usage(local, step=1, uncached=1000, written=0, read=0, cache_reported=False)

    by_model = {row["key"]: row for row in alice_api.get("/api/metrics/cache/?group=model").json()}
    assert by_model["shared-model"]["prompt_tokens"] == 1400
    assert by_model["shared-model"]["cache_ratio"] == 0.75  # 300 / 400, not 300 / 1400
    by_run = {row["key"]: row["cache_ratio"] for row in alice_api.get("/api/metrics/cache/?group=run").json()}
    assert by_run == {str(hosted.pk): 0.75, str(local.pk): None}
    (served,) = alice_api.get(f"/api/runs/{local.pk}/").json()["model_requests"]
    assert served["cache_reported"] is False

    client.force_login(alice)
    snapshot = client.get("/dashboard/data/").json()
    assert snapshot["totals"]["prompt"] == 1400 and snapshot["totals"]["cache_ratio"] == 0.75
    assert snapshot["totals"]["ratio_prompt"] == 400  # the base the page names beside the ratio
    assert "the ratio is over the 400 whose server reports its cache" in client.get("/dashboard/").content.decode()
    by_conversation = {row["title"]: row["cache_ratio"] for row in snapshot["by_conversation"]}
    assert by_conversation == {"hosted": 0.75, "local": None}
    assert {row["id"]: row["cache_ratio"] for row in snapshot["recent_runs"]} == {hosted.pk: 0.75, local.pk: None}

    page = client.get(f"/conversations/{local.conversation_id}/").content.decode()
    assert "cache not reported" in page and "0.0% from cache" not in page
    assert "cache read" not in page and "0 read" not in page  # unknown, never shown as 0
    assert "75.0% from cache" in client.get(f"/conversations/{hosted.conversation_id}/").content.decode()
    run_page = client.get(f"/runs/{local.pk}/").content.decode()
    assert "not reported" in run_page and "0.0%" not in run_page
    assert "verdict-unreported" in run_page and "verdict-miss" not in run_page
    RunEvent.objects.create(
        run=local,
        seq=1,
        type="usage",
        payload={"step": 1, "input_tokens": 1000, "output_tokens": 10, "cache_reported": False},
    )
    assert "step 1: 1000 input, 10 output (the server reports no cache figures)" in (
        client.get(f"/runs/{local.pk}/").content.decode()
    )

    local_only = make_run(bob, title="bob's local", provider="local")
    add_usage(local_only, step=1, uncached=500, written=0, read=0, cache_reported=False)
    client.force_login(bob)
    theirs = client.get("/dashboard/data/").json()
    assert theirs["totals"]["cache_ratio"] is None
    assert theirs["savings"]["cache"] == {"cache_read": None, "saved_tokens": None}


@pytest.mark.django_db
@pytest.mark.req("RN-2")
def test_cache_metrics_reject_an_unknown_grouping_with_a_clear_error(alice_api):
    response = alice_api.get("/api/metrics/cache/?group=week")
    assert response.status_code == 400
    assert "week" in str(response.json())
    assert alice_api.get("/api/metrics/cache/?run=abc").status_code == 400


@pytest.mark.django_db
@pytest.mark.req("RN-2", "UX-6")
def test_deleting_a_conversation_keeps_what_it_spent_in_the_owners_figures(alice, alice_api):
    from agents.dashboard import usage_totals

    kept, deleted = make_run(alice, title="kept"), make_run(alice, title="deleted")
    Run.objects.update(status=Run.Status.SUCCEEDED)  # a conversation is deleted once its runs ended
    add_usage(kept, step=1, uncached=100, written=0, read=900, day=dt.date(2026, 12, 1))
    add_usage(deleted, step=1, uncached=50, written=0, read=450, day=dt.date(2026, 12, 1))
    by = lambda group: {row["key"]: row for row in alice_api.get(f"/api/metrics/cache/?group={group}").json()}  # noqa: E731
    since = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    day_before, totals_before = by("day"), usage_totals(user=alice, since=since)

    assert alice_api.delete(f"/api/conversations/{deleted.conversation_id}/").status_code == 204
    assert not Run.objects.filter(pk=deleted.pk).exists()  # its content is gone ...
    assert by("day") == day_before  # ... what it cost is not: past days do not change
    assert usage_totals(user=alice, since=since)["cache_read"] == totals_before["cache_read"] == 1350
    conversations = by("conversation")
    assert set(conversations) == {str(kept.conversation_id), "deleted"}
    assert conversations["deleted"]["prompt_tokens"] == 500


@pytest.mark.django_db
@pytest.mark.req("CH-12")
def test_a_request_recorded_as_our_estimate_does_not_calibrate_the_next_one(alice):
    from agents.turns import measured_requests

    run = make_run(alice)
    add_usage(run, step=1, uncached=1100, written=0, read=0)
    ModelRequest.objects.filter(run=run).update(estimated_tokens=1000, estimated_parts={"messages": 1000})
    # Cut by a cancel before its usage came: its "measure" is our own count again.
    ModelRequest.objects.create(
        run=run, step=2, model=run.model, input_tokens=1200, usage_source="estimate", cache_reported=False,
        stop_reason="cancelled", estimated_tokens=1200, estimated_parts={"messages": 1200},
    )  # fmt: skip
    [(count, measured)] = measured_requests(conversation_id=run.conversation_id, model=run.model)
    assert (count.total, measured) == (1000, 1100)
