"""The OpenAI-compatible chat-completions route (automatic prefix caching)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.emulator.accounting import output_tokens
from engine.emulator.cache import Entry, PrefixCache
from engine.emulator.policy import Fault
from engine.emulator.sse import word_chunks
from engine.emulator.validation import ApiError, StreamCut
from engine.request import canonical_json
from engine.tokens import estimate_json_tokens

if TYPE_CHECKING:
    from engine.emulator.core import Emulator

OPENAI_MIN_CACHE_TOKENS = 1024
OPENAI_CACHE_STEP = 128
OPENAI_CACHE_TTL = 300.0


def openai_begin(emulator: Emulator, payload: dict[str, Any]) -> OpenAIPendingResponse:
    started_at = emulator.clock.now()
    fault = emulator.next_fault_openai()
    model = payload.get("model")
    messages = payload.get("messages")
    if not isinstance(model, str) or not isinstance(messages, list) or not messages:
        raise ApiError(400, "invalid_request_error", "model and messages are required", param="messages")
    parts = [["tool", t] for t in payload.get("tools") or []] + [["m", m] for m in messages]
    digest = hashlib.sha256(b"model:" + model.encode()).digest()
    hashes, cumulative, total = [], [], 0
    for part in parts:
        digest = hashlib.sha256(digest + canonical_json(part)).digest()
        hashes.append(digest.hex())
        total += estimate_json_tokens(part[1])
        cumulative.append(total)
    if total > emulator.context_window:
        raise ApiError(
            400,
            "invalid_request_error",
            f"This model's maximum context length is {emulator.context_window} tokens. "
            f"However, your messages resulted in {total} tokens. Please reduce the length of the messages.",
            param="messages",
            code="context_length_exceeded",
        )
    cached = 0
    cache = emulator.openai_cache
    with cache.lock:
        for i in range(len(hashes) - 1, -1, -1):
            entry = cache.entries.get(hashes[i])
            if entry is not None and entry.readable and entry.expires_at > started_at:
                entry.expires_at = started_at + OPENAI_CACHE_TTL
                cached = (cumulative[i] // OPENAI_CACHE_STEP) * OPENAI_CACHE_STEP
                break
    if cached < OPENAI_MIN_CACHE_TOKENS:
        cached = 0
    writes = [
        (h, Entry(started_at + OPENAI_CACHE_TTL, "5m", c))
        for h, c in zip(hashes, cumulative, strict=True)
        if c >= OPENAI_MIN_CACHE_TOKENS
    ]
    content = emulator.reply(openai_to_anthropic(payload))
    return OpenAIPendingResponse(
        cache,
        f"chatcmpl-emu{emulator.next_id():08d}",
        model,
        content,
        total,
        cached,
        output_tokens(content),
        writes,
        fault,
    )


@dataclass
class OpenAIPendingResponse:
    cache: PrefixCache
    id: str
    model: str
    content: list[dict[str, Any]]
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    writes: list[tuple[str, Entry]]
    fault: Fault | None = None
    started: bool = False

    def start(self) -> None:
        if not self.started:
            self.started = True
            self.cache.commit(self.writes)

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def _tool_calls(self) -> list[dict[str, Any]]:
        return [
            {
                "id": b["id"],
                "type": "function",
                "function": {"name": b["name"], "arguments": json.dumps(b.get("input", {}), sort_keys=True)},
            }
            for b in self.content
            if b.get("type") == "tool_use"
        ]

    def _finish_reason(self) -> str:
        return "tool_calls" if self._tool_calls() else "stop"

    def completion(self) -> dict[str, Any]:
        self.start()
        text = "".join(b["text"] for b in self.content if b.get("type") == "text")
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if self._tool_calls():
            message["tool_calls"] = self._tool_calls()
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": 0,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish_reason()}],
            "usage": self.usage(),
        }

    def chunks(self, include_usage: bool) -> Iterator[dict[str, Any]]:
        self.start()
        base = {"id": self.id, "object": "chat.completion.chunk", "created": 0, "model": self.model}
        budget = self.fault.after_chars if self.fault and self.fault.kind == "stream_cut" else None
        streamed = 0
        yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
        for block in self.content:
            if block.get("type") != "text":
                continue
            for chunk in word_chunks(block["text"]):
                if budget is not None and streamed + len(chunk) > budget:
                    raise StreamCut(f"stream cut after {streamed} characters")
                streamed += len(chunk)
                yield {**base, "choices": [{"index": 0, "delta": {"content": chunk}, "finish_reason": None}]}
        if budget is not None:
            raise StreamCut(f"stream cut after {streamed} characters")
        for index, call in enumerate(self._tool_calls()):
            yield {
                **base,
                "choices": [{"index": 0, "delta": {"tool_calls": [{"index": index, **call}]}, "finish_reason": None}],
            }
        yield {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": self._finish_reason()}]}
        if include_usage:
            yield {**base, "choices": [], "usage": self.usage()}


def openai_to_anthropic(payload: dict[str, Any]) -> dict[str, Any]:
    """Chat-completions messages as a Messages payload, so one policy answers both routes."""
    system: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []

    def append(role: str, blocks: list[dict[str, Any]]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for message in payload.get("messages", []):
        role = message.get("role")
        content = message.get("content")
        text = (
            content
            if isinstance(content, str)
            else " ".join(p.get("text", "") for p in content or [] if isinstance(p, dict))
        )
        if role in ("system", "developer"):
            system.append({"type": "text", "text": text})
        elif role == "user":
            append("user", [{"type": "text", "text": text}])
        elif role == "tool":
            append("user", [{"type": "tool_result", "tool_use_id": message.get("tool_call_id"), "content": text}])
        elif role == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
            for call in message.get("tool_calls") or []:
                arguments = call.get("function", {}).get("arguments") or "{}"
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.get("id"),
                        "name": call["function"]["name"],
                        "input": json.loads(arguments),
                    }
                )
            append("assistant", blocks or [{"type": "text", "text": ""}])
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            "input_schema": t["function"].get("parameters", {}),
        }
        for t in payload.get("tools") or []
        if t.get("type") == "function"
    ]
    return {"model": payload.get("model"), "max_tokens": 1024, "system": system, "messages": messages, "tools": tools}
