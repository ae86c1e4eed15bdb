"""Faults survived by a real stack: Redis restarted, PostgreSQL backends killed, provider errors and cut
streams, and the web process restarted while a client watches (CH-5, RN-1).

Each test runs its own redis-server, web server and Celery worker (controlcenter/stack.py) on the test
database; the machine's shared Redis is never touched.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid

import httpx
import psycopg
import pytest
import websockets
from django.db import connection
from rest_framework.authtoken.models import Token

from agents.models import ModelRequest, Run, RunEvent
from controlcenter.processes import ROOT, services_env
from controlcenter.stack import RedisServer, Stack
from conversations.models import Conversation, Message
from engine.emulator import Emulator, Fault, ScriptedPolicy
from engine.emulator.server import EmulatorServer
from tests.support.db import terminate_backends as _terminate_backends
from tests.support.timing import scaled
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

SLOW_TOOL = "please run `sleep 3; echo done`"


wait_for = wait_until


def finished(run_id: int, timeout: float = 45) -> Run:
    return wait_for(
        lambda: Run.objects.filter(pk=run_id).exclude(status__in=["queued", "running"]).first(), timeout, "the run"
    )


@pytest.fixture
def stack(tmp_path):
    from django.conf import settings

    if settings.CC_MODE != "services":
        pytest.fail("fault tests need DATABASE_URL and REDIS_URL (the README's test command sets them)")
    started = Stack(connection.settings_dict["NAME"], tmp_path)
    yield started
    started.stop()


@pytest.fixture
def api(alice):
    def client(web) -> httpx.Client:
        token = Token.objects.get_or_create(user=alice)[0].key
        return httpx.Client(base_url=web.base_url, headers={"Authorization": f"Token {token}"}, timeout=15)

    return client


def assert_one_clean_turn_per_run(conversation_id: int) -> list[Message]:
    """The stored tree is a single path with no duplicated message, and each run's log is whole."""
    messages = list(Message.objects.filter(conversation_id=conversation_id).order_by("id"))
    for message in messages[1:]:
        siblings = [m for m in messages if m.parent_id == message.parent_id]
        assert len(siblings) == 1, f"message {message.pk} has a duplicated sibling"
    for run in Run.objects.filter(conversation_id=conversation_id):
        seqs = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
        assert seqs == list(range(1, len(seqs) + 1)), f"run {run.pk} lost or repeated events: {seqs}"
        types = list(RunEvent.objects.filter(run=run).values_list("type", flat=True))
        assert types.count("run_started") <= 1 and types.count("run_finished") <= 1, types
    return messages


def settle(run: Run, client: httpx.Client) -> Run:
    """A run that survived the fault, or failed cleanly (retryable) and whose retry completes."""
    if run.status == Run.Status.SUCCEEDED:
        return run
    assert run.status == Run.Status.FAILED and run.retryable, (run.status, run.error)
    retried = client.post(f"/api/runs/{run.pk}/retry/")
    assert retried.status_code == 201, retried.text
    again = finished(retried.json()["id"])
    assert again.status == Run.Status.SUCCEEDED, again.error
    return again


@pytest.mark.req("CH-5")
@pytest.mark.req("RN-1")
def test_redis_restarted_mid_run_the_run_completes_once_and_the_stack_keeps_working(stack, api, alice):
    web = stack.start_web()
    stack.start_worker()
    client = api(web)
    conversation = client.post("/api/conversations/", json={"title": "redis"}).json()
    sent = client.post(f"/api/conversations/{conversation['id']}/messages/", json={"text": SLOW_TOOL}).json()
    run_id = sent["run"]["id"]
    wait_for(lambda: RunEvent.objects.filter(run_id=run_id, type="tool_call").exists(), 30, "the tool call")

    stack.redis.restart(down_seconds=1)  # broker, channel layer and heartbeats all lose everything

    run = settle(finished(run_id), client)
    messages = assert_one_clean_turn_per_run(conversation["id"])
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert "done" in messages[2].content[0]["content"]
    # The restarted Redis carries new work: the next message is answered too.
    nxt = client.post(f"/api/conversations/{conversation['id']}/messages/", json={"text": "hello again"})
    assert nxt.status_code == 201, nxt.text
    assert finished(nxt.json()["run"]["id"]).status == Run.Status.SUCCEEDED
    assert [m.role for m in assert_one_clean_turn_per_run(conversation["id"])][-2:] == ["user", "assistant"]
    assert run.pk == run_id  # survived without a retry (resumed), not merely retried


