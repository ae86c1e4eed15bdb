"""Websockets over time in services mode (OP-1): idle sockets, and sockets watching a continuous stream.

`python manage.py bench soak --minutes 10 --json`. A private stack (own redis-server, one web
process, one worker), the Anthropic adapter against the emulator. For the whole time:

- `--idle` sockets on a conversation where nothing happens;
- `--watchers` sockets on a conversation where runs stream back to back (each one a text of
  `--words` deltas, `--delta-ms` apart), so there is always something on the wire.

Figures: disconnects (a socket the server closed; the bench does not reconnect, so every close
counts), lost events (stored but not received by a socket that stayed open), duplicates, and the
lag from an event being stored (`created_at`) to its arrival, p50/p99, per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import websockets
from django.conf import settings
from django.db import connection

from bench._options import non_negative, non_negative_number, positive, positive_number
from bench.load import _bench_user, _session_cookie, _token, summary
from controlcenter.stack import Stack
from engine.emulator import Emulator
from engine.emulator.server import EmulatorServer

# `manage.py bench` runs it in a scratch database (NAME_bench) and drops that afterwards.
WRITES_DATABASE = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=positive_number, default=10.0)
    parser.add_argument("--idle", type=non_negative, default=20, help="idle websockets")
    parser.add_argument("--watchers", type=non_negative, default=20, help="websockets watching the streaming runs")
    parser.add_argument("--words", type=positive, default=400, help="text deltas per streaming run")
    parser.add_argument("--delta-ms", type=non_negative_number, default=25.0)


def run(options: dict[str, Any]) -> dict[str, Any]:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if settings.CC_MODE != "services":
        raise SystemExit("bench soak needs DATABASE_URL and REDIS_URL (PostgreSQL and a local redis-server)")
    workdir = Path(tempfile.mkdtemp(prefix="cc-bench-soak-"))
    answer = " ".join(f"w{i}" for i in range(options["words"]))
    emulator = EmulatorServer(
        Emulator(policy=lambda payload: [{"type": "text", "text": answer}]),
        first_token_ms=50,
        delta_ms=options["delta_ms"],
    ).start()
    stack = Stack(
        connection.settings_dict["NAME"],
        workdir,
        {
            "CC_PROVIDER": "anthropic",
            "CC_MODEL": "claude-sonnet-4-5",
            "ANTHROPIC_API_KEY": "bench-not-a-real-key",
            "ANTHROPIC_BASE_URL": emulator.base_url,
            "LOG_LEVEL": "WARNING",
        },
    )
    user = _bench_user()
    try:
        web = stack.start_web()
        stack.start_worker()
        figures = asyncio.run(
            _soak(web.base_url, _token(user), _session_cookie(web.base_url, user.get_username()), options)
        )
        log = (workdir / "web-0.log").read_text()
        figures["web_log_timeouts"] = log.count("Timeout reading")
    finally:
        stack.stop()
        emulator.stop()
    figures["setup"] = {k: options[k] for k in ("minutes", "idle", "watchers", "words", "delta_ms")}
    figures["logs"] = str(workdir)
    return figures


async def _soak(base_url: str, token: str, cookie: str, options: dict[str, Any]) -> dict[str, Any]:
    http = httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Token {token}"}, timeout=60)
    quiet = (await http.post("/api/conversations/", json={"title": "soak idle"})).json()["id"]
    busy = (await http.post("/api/conversations/", json={"title": "soak stream"})).json()["id"]
    ws = base_url.replace("http", "ws")
    headers = {"Cookie": cookie, "Origin": base_url}
    idle = [
        await websockets.connect(f"{ws}/ws/conversations/{quiet}/", additional_headers=headers)
        for _ in range(options["idle"])
    ]
    watchers = [
        await websockets.connect(f"{ws}/ws/conversations/{busy}/", additional_headers=headers, max_size=None)
        for _ in range(options["watchers"])
    ]
    received: list[list[tuple[int, int, float]]] = [[] for _ in watchers]  # (run, seq, arrival wall time)
    closed_at: dict[str, list[float]] = {"idle": [], "streaming": []}
    started = time.monotonic()
    deadline = started + options["minutes"] * 60

    async def listen(index: int, socket_: Any, kind: str) -> None:
        try:
            async for message in socket_:
                event = json.loads(message)
                if kind == "streaming" and "seq" in event:
                    received[index].append((event["run_id"], event["seq"], time.time()))
        except websockets.ConnectionClosed:
            pass
        if time.monotonic() < deadline:
            closed_at[kind].append(round(time.monotonic() - started, 1))

    listeners = [asyncio.create_task(listen(i, s, "idle")) for i, s in enumerate(idle)]
    listeners += [asyncio.create_task(listen(i, s, "streaming")) for i, s in enumerate(watchers)]
    run_ids = []
    while time.monotonic() < deadline:
        sent = await http.post(f"/api/conversations/{busy}/messages/", json={"text": f"stream {len(run_ids)}"})
        run_id = sent.json()["run"]["id"]
        run_ids.append(run_id)
        while (await http.get(f"/api/runs/{run_id}/")).json()["status"] in ("queued", "running"):
            await asyncio.sleep(0.2)
    await asyncio.sleep(2)  # the last events in flight
    for socket_ in [*idle, *watchers]:
        await socket_.close()
    await asyncio.gather(*listeners)

    stored: dict[tuple[int, int], float] = {}
    for run_id in run_ids:
        for event in (await http.get(f"/api/runs/{run_id}/events/")).json():
            stored[(run_id, event["seq"])] = datetime.fromisoformat(event["created_at"]).timestamp()
    await http.aclose()
    lost = duplicates = 0
    lags = []
    for events in received:
        keys = [(run, seq) for run, seq, _ in events]
        duplicates += len(keys) - len(set(keys))
        lost += len(set(stored) - set(keys))
        lags += [(arrival - stored[(run, seq)]) * 1000 for run, seq, arrival in events if (run, seq) in stored]
    return {
        "idle": {"sockets": len(idle), "disconnects": len(closed_at["idle"]), "closed_after_s": closed_at["idle"]},
        "streaming": {
            "sockets": len(watchers),
            "disconnects": len(closed_at["streaming"]),
            "closed_after_s": closed_at["streaming"],
            "runs": len(run_ids),
            "events_stored": len(stored),
            "lost_events": lost,
            "duplicate_events": duplicates,
            "lag": summary(lags),
        },
        "seconds": round(time.monotonic() - started, 1),
    }
