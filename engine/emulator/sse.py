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
from engine.tokens import CHARS_PER_TOKEN, estimate_json_tokens, estimate_text_tokens


@dataclass
class Shaped:
    """A reply cut as the API cuts it: at a stop sequence or at `max_tokens`."""

    content: list[dict[str, Any]]
    stop_reason: str
    stop_sequence: str | None
    output_tokens: int
    # index of a tool_use cut by max_tokens -> the part of its input JSON that was produced
    partial_json: dict[int, str] = field(default_factory=dict)


def shape_reply(
    content: list[dict[str, Any]],
    *,
    max_tokens: int,
    stop_sequences: list[str],
    stop: str | None = None,
) -> Shaped:
    """Apply stop sequences and the `max_tokens` limit to what the policy answered."""
    out: list[dict[str, Any]] = []
    used = 0
    partial: dict[int, str] = {}
    for block in content:
        left = max_tokens - used
        if block.get("type") in ("text", "thinking"):
            key = block["type"]
            text = block[key]
            if key == "text" and stop_sequences:
                found = [(text.find(s), s) for s in stop_sequences if s in text]
                if found:
                    at, sequence = min(found)
                    text = text[:at]
                    if estimate_text_tokens(text) <= left:
                        if text:
                            out.append({**block, "text": text})
                        return Shaped(out, "stop_sequence", sequence, max(used + estimate_text_tokens(text), 1))
            tokens = estimate_text_tokens(text)
            if tokens > left:
                text = text[: left * CHARS_PER_TOKEN]
                if text:
                    out.append({**block, key: text})
                return Shaped(out, "max_tokens", None, max_tokens)
            used += tokens
            out.append({**block, key: text})
        else:
            tokens = estimate_json_tokens(block)
            if tokens > left:
                if block.get("type") == "tool_use":
                    # The call is cut mid-input: the block is there, its input incomplete.
                    arguments = json.dumps(block.get("input", {}), sort_keys=True)
                    partial[len(out)] = arguments[: max(left, 0) * CHARS_PER_TOKEN]
                    out.append({**block, "input": {}})
                return Shaped(out, "max_tokens", None, max_tokens, partial)
            used += tokens
            out.append(block)
    if stop is None:
        stop = "tool_use" if any(b.get("type") == "tool_use" for b in out) else "end_turn"
    return Shaped(out, stop, None, max(used, 1))


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
    stop_reason: str = "end_turn"
    stop_sequence: str | None = None
    partial_json: dict[int, str] = field(default_factory=dict)

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
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
            "usage": self.usage.as_anthropic(),
        }

    def delta_count(self) -> int:
        """How many deltas the stream of this answer has (latency of a whole, non-streamed answer)."""
        return sum(1 for event, _data in self._events(dry=True) if event == "content_block_delta")

    def sse_events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The Messages streaming events.

        A `stream_cut` fault raises StreamCut where the connection drops; a
        `stream_overloaded` fault sends the API's mid-stream `error` event there.
        """
        try:
            yield from self._events()
        except _StreamError as exc:
            yield exc.event

    def _events(self, *, dry: bool = False) -> Iterator[tuple[str, dict[str, Any]]]:
        if not dry:
            self.start()
        start_usage = {**self.usage.as_anthropic(), "output_tokens": 1}
        yield (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    **self.message(),
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
        )
        faulted = not dry and self.fault is not None and self.fault.kind in ("stream_cut", "stream_overloaded")
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
            elif block["type"] == "thinking":
                yield (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                    },
                )
                for chunk in word_chunks(block["thinking"]):
                    yield (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "thinking_delta", "thinking": chunk},
                        },
                    )
                yield (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "signature_delta", "signature": block["signature"]},
                    },
                )
            elif block["type"] in ("tool_use", "server_tool_use"):
                if budget is not None:
                    self._interrupt(streamed)
                yield (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}},
                )
                arguments = self.partial_json.get(index)
                if arguments is None:
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
            else:
                # Results of server tools and redacted thinking arrive whole in their start event.
                yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
            yield "content_block_stop", {"type": "content_block_stop", "index": index}
        if budget is not None:
            self._interrupt(streamed)
        yield (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence},
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