@pytest.mark.req("CH-5")
def test_postgres_backends_of_the_worker_killed_mid_run_the_run_completes_once(stack, api, alice):
    web = stack.start_web()
    worker = stack.start_worker()
    client = api(web)
    conversation = client.post("/api/conversations/", json={"title": "pg"}).json()
    sent = client.post(f"/api/conversations/{conversation['id']}/messages/", json={"text": SLOW_TOOL}).json()
    run_id = sent["run"]["id"]
    wait_for(lambda: RunEvent.objects.filter(run_id=run_id, type="tool_call").exists(), 30, "the tool call")

    killed = _terminate_backends(stack.app_name("worker", 0))
    assert killed >= 1  # the run's connection (and the heartbeat's)

    run = settle(finished(run_id), client)
    assert run.pk == run_id, "the run should reconnect and resume, not need a retry"
    messages = assert_one_clean_turn_per_run(conversation["id"])
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert ModelRequest.objects.filter(run_id=run_id).count() == 2
    # The worker's heartbeat survived the dropped connection: it is still reported live.
    time.sleep(3.5)  # longer than the heartbeat TTL (3 × 1 s)
    live = client.get("/healthz").json()["checks"]["workers"]["live"]
    assert any(name.startswith(worker.hostname.split("@")[0]) for name in live), live
    # And it keeps working.
    nxt = client.post(f"/api/conversations/{conversation['id']}/messages/", json={"text": "and now?"}).json()
    assert finished(nxt["run"]["id"]).status == Run.Status.SUCCEEDED


ANSWER = (
    "Here is the whole answer, streamed in many small pieces so that a cut in the middle of it "
    "would show any duplicated or missing text at once: alpha, beta, gamma, delta, epsilon."
)


@pytest.mark.req("RN-1")
def test_provider_429_529_and_a_cut_stream_through_a_real_worker_store_the_text_once(tmp_path, api, alice):
    emulator = Emulator(policy=ScriptedPolicy([ANSWER]))
    emulator.inject(Fault("rate_limit", retry_after=1))
    emulator.inject(Fault("overloaded", retry_after=1))
    emulator.inject(Fault("stream_cut", after_chars=37))
    emulator.inject(Fault("stream_overloaded", after_chars=29))
    with EmulatorServer(emulator) as server:
        stack = Stack(
            connection.settings_dict["NAME"],
            tmp_path,
            {
                "CC_PROVIDER": "anthropic",
                "CC_MODEL": "claude-sonnet-4-5",
                "ANTHROPIC_API_KEY": "sk-test-not-a-real-key",
                "ANTHROPIC_BASE_URL": server.base_url,
            },
        )
        try:
            web = stack.start_web()
            stack.start_worker()
            client = api(web)
            conversation = client.post("/api/conversations/", json={"title": "faults"}).json()
            sent = client.post(f"/api/conversations/{conversation['id']}/messages/", json={"text": "tell me"}).json()
            run = finished(sent["run"]["id"], timeout=90)
        finally:
            stack.stop()
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert run.provider == "anthropic"
    streamed = "".join(e.payload["text"] for e in RunEvent.objects.filter(run=run, type="text_delta").order_by("seq"))
    assert streamed == ANSWER
    messages = assert_one_clean_turn_per_run(conversation["id"])
    assert messages[-1].role == "assistant" and messages[-1].content == [{"type": "text", "text": ANSWER}]
    # Refused before an answer began (429, 529): nothing taken, nothing recorded. Each answer broken
    # off mid-stream was taken, and is a request of its own, before the retry that completed it.
    attempts = list(ModelRequest.objects.filter(run=run).order_by("id"))
    assert [(a.step, a.stop_reason, a.usage_source) for a in attempts] == [
        (1, "retried", "partial"),
        (1, "retried", "partial"),
        (1, "end_turn", "reported"),
    ]
    # The broken attempts: the prompt as the API reported it at message_start, the output that arrived.
    assert all(a.output_tokens > 0 for a in attempts[:2])
    # Each its own request's figures: every retry also sent the text already streamed (the prefill).
    assert 0 < attempts[0].prompt_tokens < attempts[1].prompt_tokens < attempts[2].prompt_tokens
    assert "sk-test-not-a-real-key" not in json.dumps(list(RunEvent.objects.filter(run=run).values("payload")))


