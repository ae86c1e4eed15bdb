"""A Messages response, as JSON and as the API's server-sent events."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

from engine.emulator.accounting import Usage
from engine.emulator.cache import Entry, PrefixCache
from engine.emulator.policy import Fault
from engine.emulator.validation import StreamCut


def stop_reason(content: list[dict[str, Any]]) -> str:
    return "tool_use" if any(b.get("type") == "tool_use" for b in content) else "end_turn"


def word_chunks(text: str) -> list[str]:
    return re.findall(r"\S+\s*|\s+", text) or [text]


@dataclass
class PendingResponse:
    cache: PrefixCache
    id: str
    model: str
    content: list[dict[str, Any]]
    usage: Usage
    writes: list[tuple[str, Entry]]
    fault: Fault | None = None
    started: bool = field(default=False)

    def start(self) -> None:
        """The response starts streaming: what this request writes becomes readable."""
        if not self.started:
            self.started = True
            self.cache.commit(self.writes)

    def message(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.content,
            "stop_reason": stop_reason(self.content),
            "stop_sequence": None,
            "usage": self.usage.as_anthropic(),
        }

    def sse_events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The Messages streaming events.

        A `stream_cut` fault raises StreamCut where the connection drops; a
        `stream_overloaded` fault sends the API's mid-stream `error` event there.
        """
        try:
            yield from self._events()
        except _StreamError as exc:
            yield exc.event

    def _events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        self.start()
        start_usage = {**self.usage.as_anthropic(), "output_tokens": 1}
        yield (
            "message_start",
            {
                "type": "message_start",
                "message": {**self.message(), "content": [], "stop_reason": None, "usage": start_usage},
            },
        )
        faulted = self.fault is not None and self.fault.kind in ("stream_cut", "stream_overloaded")
        budget = self.fault.after_chars if faulted and self.fault is not None else None
        streamed = 0
        for index, block in enumerate(self.content):
            if block["type"] == "text":
                yield (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
                )
                for chunk in word_chunks(block["text"]):
                    if budget is not None and streamed + len(chunk) > budget:
                        self._interrupt(streamed)
                    streamed += len(chunk)
                    yield (
                        "content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": chunk}},
                    )
            else:
                if budget is not None:
                    self._interrupt(streamed)
                yield (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}},
                )
                arguments = json.dumps(block.get("input", {}), sort_keys=True)
                for i in range(0, len(arguments), 16):
                    yield (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": arguments[i : i + 16]},
                        },
                    )
            yield "content_block_stop", {"type": "content_block_stop", "index": index}
        if budget is not None:
            self._interrupt(streamed)
        yield (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason(self.content), "stop_sequence": None},
                "usage": {"output_tokens": self.usage.output_tokens},
            },
        )
        yield "message_stop", {"type": "message_stop"}

    def _interrupt(self, streamed: int) -> NoReturn:
        if self.fault is not None and self.fault.kind == "stream_overloaded":
            raise _StreamError(
                ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
            )
        raise StreamCut(f"stream cut after {streamed} characters")


class _StreamError(Exception):
    def __init__(self, event: tuple[str, dict[str, Any]]) -> None:
        super().__init__(event[1]["error"]["message"])
        self.event = event
