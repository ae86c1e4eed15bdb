"""`bench turn`: posted message -> first streamed event and -> persisted reply, with a real worker.

Runs against the services of DATABASE_URL / REDIS_URL with the offline provider. Each turn is
posted through the same service the API calls; the clock stops when the run's first event,
and then its `run_finished` event (published after the turn is committed), reach a channel
subscribed to the conversation group, as a browser would see them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection

from agents.chat import message_send
from agents.events import conversation_group
from bench._options import non_negative, positive
from controlcenter.processes import WorkerProcess, services_env
from conversations.services import conversation_create

# `manage.py bench` runs it in a scratch database (NAME_bench) and drops that afterwards.
WRITES_DATABASE = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=positive, default=100)
    parser.add_argument("--warmup", type=non_negative, default=5)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


async def _measure(conversation: Any, turns: int, warmup: int) -> tuple[list[float], list[float]]:
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(conversation_group(conversation.pk), channel)
    send = sync_to_async(message_send)
    first_event_ms: list[float] = []
    reply_ms: list[float] = []
    for index in range(warmup + turns):
        started = time.perf_counter()
        _, run_ = await send(conversation=conversation, text=f"turn {index}: say something")
        first = None
        while True:
            event = json.loads((await asyncio.wait_for(layer.receive(channel), timeout=30))["text"])
            # The conversation's group also carries conversation_changed, which belongs to no run.
            if event.get("run_id") != run_.pk:
                continue
            first = first or time.perf_counter()
            if event["type"] == "run_finished":
                done = time.perf_counter()
                break
        if index >= warmup:
            first_event_ms.append((first - started) * 1000)
            reply_ms.append((done - started) * 1000)
    return first_event_ms, reply_ms


def run(options: dict[str, Any]) -> dict[str, Any]:
    if settings.CC_MODE != "services" or settings.CC_PROVIDER != "offline":
        raise SystemExit("bench turn needs DATABASE_URL, REDIS_URL and the offline provider")
    user, _ = get_user_model().objects.get_or_create(username="bench-turn")
    conversation = conversation_create(owner=user, title=f"bench turn {uuid.uuid4().hex[:6]}")
    log_dir = Path(tempfile.mkdtemp(prefix="cc-bench-turn-"))
    worker = WorkerProcess(
        services_env(connection.settings_dict["NAME"]), f"bench-{uuid.uuid4().hex[:6]}@%h", log_dir / "worker.log"
    )
    worker.wait_ready(timeout=120)  # a loaded machine can take a while to start Celery
    try:
        first_event_ms, reply_ms = async_to_sync(_measure)(conversation, options["turns"], options["warmup"])
    finally:
        worker.stop()
    return {
        "turns": options["turns"],
        "first_event_p50_ms": round(statistics.median(first_event_ms), 2),
        "first_event_p99_ms": round(_percentile(first_event_ms, 0.99), 2),
        "reply_p50_ms": round(statistics.median(reply_ms), 2),
        "reply_p99_ms": round(_percentile(reply_ms, 0.99), 2),
        "target_reply_p50_ms": 150,
        "target_first_event_p99_ms": 100,
    }