def _login(base_url: str) -> tuple[httpx.Client, str]:
    browser = httpx.Client(base_url=base_url, timeout=15)
    browser.get("/login/")
    signed_in = browser.post(
        "/login/",
        data={"username": "alice", "password": "alice-password-1", "csrfmiddlewaretoken": browser.cookies["csrftoken"]},
    )
    assert signed_in.status_code == 302, signed_in.text
    return browser, "; ".join(f"{k}={v}" for k, v in browser.cookies.items())


@pytest.mark.req("RN-1")
def test_web_restarted_while_a_client_watches_the_client_catches_up_with_no_lost_event(stack, api, alice):
    web = stack.start_web()
    stack.start_worker()
    client = api(web)
    _, cookies = _login(web.base_url)
    conversation = client.post("/api/conversations/", json={"title": "watch"}).json()
    ws_url = web.base_url.replace("http", "ws") + f"/ws/conversations/{conversation['id']}/"
    headers = {"Cookie": cookies, "Origin": web.base_url}
    seen: dict[int, dict] = {}
    reconnects = 0

    async def watch() -> None:
        nonlocal reconnects
        run_id = None
        async with websockets.connect(ws_url, additional_headers=headers) as socket_:
            sent = await asyncio.to_thread(
                client.post, f"/api/conversations/{conversation['id']}/messages/", json={"text": SLOW_TOOL}
            )
            run_id = sent.json()["run"]["id"]
            while True:
                event = json.loads(await asyncio.wait_for(socket_.recv(), timeout=30))
                if event["type"] == "conversation_changed":
                    continue  # the tabs' redraw cue, not one of the run's events
                seen[event["seq"]] = event
                if event["type"] == "tool_call":
                    break
        # The web process dies under the client and comes back on the same address.
        await asyncio.to_thread(web.kill)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(web.start)
        while True:  # reconnect like the page does, then catch up from the stored log
            try:
                socket_ = await websockets.connect(ws_url, additional_headers=headers)
                break
            except OSError:
                await asyncio.sleep(0.2)
        reconnects += 1
        async with socket_:
            while True:
                after = max(seen)
                missed = await asyncio.to_thread(client.get, f"/api/runs/{run_id}/events/?after={after}")
                for event in missed.json():
                    seen[event["seq"]] = event
                if any(e["type"] == "run_finished" for e in seen.values()):
                    return
                try:
                    event = json.loads(await asyncio.wait_for(socket_.recv(), timeout=1))
                    if "seq" in event:  # conversation_changed carries none
                        seen[event["seq"]] = event
                except TimeoutError:
                    continue

    asyncio.run(watch())
    run = Run.objects.get(conversation_id=conversation["id"])
    stored = list(RunEvent.objects.filter(run=run).order_by("seq").values("seq", "type", "payload"))
    assert reconnects == 1
    assert sorted(seen) == [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    assert [(seen[e["seq"]]["type"], seen[e["seq"]]["payload"]) for e in stored] == [
        (e["type"], e["payload"]) for e in stored
    ]
    assert run.status == Run.Status.SUCCEEDED
    # Events happened while the web process was down: the catch-up, not the socket, delivered them.
    assert any(e["type"] == "tool_result" for e in stored)


@pytest.mark.req("CH-5")
def test_after_a_redis_restart_no_worker_reaps_until_every_live_worker_could_beat_again(tmp_path, settings):
    import redis

    from agents.heartbeat import beat

    settings.CC_WORKER_HEARTBEAT_SECONDS = 1  # TTL 3 s
    server = RedisServer(tmp_path)
    try:
        client = redis.Redis.from_url(server.url)
        assert beat(client, "a@host") is False  # a fresh registry: other workers have not beaten yet
        time.sleep(3.1)
        assert beat(client, "a@host") is True
        server.restart()  # every key is gone, "b@host" included although it is alive
        client = redis.Redis.from_url(server.url)
        assert beat(client, "a@host") is False
    finally:
        server.kill()


@pytest.mark.req("CH-5")
@pytest.mark.req("OP-2")
def test_a_worker_on_another_redis_with_the_same_database_never_fails_a_turn_that_is_alive(stack, api, alice, tmp_path):
    # An operator moving to a new Redis starts the new workers while the old ones finish their turns.
    # The new worker's live set holds only itself; the old worker's runs must not look dead to it.
    (tmp_path / "moved").mkdir()
    moved = Stack(connection.settings_dict["NAME"], tmp_path / "moved")
    try:
        moved.start_worker()
        time.sleep(3.5)  # its registry is a TTL old (3 × 1 s): its reaper passes every second from now on
        web = stack.start_web()
        stack.start_worker()
        client = api(web)
        conversation = client.post("/api/conversations/", json={"title": "moving"}).json()
        messages_url = f"/api/conversations/{conversation['id']}/messages/"
        run_id = client.post(messages_url, json={"text": "please run `sleep 6; echo done`"}).json()["run"]["id"]
        run = finished(run_id, timeout=90)
    finally:
        moved.stop()
    assert run.status == Run.Status.SUCCEEDED, run.error
    messages = assert_one_clean_turn_per_run(conversation["id"])
    assert "done" in messages[2].content[0]["content"]


@pytest.mark.req("CH-5")
def test_a_turn_whose_run_was_failed_under_it_stops_at_once_and_is_not_stored(alice, settings, tmp_path):
    import threading

    from agents.lifecycle import run_execute, runs_reap_orphans

    settings.CC_TOOL_AUTO_APPROVE = ["bash"]
    settings.CC_WORKSPACE_ROOT = tmp_path
    conversation = Conversation.objects.create(owner=alice, title="late")
    trigger = Message.objects.create(
        conversation=conversation, role="user", content=[{"type": "text", "text": "please run `sleep 20; echo done`"}]
    )
    conversation.tip = trigger
    conversation.save()
    run = Run.objects.create(conversation=conversation, trigger=trigger, provider="offline", model="offline-1")

    def execute() -> None:
        try:
            run_execute(run_id=run.pk, worker="slow@host")
        finally:
            connection.close()

    thread = threading.Thread(target=execute)
    thread.start()
    wait_for(lambda: RunEvent.objects.filter(run=run, type="tool_call").exists(), 20, "the tool call")
    # Taken for dead mid-turn (its worker was stopped, or cut off from Redis), and retried meanwhile
    # by its owner: the old turn must not go on spending and running commands beside the retry.
    assert runs_reap_orphans(live=[], grace_seconds=0) == [run.pk]
    reaped = time.monotonic()
    thread.join(timeout=30)
    assert time.monotonic() - reaped < min(scaled(5), 15)  # its `sleep 20` was killed, not waited for

    run.refresh_from_db()
    assert run.status == Run.Status.FAILED and "stopped before the turn ended" in run.error
    assert list(Message.objects.filter(conversation=conversation).values_list("pk", flat=True)) == [trigger.pk]
    # The request made before is recorded (it was paid for); no request came after.
    assert list(ModelRequest.objects.filter(run=run).values_list("step", flat=True)) == [1]
    assert list(RunEvent.objects.filter(run=run, type="run_finished").values_list("payload__status", flat=True)) == [
        "failed"
    ]
    conversation.refresh_from_db()
    assert conversation.tip_id == trigger.pk


def _two_tools_in_one_step() -> list:
    sleep = {"type": "tool_use", "id": "toolu_sleep", "name": "bash", "input": {"command": "sleep 3; echo slept"}}
    remember = {
        "type": "tool_use",
        "id": "toolu_memory",
        "name": "save_memory",
        "input": {"content": "The database went away and came back."},
    }
    return [[{"type": "text", "text": "Sleeping, then remembering."}, sleep, remember], "Remembered."]


@pytest.mark.req("CH-5")
def test_postgres_dropped_before_a_tool_that_writes_the_tool_runs_on_a_new_connection_and_the_run_resumes(
    tmp_path, api, alice
):
    """The drop is noticed first by a tool (no event is written between the two calls of one step),
    then by the next run's claim: both go on with a new connection; nothing is replayed."""
    from toolcatalog.models import Memory

    with EmulatorServer(Emulator(policy=ScriptedPolicy(_two_tools_in_one_step()))) as server:
        stack = Stack(
            connection.settings_dict["NAME"],
            tmp_path,
            {
                "CC_PROVIDER": "anthropic",
                "ANTHROPIC_API_KEY": "sk-test-not-a-real-key",
                "ANTHROPIC_BASE_URL": server.base_url,
                "CC_MAX_PARALLEL_TOOLS": "1",  # both calls on the run's own thread and connection
            },
        )
        try:
            web = stack.start_web()
            stack.start_worker()
            client = api(web)
            conversation = client.post("/api/conversations/", json={"title": "pg-tool"}).json()
            messages_url = f"/api/conversations/{conversation['id']}/messages/"
            run_id = client.post(messages_url, json={"text": "sleep, then remember"}).json()["run"]["id"]
            wait_for(
                lambda: RunEvent.objects.filter(run_id=run_id, type="tool_call", payload__name="save_memory").exists(),
                60,
                "both tool calls",
            )
            assert _terminate_backends(stack.app_name("worker", 0)) >= 1  # while `sleep 3` runs
            run = finished(run_id, timeout=60)
            assert run.status == Run.Status.SUCCEEDED, run.error
            results = {
                e.payload["name"]: e.payload["output"] for e in RunEvent.objects.filter(run=run, type="tool_result")
            }
            assert results["save_memory"]["ok"] is True, results["save_memory"]
            assert list(Memory.objects.values_list("content", flat=True)) == ["The database went away and came back."]
            assert "database connection was lost" in stack.workers[0].log_path.read_text()

            # The worker is idle now: Celery closed the run's connection when the task ended, and what
            # it holds is its reaper's, opened again on its next pass after the drop. Drop that too:
            # the reaper and the next run both go on with new connections.
            wait_for(lambda: _terminate_backends(stack.app_name("worker", 0)) >= 1, 30, "an idle worker's connection")
            nxt = client.post(messages_url, json={"text": "and now?"}).json()["run"]["id"]
            assert finished(nxt, timeout=60).status == Run.Status.SUCCEEDED
        finally:
            stack.stop()
    messages = assert_one_clean_turn_per_run(conversation["id"])
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert Run.objects.filter(conversation_id=conversation["id"]).count() == 2  # no retry was needed


@pytest.mark.req("OP-2")
def test_healthz_on_a_database_that_was_never_migrated_says_degraded_instead_of_failing(django_db_setup):
    """An operator who points a new install at an empty database, before `migrate`."""
    name = f"cc_unmigrated_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{_admin_url()}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        env = services_env(name)
        env["DJANGO_SETTINGS_MODULE"] = "controlcenter.settings"
        probe = (
            "import json, django; django.setup()\n"
            "from django.test import Client\n"
            "answer = Client(HTTP_HOST='localhost').get('/healthz')\n"
            "print(json.dumps([answer.status_code, answer.json()]))\n"
        )
        done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        status, body = json.loads(done.stdout.strip().splitlines()[-1])
        assert status == 503 and body["status"] == "degraded"
        assert body["checks"]["database"]["ok"] is False
    finally:
        with psycopg.connect(f"{_admin_url()}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def _admin_url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
