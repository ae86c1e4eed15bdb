"""What the emulator answers and when: clocks, reply policies and injected faults."""

from __future__ import annotations

import copy
import hashlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engine.request import canonical_json


class Clock(Protocol):
    def now(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()


class TestClock:
    """Time that moves only when a test says so."""

    __test__ = False  # not a pytest test class

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


Policy = Callable[[dict[str, Any]], list[dict[str, Any]]]


def default_policy(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Answer with text that shows what the emulator understood."""
    messages = payload["messages"]
    text = plain_text(messages[-1].get("content")) if messages else ""
    words = text.split()
    return [
        {
            "type": "text",
            "text": f"This is the Control Center API emulator. I read {len(words)} words in your last message.",
        }
    ]


class ScriptedPolicy:
    """Replies in order, one per new conversation state.

    The same conversation (same messages) gets the same reply again, so a request
    retried after a fault or a stream cut sees what the first attempt would have.
    After the script runs out, `fallback` answers.
    """

    def __init__(self, replies: list[str | list[dict[str, Any]]], *, fallback: Policy = default_policy) -> None:
        self._replies = deque(replies)
        self._seen: dict[bytes, list[dict[str, Any]]] = {}
        self._fallback = fallback
        self._lock = threading.Lock()

    def __call__(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        key = hashlib.sha256(canonical_json(strip_cache_control(payload["messages"]))).digest()
        with self._lock:
            if key not in self._seen:
                if self._replies:
                    reply = self._replies.popleft()
                    self._seen[key] = [{"type": "text", "text": reply}] if isinstance(reply, str) else reply
                else:
                    self._seen[key] = self._fallback(payload)
            return copy.deepcopy(self._seen[key])

    @property
    def remaining(self) -> int:
        return len(self._replies)


@dataclass(frozen=True)
class Fault:
    """A failure to inject into the next request.

    `rate_limit` (429) and `overloaded` (529) refuse the request; `stream_cut` drops
    the connection after `after_chars` characters of text; `stream_overloaded` sends
    an `overloaded_error` event there instead, as the API does mid-stream.
    """

    kind: str
    retry_after: float | None = None
    after_chars: int = 0


def strip_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [strip_cache_control(v) for v in value]
    return value


def plain_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if block.get("type") == "text":
            parts.append(block.get("text", ""))
        elif block.get("type") == "tool_result":
            parts.append(plain_text(block.get("content")))
    return " ".join(parts)
