"""The one helper every run event goes through (STYLE #7).

An event is stored in the run's event log (so a late client can catch up with
`GET /api/runs/<id>/events?after=N`) and sent to the Channels groups of the run
and of its conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.db.models import Max
from redis.exceptions import ConnectionError as RedisConnectionError

from agents.dashboard import dashboard_snapshot
from agents.models import Run, RunEvent
from controlcenter.db import reconnecting

logger = logging.getLogger(__name__)

_server_loop: asyncio.AbstractEventLoop | None = None
_sender_loop: asyncio.AbstractEventLoop | None = None
_sender_lock = threading.Lock()

# Deltas closer together than this are sent as one event: a model streams tokens far
# faster than a person reads, and every event costs a database row, a broadcast, and a frame
# per watching socket in the web process (RN-1). At 30 ms a 3 s reply was 71 events; at 100 ms
# (ten updates a second, still fluid to read) 34, and the web process spent 0.7x the CPU
# streaming it to 200 watchers (bench load --phases watch, three runs back to back).
DELTA_COALESCE_SECONDS = 0.1
# The events after which a run's owner's dashboards get fresh figures (runs in flight, waiting).
DASHBOARD_EVENTS = frozenset({"run_started", "approval_requested", "approval_decided", "run_finished"})


def register_server_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The ASGI server's loop; in embedded mode the in-memory layer's queues belong to it."""
    global _server_loop
    _server_loop = loop


def _loop_for_sending() -> asyncio.AbstractEventLoop:
    """One long-lived loop for broadcasts from synchronous code.

    A fresh loop per send (plain async_to_sync) would open a new Redis connection for
    every event. The embedded server's loop is used when there is one, because the
    in-memory layer only delivers within its own loop.
    """
    global _sender_loop
    if _server_loop is not None and _server_loop.is_running():
        return _server_loop
    with _sender_lock:
        if _sender_loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, daemon=True, name="cc-event-sender").start()
            _sender_loop = loop
        return _sender_loop


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def conversation_group(conversation_id: int) -> str:
    return f"conversation-{conversation_id}"


async def over_fresh_connection(call: Callable[[], Awaitable[None]]) -> None:
    """A channel-layer call, once more if Redis dropped the connection it went out on.

    After a Redis restart every connection in the layer's pool is dead, and each fails on its
    next use; the pool then replaces it. One more try goes out on a new connection, so the first
    event after a restart is not lost to a connection that died before it was sent. A Redis that
    is still down fails the second try too, and the caller logs it.
    """
    try:
        await call()
    except RedisConnectionError:
        await call()


