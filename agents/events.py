"""The one helper every run event goes through (STYLE #7).

An event is stored in the run's event log (so a late client can catch up with
`GET /api/runs/<id>/events?after=N`) and sent to the Channels groups of the run
and of its conversation.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db.models import Max

from agents.models import Run, RunEvent

logger = logging.getLogger(__name__)

_server_loop: asyncio.AbstractEventLoop | None = None


def register_server_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The ASGI server's loop; an in-process worker thread must send on it (embedded mode)."""
    global _server_loop
    _server_loop = loop


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def conversation_group(conversation_id: int) -> str:
    return f"conversation-{conversation_id}"


def _group_send(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    loop = _server_loop
    if loop is not None and loop.is_running() and threading.current_thread() is not threading.main_thread():
        # The in-memory layer's queues belong to the server loop: hand the send to it.
        asyncio.run_coroutine_threadsafe(layer.group_send(group, message), loop).result(timeout=5)
    else:
        async_to_sync(layer.group_send)(group, message)


class RunEventPublisher:
    def __init__(self, run: Run) -> None:
        self.run = run
        last = RunEvent.objects.filter(run=run).aggregate(last=Max("seq"))["last"]
        self.seq = last or 0

    def publish(self, event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        RunEvent.objects.create(run=self.run, seq=self.seq, type=event_type, payload=payload)
        event = {"run_id": self.run.pk, "seq": self.seq, "type": event_type, "payload": payload}
        message = {"type": "run.event", "event": event}
        try:
            _group_send(run_group(self.run.pk), message)
            _group_send(conversation_group(self.run.conversation_id), message)
        except Exception:
            # The event is in the log; a live viewer catches up from there.
            logger.exception("could not broadcast event %s of run %s", self.seq, self.run.pk)
        return event
