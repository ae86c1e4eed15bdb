"""A real Celery worker on the real PostgreSQL and Redis runs turns; a Channels client sees them live."""

from __future__ import annotations

import threading
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from agents.lifecycle import run_execute
from agents.models import ModelRequest, Run, RunEvent
from controlcenter.routing import websocket_urlpatterns
from conversations.models import Conversation, Message
from tests.support.waiting import run_finished

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _wait_for_run(run_id: int, timeout: float = 20) -> Run:
    return run_finished(run_id, timeout)


async def _send_and_watch(api, user, conversation_id: int, text: str) -> tuple[dict, list[dict]]:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/conversations/{conversation_id}/")
    communicator.scope["user"] = user
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    response = await sync_to_async(api.post)(
        f"/api/conversations/{conversation_id}/messages/", {"text": text}, format="json"
    )
    assert response.status_code == 201, response.content
    events = []
    while True:
        event = await communicator.receive_json_from(timeout=20)
        if event["type"] == "conversation_changed":
            continue  # the tabs' cue to redraw (UX-4), not one of the run's events
        events.append(event)
        if event["type"] == "run_finished":
            break
    await communicator.disconnect(timeout=10)
    return response.json(), events


@pytest.mark.req("RN-1")
def test_posted_message_gets_a_persisted_reply_from_a_real_worker_and_live_events_in_order(
    celery_worker_process, alice, alice_api
):
    conversation = Conversation.objects.create(owner=alice, title="live")
    sent, events = async_to_sync(_send_and_watch)(alice_api, alice, conversation.pk, "hello there")

    run = Run.objects.get(pk=sent["run"]["id"])
    assert run.status == Run.Status.SUCCEEDED
    assert run.worker.startswith("test-")  # the real worker process ran it, not this process
    types = [event["type"] for event in events]
    assert types[0] == "run_started"
    assert types[-1] == "run_finished"
    assert "text_delta" in types and "usage" in types
    assert types.index("usage") > max(i for i, t in enumerate(types) if t == "text_delta")
    assert [event["seq"] for event in events] == list(range(1, len(events) + 1))
    streamed = "".join(event["payload"]["text"] for event in events if event["type"] == "text_delta")

    conversation.refresh_from_db()
    reply = conversation.tip
    assert reply.role == Message.Role.ASSISTANT
    assert reply.parent_id == sent["message"]["id"]
    assert reply.content == [{"type": "text", "text": streamed}]
    assert "offline model" in streamed
    usage = ModelRequest.objects.get(run=run)
    # The runtime's breakpoints turn the prompt into cache writes (RN-2): count every prompt token.
    assert usage.prompt_tokens > 0 and usage.output_tokens > 0
    # The stored event log is what a late client catches up from.
    assert list(RunEvent.objects.filter(run=run).values_list("type", flat=True)) == types


@pytest.mark.req("RN-5")
def test_tool_call_turn_runs_the_builtin_tool_in_the_workspace_and_persists_the_whole_turn(
    celery_worker_process, alice, alice_api
):
    conversation = Conversation.objects.create(owner=alice, title="tools")
    sent, events = async_to_sync(_send_and_watch)(alice_api, alice, conversation.pk, "list the files please")

    types = [event["type"] for event in events]
    assert types.index("tool_call") < types.index("tool_result") < len(types) - 1
    result = next(event for event in events if event["type"] == "tool_result")
    assert result["payload"]["name"] == "list_dir"
    assert result["payload"]["output"]["ok"] is True
    path = list(Message.objects.filter(conversation=conversation).order_by("id"))
    assert [m.role for m in path] == ["user", "assistant", "user", "assistant"]
    assert path[1].content[-1]["type"] == "tool_use"
    assert path[2].content[0]["type"] == "tool_result"
    assert path[2].content[0]["tool_use_id"] == path[1].content[-1]["id"]
    assert ModelRequest.objects.filter(run_id=sent["run"]["id"]).count() == 2


def test_two_workers_racing_for_one_run_exactly_one_runs_it(alice):
    conversation = Conversation.objects.create(owner=alice, title="race")
    trigger = Message.objects.create(conversation=conversation, role="user", content=[{"type": "text", "text": "hi"}])
    conversation.tip = trigger
    conversation.save()
    run = Run.objects.create(conversation=conversation, trigger=trigger, provider="offline", model="offline-1")
    barrier = threading.Barrier(2)

    def worker(name: str) -> None:
        from django.db import connection

        barrier.wait()
        try:
            run_execute(run_id=run.pk, worker=name)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(f"racer-{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    assert RunEvent.objects.filter(run=run, type="run_started").count() == 1
    assert Message.objects.filter(conversation=conversation, role="assistant").count() == 1


def test_the_same_run_enqueued_twice_to_a_real_worker_is_run_once(celery_worker_process, alice):
    from agents.tasks import run_turn

    conversation = Conversation.objects.create(owner=alice, title="twice")
    trigger = Message.objects.create(conversation=conversation, role="user", content=[{"type": "text", "text": "hi"}])
    conversation.tip = trigger
    conversation.save()
    run = Run.objects.create(conversation=conversation, trigger=trigger, provider="offline", model="offline-1")
    run_turn.delay(run.pk)
    run_turn.delay(run.pk)
    _wait_for_run(run.pk)
    time.sleep(0.5)  # give the second delivery time to be (not) processed
    assert RunEvent.objects.filter(run=run, type="run_started").count() == 1
    assert Message.objects.filter(conversation=conversation, role="assistant").count() == 1


def test_healthz_reports_database_redis_and_the_live_worker(celery_worker_process, admin_client):
    deadline = time.monotonic() + 10
    while True:
        response = admin_client.get("/healthz")  # staff see the details (SB-5)
        body = response.json()
        if response.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert response.status_code == 200, body
    assert body["checks"]["database"]["ok"] and body["checks"]["redis"]["ok"]
    assert any(name.startswith("test-") for name in body["checks"]["workers"]["live"])


def test_websocket_refuses_anonymous_and_other_users(alice, bob):
    conversation = Conversation.objects.create(owner=alice, title="private")

    async def attempt(user) -> bool:
        communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/conversations/{conversation.pk}/")
        if user is not None:
            communicator.scope["user"] = user
        connected, _ = await communicator.connect(timeout=10)
        await communicator.disconnect(timeout=10)
        return connected

    from django.contrib.auth.models import AnonymousUser

    assert async_to_sync(attempt)(AnonymousUser()) is False
    assert async_to_sync(attempt)(bob) is False
    assert async_to_sync(attempt)(alice) is True
