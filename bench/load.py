"""`bench load`: concurrent runs, API clients and websocket watchers on a real stack, loopback only.

A private stack (controlcenter/stack.py: its own redis-server, one uvicorn web process, N Celery
workers) on the configured PostgreSQL database, with the Anthropic adapter pointed at the emulator's
HTTP server, which answers with realistic latencies (time to first token, then a gap per delta).
Three phases, each reporting p50/p99 and an error rate, and checking that nothing was lost:

- runs:  R conversations each get a message at once; every run must succeed and store exactly one
         reply equal to the emulator's answer (run latency = Run.finished_at - Run.created_at);
- api:   C clients for D seconds, each listing conversations, reading its own and posting a message
         whenever its previous run has finished; afterwards every posted run must finish;
- watch: W websocket clients watch one conversation while a run streams; every client must receive
         every stored event, in order (lag = receive time - RunEvent.created_at). W - 5 of them run in
         a separate process and only keep frames; 5 probes in the bench process give the lag, so
         the figure is the server's, not the clients' (they share the host's CPUs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import websockets
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection

from bench._options import non_negative_number, positive, positive_number
from controlcenter.stack import Stack
from engine.emulator import Emulator
from engine.emulator.server import EmulatorServer

# `manage.py bench` runs it in a scratch database (NAME_bench) and drops that afterwards.
WRITES_DATABASE = True

# About 120 words: a short real answer, streamed as ~120 deltas.
ANSWER = "A steady answer that streams like a real model would, one small delta at a time: " + " ".join(
    f"word{n}" for n in range(105)
)
PHASES = ("runs", "api", "watch")
FINISHED = {"succeeded", "failed", "cancelled"}
PASSWORD = "bench-load-password-1"


def _phases(value: str) -> str:
    unknown = sorted(set(value.split(",")) - set(PHASES) - {""})
    if unknown:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown)} is not one of {', '.join(PHASES)}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=positive, default=50, help="concurrent runs in the runs phase")
    parser.add_argument("--workers", type=positive, default=2)
    parser.add_argument("--web-workers", type=positive, default=1, help="uvicorn processes (CC_WEB_WORKERS)")
    parser.add_argument("--worker-concurrency", type=positive, default=8, help="threads per worker")
    parser.add_argument("--clients", type=positive, default=200, help="concurrent API clients")
    parser.add_argument("--duration", type=positive_number, default=60.0, help="seconds of the API phase")
    parser.add_argument("--watchers", type=positive, default=200, help="websocket clients watching one run")
    parser.add_argument("--first-token-ms", type=non_negative_number, default=400.0)
    parser.add_argument("--delta-ms", type=non_negative_number, default=25.0)
    parser.add_argument("--list-limit", type=positive, default=50, help="page size the API clients ask the list for")
    parser.add_argument(
        "--phases", type=_phases, default=",".join(PHASES), help="comma-separated subset of runs,api,watch"
    )


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(values), 1) if values else 0.0,
        "p99_ms": round(percentile(values, 0.99), 1),
        "count": len(values),
    }


def _answer_policy(payload: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": ANSWER}]


def run(options: dict[str, Any]) -> dict[str, Any]:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if settings.CC_MODE != "services":
        raise SystemExit("bench load needs DATABASE_URL and REDIS_URL (PostgreSQL and a local redis-server)")
    workdir = Path(tempfile.mkdtemp(prefix="cc-bench-load-"))
    figures = measure(database_name=connection.settings_dict["NAME"], workdir=workdir, **options)
    figures["logs"] = str(workdir)
    return figures


def measure(
    *,
    database_name: str,
    workdir: Path,
    runs: int,
    workers: int,
    worker_concurrency: int,
    clients: int,
    duration: float,
    watchers: int,
    first_token_ms: float,
    delta_ms: float,
    phases: str = ",".join(PHASES),
    web_workers: int = 1,
    list_limit: int = 50,
) -> dict[str, Any]:
    """Start the stack, run the chosen phases, stop everything; figures as a dict."""
    wanted = [phase for phase in phases.split(",") if phase]
    user = _bench_user()
    token = _token(user)
    emulator = EmulatorServer(Emulator(policy=_answer_policy), first_token_ms=first_token_ms, delta_ms=delta_ms).start()
    stack = Stack(
        database_name,
        workdir,
        {
            "CC_PROVIDER": "anthropic",
            "CC_MODEL": "claude-sonnet-4-5",
            "ANTHROPIC_API_KEY": "bench-not-a-real-key",
            "ANTHROPIC_BASE_URL": emulator.base_url,
            "LOG_LEVEL": "WARNING",
        },
    )
    figures: dict[str, Any] = {
        "setup": {
            "workers": workers,
            "web_workers": web_workers,
            "list_limit": list_limit,
            "worker_concurrency": worker_concurrency,
            "first_token_ms": first_token_ms,
            "delta_ms": delta_ms,
            "answer_words": len(ANSWER.split()),
        }
    }
    try:
        web = stack.start_web(workers=web_workers)
        for _ in range(workers):
            stack.start_worker(concurrency=worker_concurrency)
        if "runs" in wanted:
            run_ids, errors = asyncio.run(_runs_phase(web.base_url, token, runs))
            figures["runs"] = _check_runs(run_ids, runs, errors)
        if "api" in wanted:
            cpu = web.cpu_seconds()
            figures["api"] = _api_figures(asyncio.run(_api_phase(web.base_url, token, clients, duration, list_limit)))
            # CPU of the web processes per request: the server's cost, steady however busy the host is.
            figures["api"]["web_cpu_ms_per_request"] = round(
                (web.cpu_seconds() - cpu) * 1000 / max(1, figures["api"]["requests"]), 2
            )
        if "watch" in wanted:
            cookie = _session_cookie(web.base_url, user.get_username())
            outcome = asyncio.run(_watch_phase(web.base_url, token, cookie, watchers, web.cpu_seconds))
            figures["watch"] = _watch_figures(outcome)
            # CPU of the web processes from the message being posted (every watcher connected) to the end.
            streaming = web.cpu_seconds() - outcome["cpu_at_post"]
            frames = figures["watch"]["events_in_run"] * figures["watch"]["connected"]
            figures["watch"]["web_cpu_s_streaming"] = round(streaming, 2)
            figures["watch"]["web_cpu_us_per_frame"] = round(streaming * 1e6 / max(1, frames), 1)
    finally:
        stack.stop()
        emulator.stop()
    return figures


def _bench_user():
    user, _ = get_user_model().objects.get_or_create(username="bench-load")
    user.set_password(PASSWORD)
    user.save()
    return user


def _token(user) -> str:
    from rest_framework.authtoken.models import Token

    return Token.objects.get_or_create(user=user)[0].key


def _client(base_url: str, token: str, size: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url,
        headers={"Authorization": f"Token {token}"},
        timeout=120,
        limits=httpx.Limits(max_connections=size + 10, max_keepalive_connections=size + 10),
    )


async def _wait_finished(http: httpx.AsyncClient, run_ids: list[int], timeout: float) -> dict[int, str]:
    status: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pending = [run_id for run_id in run_ids if status.get(run_id) not in FINISHED]
        if not pending:
            break
        for run_id in pending:
            response = await http.get(f"/api/runs/{run_id}/")
            if response.status_code == 200:
                status[run_id] = response.json()["status"]
        await asyncio.sleep(0.25)
    return status


# --- runs ------------------------------------------------------------------------------


async def _runs_phase(base_url: str, token: str, count: int) -> tuple[list[int], int]:
    async with _client(base_url, token, count) as http:
        made = await asyncio.gather(
            *(http.post("/api/conversations/", json={"title": f"load {i}"}) for i in range(count))
        )
        sent = await asyncio.gather(
            *(
                http.post(f"/api/conversations/{c.json()['id']}/messages/", json={"text": f"run {i}"})
                for i, c in enumerate(made)
            )
        )
        errors = sum(1 for response in sent if response.status_code != 201)
        run_ids = [response.json()["run"]["id"] for response in sent if response.status_code == 201]
        await _wait_finished(http, run_ids, timeout=60 + count * 5)
    return run_ids, errors


def _check_runs(run_ids: list[int], requested: int, post_errors: int) -> dict[str, Any]:
    from agents.models import Run, RunEvent
    from conversations.models import Message

    runs_ = list(Run.objects.filter(pk__in=run_ids))
    latency = [(r.finished_at - r.created_at).total_seconds() * 1000 for r in runs_ if r.finished_at]
    first_event = [(r.first_event_at - r.created_at).total_seconds() * 1000 for r in runs_ if r.first_event_at]
    succeeded = [r for r in runs_ if r.status == "succeeded"]
    intact = 0
    for r in succeeded:
        path = list(Message.objects.filter(conversation_id=r.conversation_id).order_by("id"))
        seqs = list(RunEvent.objects.filter(run=r).order_by("seq").values_list("seq", flat=True))
        if (
            [m.role for m in path] == ["user", "assistant"]
            and path[1].content == [{"type": "text", "text": ANSWER}]
            and seqs == list(range(1, len(seqs) + 1))
        ):
            intact += 1
    return {
        "requested": requested,
        "succeeded": len(succeeded),
        "intact_conversations": intact,
        "lost": requested - len(succeeded),
        "error_rate": round((requested - len(succeeded) + post_errors) / max(1, requested), 4),
        "run_latency": summary(latency),
        "first_event": summary(first_event),
    }


# --- api clients -------------------------------------------------------------------------


async def _api_phase(base_url: str, token: str, clients: int, duration: float, list_limit: int) -> dict[str, Any]:
    timings: dict[str, list[float]] = {"list": [], "detail": [], "post": [], "run": []}
    outcome = {"requests": 0, "errors": 0, "conflicts": 0, "posted_runs": [], "error_statuses": {}}

    async def timed(kind: str, call) -> httpx.Response | None:
        started = time.perf_counter()
        outcome["requests"] += 1
        try:
            response = await call
        except httpx.HTTPError as exc:
            outcome["errors"] += 1
            name = type(exc).__name__
            outcome["error_statuses"][name] = outcome["error_statuses"].get(name, 0) + 1
            return None
        timings[kind].append((time.perf_counter() - started) * 1000)
        if response.status_code == 409:
            outcome["conflicts"] += 1
        elif response.status_code >= 400:
            outcome["errors"] += 1
            code = str(response.status_code)
            outcome["error_statuses"][code] = outcome["error_statuses"].get(code, 0) + 1
        return response

    async with _client(base_url, token, clients) as http:
        made = await asyncio.gather(
            *(http.post("/api/conversations/", json={"title": f"api client {i}"}) for i in range(clients))
        )
        end = time.monotonic() + duration

        async def client(conversation_id: int) -> None:
            run_id = None
            while time.monotonic() < end:
                await timed("list", http.get(f"/api/conversations/?limit={list_limit}"))
                await timed("detail", http.get(f"/api/conversations/{conversation_id}/"))
                if run_id is not None:
                    state = await timed("run", http.get(f"/api/runs/{run_id}/"))
                    if state is None or state.status_code != 200 or state.json()["status"] not in FINISHED:
                        continue
                sent = await timed(
                    "post", http.post(f"/api/conversations/{conversation_id}/messages/", json={"text": "hello"})
                )
                if sent is not None and sent.status_code == 201:
                    run_id = sent.json()["run"]["id"]
                    outcome["posted_runs"].append(run_id)

        await asyncio.gather(*(client(response.json()["id"]) for response in made))
        final = await _wait_finished(http, outcome["posted_runs"], timeout=300)
    outcome["final"] = final
    outcome["timings"] = timings
    outcome["duration"] = duration
    outcome["clients"] = clients
    return outcome


def _api_figures(outcome: dict[str, Any]) -> dict[str, Any]:
    posted = outcome["posted_runs"]
    succeeded = sum(1 for run_id in posted if outcome["final"].get(run_id) == "succeeded")
    every = [value for values in outcome["timings"].values() for value in values]
    return {
        "clients": outcome["clients"],
        "duration_s": outcome["duration"],
        "requests": outcome["requests"],
        "requests_per_s": round(outcome["requests"] / outcome["duration"], 1),
        "errors": outcome["errors"],
        "conflicts_409": outcome["conflicts"],
        "error_statuses": outcome["error_statuses"],
        "error_rate": round(outcome["errors"] / max(1, outcome["requests"]), 4),
        "all": summary(every),
        **{kind: summary(values) for kind, values in outcome["timings"].items()},
        "runs_posted": len(posted),
        "runs_succeeded": succeeded,
        "runs_lost": len(posted) - succeeded,
    }


# --- websocket watchers -------------------------------------------------------------------


def _session_cookie(base_url: str, username: str) -> str:
    with httpx.Client(base_url=base_url, timeout=30) as browser:
        browser.get("/login/")
        signed_in = browser.post(
            "/login/",
            data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": browser.cookies["csrftoken"]},
        )
        if signed_in.status_code != 302:
            raise RuntimeError(f"could not sign in the bench user: {signed_in.status_code}")
        return "; ".join(f"{name}={value}" for name, value in browser.cookies.items())


def _crowd(url: str, headers: dict[str, str], count: int, ready: Any, results: Any) -> None:
    """The watcher crowd, in a process of its own: connect `count` sockets, keep every frame unparsed.

    Decoding 200 copies of every event in the bench's own event loop made the clients, not the
    server, the bottleneck; here a frame costs one timestamp and one append, and the lag the
    report gives comes from the few probes in the bench process (see _watch_phase).
    """

    async def main() -> None:
        connect_ms: list[float] = []

        async def connect():
            started = time.perf_counter()
            try:
                socket_ = await websockets.connect(url, additional_headers=headers, open_timeout=60, max_queue=None)
            except (OSError, websockets.WebSocketException, TimeoutError):
                return None
            connect_ms.append((time.perf_counter() - started) * 1000)
            return socket_

        sockets = [s for s in await asyncio.gather(*(connect() for _ in range(count))) if s is not None]
        ready.put({"connect_ms": connect_ms, "failures": count - len(sockets)})

        async def listen(socket_) -> list[tuple[str, float]]:
            frames: list[tuple[str, float]] = []
            try:
                while True:
                    frame = await asyncio.wait_for(socket_.recv(), timeout=60)
                    frames.append((frame, time.time()))
                    if '"run_finished"' in frame:
                        return frames
            except (TimeoutError, websockets.WebSocketException):
                return frames
            finally:
                await socket_.close()

        results.put(await asyncio.gather(*(listen(s) for s in sockets)))

    asyncio.run(main())


async def _watch_phase(
    base_url: str, token: str, cookie: str, watchers: int, cpu_seconds: Any, probes: int = 5
) -> dict[str, Any]:
    import multiprocessing

    async with _client(base_url, token, 4) as http:
        conversation = (await http.post("/api/conversations/", json={"title": "watched"})).json()
        url = base_url.replace("http", "ws", 1) + f"/ws/conversations/{conversation['id']}/"
        headers = {"Cookie": cookie, "Origin": base_url}
        context = multiprocessing.get_context("spawn")
        ready, results = context.Queue(), context.Queue()
        crowd = context.Process(target=_crowd, args=(url, headers, watchers - probes, ready, results), daemon=True)
        crowd.start()
        connected = await asyncio.to_thread(ready.get, True, 180)
        probe_sockets = [
            await websockets.connect(url, additional_headers=headers, open_timeout=60, max_queue=None)
            for _ in range(probes)
        ]
        cpu_at_post = cpu_seconds()
        sent = await http.post(f"/api/conversations/{conversation['id']}/messages/", json={"text": "stream to all"})
        run_id = sent.json()["run"]["id"]

        async def probe(socket_) -> list[tuple[str, float]]:
            frames: list[tuple[str, float]] = []
            try:
                while True:
                    frame = await asyncio.wait_for(socket_.recv(), timeout=60)
                    frames.append((frame, time.time()))
                    if json.loads(frame)["type"] == "run_finished":
                        return frames
            except (TimeoutError, websockets.WebSocketException):
                return frames
            finally:
                await socket_.close()

        probed = await asyncio.gather(*(probe(s) for s in probe_sockets))
        crowd_frames = await asyncio.to_thread(results.get, True, 180)
        await asyncio.to_thread(crowd.join, 30)

    def decoded(frames: list[tuple[str, float]]) -> list[tuple[int, float]]:
        # conversation_changed (the tabs' redraw cue) belongs to no run and has no sequence number.
        events = [(json.loads(frame), at) for frame, at in frames]
        return [(event["seq"], at) for event, at in events if "seq" in event]

    return {
        "run_id": run_id,
        "cpu_at_post": cpu_at_post,
        "watchers": watchers,
        "connect_failures": connected["failures"],
        "connect_ms": connected["connect_ms"],
        "probes": [decoded(frames) for frames in probed],
        "crowd": [decoded(frames) for frames in crowd_frames],
    }


def _watch_figures(outcome: dict[str, Any]) -> dict[str, Any]:
    from agents.models import RunEvent

    rows = RunEvent.objects.filter(run_id=outcome["run_id"]).values_list("seq", "created_at", "type")
    stored = {seq: created.timestamp() for seq, created, _ in rows}
    text_deltas = sum(1 for _, _, event_type in rows if event_type == "text_delta")
    expected = sorted(stored)
    everyone = outcome["probes"] + outcome["crowd"]
    complete = sum(1 for received in everyone if [seq for seq, _ in received] == expected)
    missing = sum(len(set(expected) - {seq for seq, _ in received}) for received in everyone)

    def lag(group: list[list[tuple[int, float]]]) -> list[float]:
        return [(at - stored[seq]) * 1000 for received in group for seq, at in received if seq in stored]

    return {
        "watchers": outcome["watchers"],
        "probes": len(outcome["probes"]),
        "connected": len(everyone),
        "connect_failures": outcome["connect_failures"],
        "events_in_run": len(expected),
        "text_deltas_in_run": text_deltas,
        "clients_with_every_event": complete,
        "events_missing": missing,
        "error_rate": round((outcome["watchers"] - complete) / max(1, outcome["watchers"]), 4),
        "connect": summary(outcome["connect_ms"]),
        # The server's figure: probes in the bench process, which parse only their own few sockets.
        "delivery_lag": summary(lag(outcome["probes"])),
        # The crowd's receive times, in a second process that timestamps and keeps each frame.
        "delivery_lag_crowd": summary(lag(outcome["crowd"])),
    }