async def _send_to_groups(groups: list[str], message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    for group in groups:

        async def send(group: str = group) -> None:
            await layer.group_send(group, message)

        await over_fresh_connection(send)


def broadcast(groups: list[str], message: dict[str, Any]) -> None:
    asyncio.run_coroutine_threadsafe(_send_to_groups(groups, message), _loop_for_sending()).result(timeout=10)


def frame(message_type: str, body: dict[str, Any]) -> dict[str, Any]:
    """A channel-layer message carrying `body` already as the websocket's JSON text (RN-1).

    Serialised once here, by the sender, instead of once per watching socket: each consumer
    sends the same text as it is (with 200 watchers of one run, 200 encodings became one).
    """
    return {"type": message_type, "text": json.dumps(body, ensure_ascii=False)}


class RunEventPublisher:
    def __init__(self, run: Run) -> None:
        self.run = run
        last = RunEvent.objects.filter(run=run).aggregate(last=Max("seq"))["last"]
        self.seq = last or 0
        self._pending: dict[str, Any] | None = None
        self._last_delta_sent = 0.0

    def publish(self, event_type: str, payload: dict[str, Any]) -> None:
        if event_type == "text_delta":
            self._buffer_delta(payload)
            return
        self.flush()
        self._send(event_type, payload)

    def flush(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._send("text_delta", pending)

    def _buffer_delta(self, payload: dict[str, Any]) -> None:
        if self._pending is not None and self._pending["step"] == payload["step"]:
            self._pending["text"] += payload["text"]
        else:
            self.flush()
            self._pending = dict(payload)
        now = time.monotonic()
        if now - self._last_delta_sent >= DELTA_COALESCE_SECONDS:
            self._last_delta_sent = now
            self.flush()

    def _store(self, event_type: str, payload: dict[str, Any]) -> None:
        for _attempt in range(20):
            # Counted only once stored: a retry after a dropped connection reuses the number.
            seq = self.seq + 1
            try:
                # Inside a caller's transaction a clash must roll back to a savepoint; outside one an
                # autocommit insert keeps a dropped connection something `reconnecting` can retry.
                with transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext():
                    RunEvent.objects.create(run=self.run, seq=seq, type=event_type, payload=payload)
                self.seq = seq
                return
            except IntegrityError:
                # Another process wrote to this log meanwhile (a subagent's approval while its
                # parent runs, TD-14): continue after the last event stored.
                self.seq = RunEvent.objects.filter(run=self.run).aggregate(last=Max("seq"))["last"] or 0
        raise RuntimeError(f"could not number an event of run {self.run.pk}: its log keeps moving")

    def _send(self, event_type: str, payload: dict[str, Any]) -> None:
        # Every event is written, so this is where a dropped database connection shows first.
        reconnecting(lambda: self._store(event_type, payload))
        event = {"run_id": self.run.pk, "seq": self.seq, "type": event_type, "payload": payload}
        # Whoever is told of an event may look for it in the log at once: a page that redraws
        # replays the log and drops what it was told before. So inside a caller's transaction (a
        # person's decision on an approval) the event goes out when that commits, never before.
        transaction.on_commit(lambda: self._broadcast(event_type, event))

    def _broadcast(self, event_type: str, event: dict[str, Any]) -> None:
        try:
            broadcast([run_group(self.run.pk), conversation_group(self.run.conversation_id)], frame("run.event", event))
        except Exception:
            # The event is in the log; a live viewer catches up from there.
            logger.exception("could not broadcast event %s of run %s", event["seq"], self.run.pk)
        if event_type in DASHBOARD_EVENTS:
            # A run starting, waiting, resuming or ending (however it ends) moves its owner's dashboards.
            publish_dashboard_update(user_id=self.run.conversation.owner_id)


def publish_conversation_changed(*, conversation_id: int, reason: str) -> None:
    """Tell every tab on a conversation that it changed (a prompt sent from another tab or the API,
    a retry, a branch, a rewind; a rename or pick, `reason` "updated"): they fetch the messages
    fragment again, or the title and pickers (UX-4). Not stored: a tab that reconnects refetches
    both anyway."""
    event = {"type": "conversation_changed", "conversation_id": conversation_id, "reason": reason}
    try:
        broadcast([conversation_group(conversation_id)], frame("run.event", event))
    except Exception:
        logger.exception("could not announce a change of conversation %s", conversation_id)


def on_conversation_changed(sender: object, *, conversation_id: int, reason: str, **_: object) -> None:
    """The receiver of `conversations.signals.conversation_changed`: a branch, a rewind, a deleted
    message, a rename or pick and a checkpoint, which queue no run, reach the open tabs as a queued
    run does; the page tells them apart by `reason`."""
    publish_conversation_changed(conversation_id=conversation_id, reason=reason)


# --- the observability dashboard ------------------------------------------------------


def dashboard_group(user_id: int) -> str:
    return f"dashboard-{user_id}"


async def _group_watched(group: str) -> bool:
    """Whether any socket may be in `group`: a stale member (a consumer that died without leaving)
    counts until the layer's group expiry, so a "no" is always right and a "yes" may be spare."""
    layer = get_channel_layer()
    if isinstance(layer, RedisChannelLayer):
        # The key, shard and scores group_send reads (channels_redis has no public membership query).
        async def members() -> int:
            connection = layer.connection(layer.consistent_hash(group))
            return await connection.zcount(layer._group_key(group), int(time.time()) - layer.group_expiry, "+inf")

        try:
            return bool(await members())
        except RedisConnectionError:  # as over_fresh_connection: once more after a Redis restart
            return bool(await members())
    if isinstance(layer, InMemoryChannelLayer):
        return bool(layer.groups.get(group))
    return layer is not None  # a layer that cannot be asked is taken as watched


def group_watched(group: str) -> bool:
    return asyncio.run_coroutine_threadsafe(_group_watched(group), _loop_for_sending()).result(timeout=10)


def publish_dashboard_update(*, user_id: int) -> None:
    """Send the user's fresh dashboard figures to their open dashboards.

    Sent after every run_finished event, once the run's outcome is stored. The figures are computed here,
    by the sender, so the consumer stays transport. A failure is logged and swallowed:
    the run is already committed, and a reload shows the same figures.

    Only computed while one of the user's dashboards is open: the snapshot is about fourteen
    aggregate queries over the user's last two weeks, and the worker makes it in the middle of
    the run (after run_started, before the model is called), so with nobody watching it
    only delayed the reply (bench turn: reply p50 +60 ms once run_started sent one too).
    A dashboard opened later draws the page's own snapshot.
    """
    try:
        if not group_watched(dashboard_group(user_id)):
            return
        user = get_user_model().objects.get(pk=user_id)
        snapshot = dashboard_snapshot(user=user)
        broadcast(
            [dashboard_group(user_id)], frame("dashboard.update", {"type": "dashboard_update", "snapshot": snapshot})
        )
    except Exception:
        logger.exception("could not send the dashboard update of user %s", user_id)
