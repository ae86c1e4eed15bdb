"""Services mode as an operator meets it (OP-1..OP-4): real faults on a private stack.

Each test runs its own `redis-server` (controlcenter/stack.py), web server and Celery workers
on the test database; the machine's shared Redis is never flushed or restarted.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest
import redis
import websockets
from django.db import connection
from rest_framework.authtoken.models import Token

from agents.models import ModelRequest, Run, RunEvent
from controlcenter.cli import WEB_SHUTDOWN_GRACE_SECONDS
from controlcenter.processes import WorkerProcess
from controlcenter.stack import Stack
from conversations.models import Message
from engine.emulator import Emulator, ScriptedPolicy
from engine.emulator.server import EmulatorServer
from tests.support.timing import scaled
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

# Writes a numbered line every 0.1 s for 30 s: whether the command still runs shows in the file.
TICKING = "please run `for i in $(seq 1 300); do echo $i; echo $i >> ticks.txt; sleep 0.1; done`"
SOAK_SECONDS = float(os.environ.get("CC_SOAK_SECONDS", "120"))


@pytest.fixture
def stack(tmp_path):
    from django.conf import settings

    if settings.CC_MODE != "services":
        pytest.fail("these tests need DATABASE_URL and REDIS_URL (the README's test command sets them)")
    started = Stack(connection.settings_dict["NAME"], tmp_path, {"CC_QUEUE_SWEEP_SECONDS": "3"})
    yield started
    started.stop()


@pytest.fixture
def api(alice):
    def client(web) -> httpx.Client:
        token = Token.objects.get_or_create(user=alice)[0].key
        return httpx.Client(base_url=web.base_url, headers={"Authorization": f"Token {token}"}, timeout=15)

    return client


def _ticks(stack: Stack, conversation_id: int) -> int:
    path = Path(stack.env["CC_WORKSPACE_ROOT"])
    files = list(path.glob(f"**/{conversation_id}/ticks.txt")) or list(path.glob("**/ticks.txt"))
    return len(files[0].read_text().split()) if files else 0


def _still_writing(stack: Stack, conversation_id: int, seconds: float = 1.0) -> bool:
    before = _ticks(stack, conversation_id)
    time.sleep(seconds)
    return _ticks(stack, conversation_id) > before


def _start_ticking(client: httpx.Client, stack: Stack) -> tuple[int, int]:
    conversation = client.post("/api/conversations/", json={"title": "ticks"}).json()
    sent = client.post(f"/api/conversations/{conversation['id']}/messages/", json={"text": TICKING})
    assert sent.status_code == 201, sent.text
    wait_until(lambda: _ticks(stack, conversation["id"]) >= 5, 30, "the command to start writing")
    return conversation["id"], sent.json()["run"]["id"]


@pytest.mark.req("OP-2")
@pytest.mark.req("OP-4")
def test_a_worker_killed_and_restarted_under_the_same_name_reaps_its_run_and_its_command_died_with_it(stack, api):
    web = stack.start_web()
    env = {**stack.env, "PGAPPNAME": stack.app_name("worker", 0)}
    name = f"same-{uuid.uuid4().hex[:6]}@%h"
    worker = WorkerProcess(env, name, stack.workdir / "worker.log")
    worker.wait_ready()
    # `controlcenter worker`, as an operator starts it, runs its turns on threads of its one process:
    # what dies with it below is everything it was running.
    assert ".> concurrency: 2 (thread)" in worker.log_path.read_text()
    client = api(web)
    conversation_id, run_id = _start_ticking(client, stack)

    worker.kill()  # kill -9, the whole worker process group
    time.sleep(0.5)  # the watchdog reads EOF and kills the command's own session
    assert not _still_writing(stack, conversation_id), "the killed worker's command kept writing"

    worker.start()  # the same command line, the same --hostname
    worker.wait_ready()
    killed_at = time.monotonic()
    run = wait_until(
        lambda: Run.objects.filter(pk=run_id, status=Run.Status.FAILED).first(), 20, "the run to be reaped"
    )
    # Three heartbeats of 1 s, plus the worker's own start and first complete beat.
    assert time.monotonic() - killed_at < 8
    assert run.retryable and "stopped during the tool call bash" in run.error, run.error
    assert "what it changed in the workspace" in run.error

    retried = client.post(f"/api/runs/{run_id}/retry/")
    assert retried.status_code == 201, retried.text
    retry_id = retried.json()["id"]
    started = wait_until(
        lambda: RunEvent.objects.filter(run_id=retry_id, type="run_started").first(), 30, "the retry to start"
    )
    assert started.seq == 1
    assert started.payload["retry_of"]["run"] == run_id
    (interrupted,) = started.payload["retry_of"]["interrupted_calls"]
    assert interrupted["name"] == "bash" and "ticks.txt" in interrupted["input"]["command"]
    assert client.post(f"/api/runs/{retry_id}/cancel/").status_code == 200
    worker.stop()


def _bash(command: str) -> dict:
    return {"type": "tool_use", "name": "bash", "input": {"command": command}}


@pytest.mark.req("OP-4")
@pytest.mark.req("CH-5")
def test_a_worker_stopped_mid_turn_hands_the_turn_on_at_the_next_step_and_its_restart_finishes_it(tmp_path, api):
    # Three steps: a 4-second call, then one that would hold the stopping worker 15 s more, then the answer.
    steps = [[_bash("sleep 4; echo first >> calls.txt")], [_bash("sleep 15; echo second >> calls.txt")], "Done."]
    with EmulatorServer(Emulator(policy=ScriptedPolicy(steps))) as server:
        emulated = {
            "CC_PROVIDER": "anthropic",
            "CC_MODEL": "claude-sonnet-4-5",
            "ANTHROPIC_API_KEY": "sk-test-not-a-real-key",
            "ANTHROPIC_BASE_URL": server.base_url,
        }
        stack = Stack(connection.settings_dict["NAME"], tmp_path, emulated)
        try:
            client = api(stack.start_web())
            worker = stack.start_worker()
            conversation = client.post("/api/conversations/", json={"title": "restart"}).json()
            sent = client.post(f"/api/conversations/{conversation['id']}/messages/", json={"text": "go"}).json()
            run_id = sent["run"]["id"]
            wait_until(lambda: RunEvent.objects.filter(run_id=run_id, type="tool_call").exists(), 30, "the first call")

            worker.process.send_signal(signal.SIGTERM)  # as `docker compose stop worker` does
            worker.process.wait(timeout=12)  # the first call's 4 s, not the second call's 15 too

            handed = RunEvent.objects.get(run_id=run_id, type="run_handed_off")
            assert handed.payload["step"] == 1
            calls = RunEvent.objects.filter(run_id=run_id, type="tool_call").values_list("payload__input", flat=True)
            assert [call["command"] for call in calls] == ["sleep 4; echo first >> calls.txt"]
            assert Run.objects.get(pk=run_id).status == Run.Status.QUEUED

            worker.start()  # the same command line, the same --hostname
            worker.wait_ready()
            run = wait_until(
                lambda: Run.objects.filter(pk=run_id, status__in=["succeeded", "failed"]).first(), 90, "the run"
            )
        finally:
            stack.stop()
    assert run.status == Run.Status.SUCCEEDED, run.error
    path = Message.objects.filter(conversation_id=conversation["id"]).order_by("id")
    assert [m.role for m in path] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert [m.parent_id for m in path][1:] == [m.pk for m in path][:-1]  # one path, nothing twice
    assert path.last().content == [{"type": "text", "text": "Done."}]
    (calls_file,) = Path(stack.env["CC_WORKSPACE_ROOT"]).glob("**/calls.txt")
    assert calls_file.read_text().split() == ["first", "second"]  # each call ran once
    assert ModelRequest.objects.filter(run_id=run_id).count() == 3
    started = RunEvent.objects.filter(run_id=run_id, type="run_started").order_by("seq")
    assert len({event.payload["worker"] for event in started}) == 2  # the restarted worker is a new instance


@pytest.mark.req("OP-2")
def test_queued_work_lost_with_the_broker_is_sent_again_once_and_redis_down_refuses_a_send(stack, api):
    web = stack.start_web()
    client = api(web)
    conversation = client.post("/api/conversations/", json={"title": "lost"}).json()
    sent = client.post(f"/api/conversations/{conversation['id']}/messages/", json={"text": "hello"})
    assert sent.status_code == 201, sent.text
    run_id = sent.json()["run"]["id"]
    redis.Redis.from_url(stack.redis.url).flushall()  # the private Redis: the queued task is gone

    def degraded():
        body = client.get("/healthz").json()
        return body if body["status"] == "degraded" and body["checks"]["queue"]["runs"] == 1 else None

    body = wait_until(degraded, 10, "/healthz to report the stale queued run")
    assert body["checks"]["queue"]["ok"] is False

    stack.start_worker()  # its sweep finds the queued run with no message and sends it again
    run = wait_until(
        lambda: Run.objects.filter(pk=run_id, status=Run.Status.SUCCEEDED).first(), 60, "the swept run to finish"
    )
    assert list(RunEvent.objects.filter(run=run, type="run_started").values_list("seq", flat=True)) == [1]
    wait_until(lambda: client.get("/healthz").status_code == 200, 10, "/healthz to be ok again")

    # Redis down during a send: 503 with a clear message, and nothing stored.
    messages_before = Message.objects.count()
    runs_before = Run.objects.count()
    stack.redis.kill()
    refused = client.post(f"/api/conversations/{conversation['id']}/messages/", json={"text": "are you there?"})
    assert refused.status_code == 503, refused.text
    assert "The run queue (Redis) is unreachable, so nothing was saved." in refused.text
    assert (Message.objects.count(), Run.objects.count()) == (messages_before, runs_before)
    stack.redis.start()
    again = client.post(f"/api/conversations/{conversation['id']}/messages/", json={"text": "are you there?"})
    assert again.status_code == 201, again.text
    assert wait_until(lambda: Run.objects.filter(pk=again.json()["run"]["id"]).exclude(
        status__in=["queued", "running"]).first(), 60, "the next run").status == Run.Status.SUCCEEDED  # fmt: skip


def _login(base_url: str) -> str:
    browser = httpx.Client(base_url=base_url, timeout=15)
    browser.get("/login/")
    signed_in = browser.post(
        "/login/",
        data={"username": "alice", "password": "alice-password-1", "csrfmiddlewaretoken": browser.cookies["csrftoken"]},
    )
    assert signed_in.status_code == 302, signed_in.text
    return "; ".join(f"{k}={v}" for k, v in browser.cookies.items())


@pytest.mark.req("OP-1")
@pytest.mark.starts_first
def test_twenty_idle_websockets_stay_open_for_the_soak_and_then_each_gets_a_streamed_run_once(stack, api):
    web = stack.start_web()
    stack.start_worker()
    client = api(web)
    cookies = _login(web.base_url)
    conversation = client.post("/api/conversations/", json={"title": "soak"}).json()
    url = web.base_url.replace("http", "ws") + f"/ws/conversations/{conversation['id']}/"
    headers = {"Cookie": cookies, "Origin": web.base_url}

    async def soak() -> tuple[int, list[list[int]]]:
        sockets = [await websockets.connect(url, additional_headers=headers) for _ in range(20)]
        disconnects = 0
        deadline = time.monotonic() + SOAK_SECONDS
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            disconnects = sum(1 for s in sockets if s.close_code is not None)
            if disconnects:
                break
        sent = await asyncio.to_thread(
            client.post, f"/api/conversations/{conversation['id']}/messages/", json={"text": "hello"}
        )
        run_id = sent.json()["run"]["id"]

        async def collect(socket_) -> list[int]:
            seqs = []
            while True:
                event = json.loads(await asyncio.wait_for(socket_.recv(), timeout=30))
                if event.get("run_id") != run_id:
                    continue
                seqs.append(event["seq"])
                if event["type"] == "run_finished":
                    return seqs

        if disconnects:
            return disconnects, []
        seen = await asyncio.gather(*(collect(s) for s in sockets))
        for s in sockets:
            await s.close()
        return disconnects, seen

    disconnects, seen = asyncio.run(soak())
    assert disconnects == 0, f"{disconnects} of 20 idle websockets were closed by the server within {SOAK_SECONDS}s"
    run = Run.objects.get(conversation_id=conversation["id"])
    stored = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert all(seqs == stored for seqs in seen), "a socket lost or doubled events"
    assert "Timeout reading" not in (stack.workdir / "web-0.log").read_text()
    # Stopped as an operator does (SIGTERM) after its sockets streamed a run: within its grace period.
    started = time.monotonic()
    web.stop()
    assert time.monotonic() - started < WEB_SHUTDOWN_GRACE_SECONDS + 3
    # It shut down itself (uvicorn exits by the signal it caught), and was not SIGKILLed.
    assert web.process.returncode in (0, -signal.SIGTERM)


class _Client:
    """What static/cc/run.js and dashboard.js do: reconnect on close, catch up on every (re)connect.

    `frames` counts each seq as the socket delivered it, so a doubled delivery shows; `seen` is
    what the page shows (the live frames and the catch-ups, by seq)."""

    def __init__(self, base_url: str, headers: dict[str, str], client: httpx.Client, run_id: int) -> None:
        self.ws_base = base_url.replace("http", "ws")
        self.headers, self.client, self.run_id = headers, client, run_id
        self.frames: dict[int, int] = {}
        self.seen: set[int] = set()
        self.connects = {"run": 0, "dashboard": 0}
        self.dashboard: dict | None = None

    def contiguous(self) -> int:
        n = 0
        while n + 1 in self.seen:
            n += 1
        return n

    async def catch_up(self) -> None:
        caught = await asyncio.to_thread(
            self.client.get, f"/api/runs/{self.run_id}/events/", params={"after": self.contiguous()}
        )
        self.seen.update(event["seq"] for event in caught.json())

    async def watch_run(self, until: asyncio.Event) -> None:
        while not until.is_set():
            try:
                async with websockets.connect(f"{self.ws_base}/ws/runs/{self.run_id}/", additional_headers=self.headers,
                                              open_timeout=5) as socket_:  # fmt: skip
                    self.connects["run"] += 1
                    await self.catch_up()
                    async for raw in socket_:
                        event = json.loads(raw)
                        self.frames[event["seq"]] = self.frames.get(event["seq"], 0) + 1
                        self.seen.add(event["seq"])
                        if event["seq"] > self.contiguous() + 1:  # a gap: catch up, as run.js does
                            await self.catch_up()
            except (OSError, websockets.WebSocketException, httpx.HTTPError):
                pass
            await asyncio.sleep(0.5)

    async def watch_dashboard(self, until: asyncio.Event) -> None:
        while not until.is_set():
            try:
                async with websockets.connect(f"{self.ws_base}/ws/dashboard/", additional_headers=self.headers,
                                              open_timeout=5) as socket_:  # fmt: skip
                    self.connects["dashboard"] += 1
                    fetched = await asyncio.to_thread(self.client.get, "/dashboard/data/")
                    if fetched.status_code == 200:
                        self.dashboard = fetched.json()
                    async for raw in socket_:
                        self.dashboard = json.loads(raw)["snapshot"]
            except (OSError, websockets.WebSocketException, httpx.HTTPError):
                pass
            await asyncio.sleep(0.5)


@pytest.mark.req("OP-1")
def test_after_a_redis_restart_the_run_page_and_dashboard_sockets_reconnect_and_miss_nothing(stack, api):
    web = stack.start_web()
    stack.start_worker()
    client = api(web)
    cookies = _login(web.base_url)
    browser = httpx.Client(base_url=web.base_url, headers={"Cookie": cookies}, timeout=15)
    conversation = client.post("/api/conversations/", json={"title": "restart"}).json()
    sent = client.post(
        f"/api/conversations/{conversation['id']}/messages/",
        json={"text": "please run `echo before; sleep 4; echo after`"},
    )
    assert sent.status_code == 201, sent.text
    run_id = sent.json()["run"]["id"]
    watcher = _Client(web.base_url, {"Cookie": cookies, "Origin": web.base_url}, browser, run_id)

    async def scenario() -> None:
        done = asyncio.Event()
        tasks = [asyncio.create_task(watcher.watch_run(done)), asyncio.create_task(watcher.watch_dashboard(done))]
        await asyncio.to_thread(
            wait_until, lambda: RunEvent.objects.filter(run_id=run_id, type="tool_call").exists(), 30, "the tool call"
        )
        await asyncio.to_thread(stack.redis.restart, 1.0)  # down 1 s, back empty: groups and queues are gone
        await asyncio.to_thread(
            wait_until, lambda: Run.objects.filter(pk=run_id, status=Run.Status.SUCCEEDED).exists(), 60, "the run"
        )

        def caught_up() -> bool:
            stored = set(RunEvent.objects.filter(run_id=run_id).values_list("seq", flat=True))
            finished = watcher.dashboard and any(r["id"] == run_id and r["status"] == "succeeded"
                                                 for r in watcher.dashboard["recent_runs"])  # fmt: skip
            return watcher.seen == stored and bool(finished)

        try:
            await asyncio.to_thread(wait_until, caught_up, 30, "the clients to catch up")
        finally:
            done.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario())
    stored = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    assert stored == list(range(1, len(stored) + 1))
    assert sorted(watcher.seen) == stored  # nothing lost
    assert all(count == 1 for count in watcher.frames.values()), watcher.frames  # nothing doubled on a socket
    # The restart closed the sockets (their groups were gone with Redis), so both clients came back.
    assert watcher.connects["run"] >= 2 and watcher.connects["dashboard"] >= 2, watcher.connects


@pytest.mark.req("OP-1")
def test_a_websocket_opened_while_redis_is_down_is_told_to_try_again_later_and_stays_open_once_it_is_back(stack, alice):
    """QA: each attempt during an outage was an HTTP 500 with a traceback in the web log (286 in 6 s)."""
    web = stack.start_web()
    cookies = _login(web.base_url)
    url = web.base_url.replace("http", "ws") + "/ws/dashboard/"

    async def attempt() -> int | None:
        """The close code the server sent, or None while the socket stays open."""
        async with websockets.connect(url, additional_headers={"Cookie": cookies, "Origin": web.base_url}) as socket_:
            try:
                await asyncio.wait_for(socket_.recv(), timeout=3)
            except websockets.ConnectionClosed:
                return socket_.close_code
            except TimeoutError:
                return None
        return None

    stack.redis.kill()
    try:
        codes = [asyncio.run(attempt()) for _ in range(3)]
    finally:
        stack.redis.start()
    assert codes == [1013] * 3  # RFC 6455 "Try Again Later": the page's backoff comes back
    log = web.log_path.read_text()
    assert "Traceback" not in log and log.count("the channel layer is unreachable") == 3, log
    assert asyncio.run(attempt()) is None


@pytest.mark.req("OP-4", "TD-14")
def test_a_stopping_worker_runs_the_children_left_queued_at_once_not_one_after_another(tmp_path, api):
    """QA: one after another on the parent's thread, six 8-second children held a warm shutdown 46 s.
    A stopping worker takes no new task, so the parent runs every child left queued, each on a
    thread of its own; its turn then hands off at the next step, and a restart finishes it."""
    stack = Stack(connection.settings_dict["NAME"], tmp_path, {"CC_TOOL_AUTO_APPROVE": "bash"})
    tasks = "; ".join(f"run `sleep 5 && echo {name} >> calls.txt`" for name in "abcd")
    try:
        client = api(stack.start_web())
        worker = stack.start_worker(concurrency=1)  # its one thread holds the parent
        conversation = client.post("/api/conversations/", json={"title": "drain"}).json()
        sent = client.post(f"/api/conversations/{conversation['id']}/messages/", json={"text": f"in parallel: {tasks}"})
        run_id = sent.json()["run"]["id"]
        wait_until(lambda: RunEvent.objects.filter(run_id=run_id, type="tool_call").exists(), 30, "the fan-out")
        stopping = time.monotonic()
        worker.process.send_signal(signal.SIGTERM)  # before any child was claimed
        worker.process.wait(timeout=60)
        held = time.monotonic() - stopping
        # 2 s before a queued child is run here, then the four together. One after another they
        # sleep 4 × 5 s, whatever the machine: a slow one's limit stops short of that.
        assert held < min(4 * 5, scaled(14)), f"the stopping worker was held {held:.1f} s"
        assert sorted(Run.objects.get(pk=run_id).subagents.values_list("status", flat=True)) == ["succeeded"] * 4

        worker.start()
        worker.wait_ready()
        run = wait_until(lambda: Run.objects.filter(pk=run_id, status__in=["succeeded", "failed"]).first(), 90, "run")
    finally:
        stack.stop()
    assert run.status == Run.Status.SUCCEEDED, run.error
    (calls,) = Path(stack.env["CC_WORKSPACE_ROOT"]).glob("**/calls.txt")
    assert sorted(calls.read_text().split()) == ["a", "b", "c", "d"]  # each child's command ran once
