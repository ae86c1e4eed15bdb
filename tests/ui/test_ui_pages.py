"""Run page, dashboard figures and the dashboard's live channel (RN-2, TD-15)."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.test import Client

from agents.chat import conversations_with_activity
from agents.dashboard import dashboard_snapshot
from agents.events import publish_dashboard_update
from agents.lifecycle import run_execute
from agents.models import ModelRequest, Run, RunEvent
from agents.selectors import cache_verdict, run_timeline
from controlcenter.routing import websocket_urlpatterns
from conversations.models import Conversation, Message
from engine.tokens import cache_ratio


def _run(owner, *, title="c", model="m-1", status=Run.Status.SUCCEEDED, usage=()) -> Run:
    conversation = Conversation.objects.create(owner=owner, title=title)
    trigger = Message.objects.create(conversation=conversation, role="user", content=[{"type": "text", "text": "hi"}])
    run = Run.objects.create(conversation=conversation, trigger=trigger, provider="offline", model=model, status=status)
    for step, (uncached, write, read, output, breakpoints) in enumerate(usage, start=1):
        ModelRequest.objects.create(
            run=run,
            step=step,
            model=model,
            input_tokens=uncached,
            cache_creation_input_tokens=write,
            cache_read_input_tokens=read,
            output_tokens=output,
            breakpoints=breakpoints,
            duration_ms=12,
        )
    return run


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.req("TD-15")
def test_cache_ratio_is_reads_over_all_prompt_tokens_and_undefined_without_prompt_tokens():
    assert cache_ratio(uncached=100, cache_write=300, cache_read=600) == 0.6
    assert cache_ratio(uncached=0, cache_write=0, cache_read=0) is None


@pytest.mark.django_db
@pytest.mark.req("RN-2")
def test_run_page_shows_every_request_with_usage_breakpoints_verdict_and_duration(alice):
    run = _run(alice, usage=[(1000, 4000, 0, 50, ["tools", "system"]), (20, 30, 5000, 70, ["tools", "previous_turn"])])
    response = _client(alice).get(f"/runs/{run.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    for figure in ("1,000", "4,000", "5,000", "50", "70", "12 ms"):
        assert figure in html
    assert html.count('class="verdict verdict-miss"') == 1
    assert html.count('class="verdict verdict-hit"') == 1
    assert '<code class="chip">previous_turn</code>' in html
    # run total: 5000 / (1020 + 4030 + 5000)
    assert 'id="run-cache-ratio">49.8%<' in html


@pytest.mark.django_db
@pytest.mark.req("RN-3")
def test_run_page_of_another_users_run_answers_404_like_a_missing_one(alice, bob):
    run = _run(alice, usage=[(1, 0, 0, 1, [])])
    assert _client(bob).get(f"/runs/{run.pk}/").status_code == 404
    assert _client(bob).get("/runs/999999/").status_code == 404
    assert Client().get(f"/runs/{run.pk}/").status_code == 302  # anonymous: to the sign-in page


@pytest.mark.django_db
def test_cache_verdict_tells_hit_from_miss_from_no_breakpoints(alice):
    run = _run(alice)
    make = lambda **kw: ModelRequest(run=run, step=1, model="m", **kw)  # noqa: E731
    assert cache_verdict(make(cache_read_input_tokens=1, breakpoints=["tools"])) == "hit"
    assert cache_verdict(make(cache_creation_input_tokens=9, breakpoints=["tools"])) == "miss"
    assert cache_verdict(make(breakpoints=["tools"])) == "miss"
    assert cache_verdict(make(input_tokens=9)) == "uncached"


@pytest.mark.django_db
def test_run_timeline_folds_consecutive_text_deltas_of_a_step_and_keeps_other_events(alice):
    run = _run(alice)
    events = [
        ("run_started", {"provider": "offline", "model": "m", "worker": "w"}),
        ("text_delta", {"step": 1, "text": "Hello "}),
        ("text_delta", {"step": 1, "text": "world"}),
        ("tool_call", {"step": 1, "id": "t1", "name": "list_dir", "input": {"path": "."}}),
        ("approval_requested", {"approval_id": 7, "tool_use_id": "t1", "name": "list_dir", "input": {}}),
        ("approval_decided", {"approval_id": 7, "decision": "approved"}),
        ("text_delta", {"step": 2, "text": "done"}),
        ("run_finished", {"status": "succeeded", "error": ""}),
    ]
    for seq, (kind, payload) in enumerate(events, start=1):
        RunEvent.objects.create(run=run, seq=seq, type=kind, payload=payload)
    timeline = run_timeline(run=run)
    assert [item["type"] for item in timeline] == [
        "run_started",
        "text_delta",
        "tool_call",
        "approval_requested",
        "approval_decided",
        "text_delta",
        "run_finished",
    ]
    assert timeline[1]["summary"] == "Hello world" and timeline[1]["count"] == 2 and timeline[1]["last_seq"] == 3
    assert timeline[2]["summary"] == 'list_dir({"path": "."})'
    assert timeline[4]["summary"] == "approval 7: approved"


@pytest.mark.django_db
@pytest.mark.req("RN-2")
def test_dashboard_aggregates_only_the_users_own_usage_by_category_model_and_conversation(alice, bob):
    _run(alice, title="first", model="m-1", usage=[(100, 300, 0, 10, ["tools"])])
    _run(alice, title="second", model="m-2", usage=[(100, 0, 900, 20, ["tools"])])
    _run(alice, title="flying", status=Run.Status.RUNNING)
    _run(bob, title="bob's", usage=[(5000, 0, 0, 5, [])])

    snapshot = dashboard_snapshot(user=alice)
    totals = snapshot["totals"]
    assert (totals["uncached"], totals["cache_write"], totals["cache_read"], totals["output"]) == (200, 300, 900, 30)
    assert totals["cache_ratio"] == pytest.approx(900 / 1400)
    assert [c["total"] for c in snapshot["categories"]] == [200, 300, 900, 30]
    assert {row["title"]: row["cache_ratio"] for row in snapshot["by_conversation"]} == {"first": 0.0, "second": 0.9}
    assert [series["model"] for series in snapshot["ratio_over_time"]["series"]] == ["m-1", "m-2"]
    assert snapshot["ratio_over_time"]["series"][1]["points"] == [None, 0.9]
    assert [run["title"] for run in snapshot["in_flight"]] == ["flying"]
    assert "bob's" not in {run["title"] for run in snapshot["recent_runs"]}
    assert {row["model"] for row in snapshot["by_day"]} == {"m-1", "m-2"}


@pytest.mark.django_db
def test_dashboard_without_any_run_shows_no_ratio_rather_than_zero(alice):
    response = _client(alice).get("/dashboard/")
    assert response.status_code == 200
    assert 'id="cache-ratio">—<' in response.content.decode()
    assert _client(alice).get("/dashboard/data/").json()["totals"]["cache_ratio"] is None


async def _dashboard_communicator(user) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), "/ws/dashboard/")
    communicator.scope["user"] = user
    return communicator


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("RN-2")
def test_dashboard_update_reaches_the_owners_dashboard_and_no_one_elses(alice, bob):
    _run(alice, usage=[(100, 0, 300, 10, ["tools"])])

    async def scenario():
        mine, theirs = await _dashboard_communicator(alice), await _dashboard_communicator(bob)
        assert (await mine.connect(timeout=10))[0] and (await theirs.connect(timeout=10))[0]

        await sync_to_async(publish_dashboard_update)(user_id=alice.pk)
        update = await mine.receive_json_from(timeout=15)
        assert await theirs.receive_nothing(timeout=0.3)
        await mine.disconnect(timeout=10)
        await theirs.disconnect(timeout=10)
        return update

    update = async_to_sync(scenario)()
    assert update["type"] == "dashboard_update"
    assert update["snapshot"]["totals"]["cache_ratio"] == 0.75


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("RN-2")
def test_with_no_dashboard_open_a_finished_run_computes_no_figures(alice, django_assert_num_queries):
    # The figures are a dozen aggregate queries, made by the worker in the middle of a run.
    _run(alice, usage=[(100, 0, 300, 10, ["tools"])])
    with django_assert_num_queries(0):
        publish_dashboard_update(user_id=alice.pk)


@pytest.mark.django_db(transaction=True)
def test_dashboard_socket_refuses_anonymous_visitors():
    async def scenario():
        communicator = await _dashboard_communicator(AnonymousUser())
        connected, code = await communicator.connect(timeout=10)
        return connected, code

    assert async_to_sync(scenario)() == (False, 4401)


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("RN-2", "UX-4")
def test_a_finished_run_pushes_fresh_figures_to_the_dashboard(alice):
    conversation = Conversation.objects.create(owner=alice, title="live figures")
    trigger = Message.objects.create(conversation=conversation, role="user", content=[{"type": "text", "text": "hi"}])
    conversation.tip = trigger
    conversation.save()
    run = Run.objects.create(conversation=conversation, trigger=trigger, provider="offline", model="offline-1")

    async def scenario():

        communicator = await _dashboard_communicator(alice)
        assert (await communicator.connect(timeout=10))[0]
        await sync_to_async(run_execute)(run_id=run.pk, worker="test")
        started = await communicator.receive_json_from(timeout=10)
        update = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect(timeout=10)
        return started, update

    started, update = async_to_sync(scenario)()
    # A run in progress shows live too (UX-4): the first update is sent when it starts.
    assert started["snapshot"]["in_flight"][0]["id"] == run.pk
    assert started["snapshot"]["in_flight"][0]["status"] == "running"
    recorded = ModelRequest.objects.get(run=run)
    assert update["snapshot"]["recent_runs"][0]["id"] == run.pk
    assert update["snapshot"]["recent_runs"][0]["status"] == "succeeded"
    assert update["snapshot"]["totals"]["uncached"] == recorded.input_tokens


def _path(conversation, shapes) -> Message:
    parent = None
    for role, content in shapes:
        parent = Message.objects.create(conversation=conversation, parent=parent, role=role, content=content)
    conversation.tip = parent
    conversation.save()
    return parent


@pytest.mark.django_db
def test_conversation_page_shows_a_tool_call_with_its_result_and_folds_the_result_message(alice):
    conversation = Conversation.objects.create(owner=alice, title="tools")
    _path(
        conversation,
        [
            ("user", [{"type": "text", "text": "list please"}]),
            ("assistant", [{"type": "tool_use", "id": "t1", "name": "list_dir", "input": {"path": "."}}]),
            (
                "user",
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": '{"ok": false, "error": "nope"}',
                        "is_error": True,
                    }
                ],
            ),
            ("assistant", [{"type": "text", "text": "It failed."}]),
        ],
    )
    html = _client(alice).get(f"/conversations/{conversation.pk}/").content.decode()
    assert html.count("<article") == 3  # the tool-result message is shown inside the call
    assert '<details class="tool failed">' in html
    assert "{&quot;path&quot;: &quot;.&quot;}" in html and "&quot;error&quot;: &quot;nope&quot;" in html


@pytest.mark.django_db
def test_long_conversation_page_renders_the_latest_messages_and_offers_all(alice):
    conversation = Conversation.objects.create(owner=alice, title="long")
    _path(conversation, [("user", [{"type": "text", "text": f"message {n}"}]) for n in range(230)])
    client = _client(alice)
    html = client.get(f"/conversations/{conversation.pk}/").content.decode()
    assert html.count('<article class="message user') == 200
    assert "Show the 30 earlier messages" in html
    assert "message 229" in html and ">message 29<" not in html
    everything = client.get(f"/conversations/{conversation.pk}/?all=1").content.decode()
    assert everything.count('<article class="message user') == 230 and "earlier message" not in everything


@pytest.mark.django_db
def test_conversation_list_searches_titles_and_own_message_text_only(alice, bob):
    mine = Conversation.objects.create(owner=alice, title="groceries")
    _path(mine, [("user", [{"type": "text", "text": "find the zebra crossing"}])])
    theirs = Conversation.objects.create(owner=bob, title="zebra notes")
    _path(theirs, [("user", [{"type": "text", "text": "zebra"}])])
    client = _client(alice)
    assert "groceries" in client.get("/?q=ZEBRA").content.decode()
    assert "zebra notes" not in client.get("/?q=zebra").content.decode()
    assert "No conversation matches" in client.get("/?q=giraffe").content.decode()


@pytest.mark.django_db
def test_conversation_search_matches_the_words_people_see_not_the_json_they_are_stored_in(alice):
    said = Conversation.objects.create(owner=alice, title="one")
    _path(said, [("user", [{"type": "text", "text": 'He said "quokka" twice, in C:\\temp at 100%_'}])])
    tools = Conversation.objects.create(owner=alice, title="two")
    _path(
        tools,
        [
            ("user", [{"type": "text", "text": "list the files"}]),
            ("assistant", [{"type": "tool_use", "id": "t1", "name": "list_dir", "input": {}}]),
            ("user", [{"type": "tool_result", "tool_use_id": "t1", "content": "secret-result"}]),
        ],
    )

    def found(search: str) -> set[str]:
        return {c.title for c in conversations_with_activity(user=alice, search=search)}

    assert found('said "QUOKKA"') == {"one"}  # JSON stores the quotes escaped
    assert found("C:\\temp") == {"one"}  # and the backslash doubled
    assert found("100%_") == {"one"}  # LIKE's wildcards are plain characters
    assert found("0%x") == set()
    for json_only in ("type", "text", '{"', "tool_use", "t1", "secret-result"):
        assert found(json_only) == set(), json_only  # keys, syntax, ids and tool results are not what a person wrote


@pytest.mark.django_db
@pytest.mark.req("TD-11")
def test_a_result_that_loaded_tools_reads_as_its_text_on_the_page_and_in_the_markdown_export(alice):
    # Such a result is stored as [text, tool_reference...] (deferred loading); people read its text.
    observation = '{"ok": true, "matches": [{"name": "git_log"}]}'
    conversation = Conversation.objects.create(owner=alice, title="loads")
    _path(
        conversation,
        [
            ("user", [{"type": "text", "text": "find git tools"}]),
            ("assistant", [{"type": "tool_use", "id": "t1", "name": "search_tools", "input": {"query": "git"}}]),
            (
                "user",
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [
                            {"type": "text", "text": observation},
                            {"type": "tool_reference", "tool_name": "git_log"},
                        ],
                    }
                ],
            ),
            ("assistant", [{"type": "text", "text": "Found it."}]),
        ],
    )
    client = _client(alice)
    html = client.get(f"/conversations/{conversation.pk}/").content.decode()
    assert "{&quot;ok&quot;: true, &quot;matches&quot;: [{&quot;name&quot;: &quot;git_log&quot;}]}" in html
    assert "tool_reference" not in html
    markdown = client.get(f"/api/conversations/{conversation.pk}/export/markdown/").content.decode()
    assert f"```\n{observation}\n```" in markdown and "tool_reference" not in markdown


@pytest.mark.django_db
def test_favicon_ico_leads_to_the_apps_icon_for_pages_that_link_none():
    from django.contrib.staticfiles import finders
    from django.templatetags.static import static

    response = Client().get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"] == static("cc/favicon.svg")
    assert finders.find("cc/favicon.svg")
