"""The Anthropic Messages API through the official `anthropic` SDK.

The request goes out exactly as `ModelRequestSpec.as_payload()` renders it
(cache_control breakpoints with TTLs, `defer_loading` tools, `tool_reference`
blocks in tool results), so the bytes the cache keys on are ours, not the SDK's.
The SDK's own retries are off: `RetryingProvider` decides, and knows how to
resume a cut stream without repeating text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic

from engine.providers.protocol import (
    AnswerStarted,
    MessageDone,
    ProviderEvent,
    StreamInterrupted,
    TextDelta,
    ToolUseBlock,
    Usage,
    error_for_status,
)
from engine.providers.retry import parse_retry_after, transport_errors
from engine.request import ModelRequestSpec

_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (anthropic.APIConnectionError, *transport_errors())


class AnthropicProvider:
    name = "anthropic"
    # A cut stream can be resumed by sending the text so far as an assistant prefill.
    supports_prefill = True
    # `defer_loading` tools stay out of the cached prefix until a tool_reference loads them (TD-11).
    defers_tool_loading = True

    def __init__(self, *, api_key: str, base_url: str | None = None, timeout: float = 600.0) -> None:
        self._client = anthropic.Anthropic(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout)

    def stream(self, request: ModelRequestSpec) -> Iterator[ProviderEvent]:
        payload = request.as_payload()
        try:
            # Closed however the reading ends (a run cancelled mid-stream included): the connection
            # goes back to a client the process's runs share (agents/providers.py), not to waste.
            with self._client.messages.create(**payload, stream=True) as events:
                response = getattr(events, "response", None)
                request_id = response.headers.get("request-id", "") if response is not None else ""
                yield from self._read(events, request_id)
        except anthropic.APIStatusError as exc:
            # An `error` event inside a 200 stream carries its kind only in the body.
            status = exc.status_code if exc.status_code >= 400 else _STATUS_BY_TYPE.get(_error_type(exc), 500)
            raise error_for_status(
                status, _error_message(exc), retry_after=parse_retry_after(exc.response.headers)
            ) from exc
        except _CONNECTION_ERRORS as exc:
            raise StreamInterrupted(f"connection to the Anthropic API failed: {exc}") from exc

    def _read(self, events: Any, request_id: str = "") -> Iterator[ProviderEvent]:
        blocks: dict[int, dict[str, Any]] = {}
        partial_json: dict[int, str] = {}
        start_usage: Any = None
        output_tokens = 0
        stop_reason = ""
        finished = False
        for event in events:
            kind = event.type
            if kind == "message_start":
                start_usage = event.message.usage
                request_id = request_id or event.message.id
                output_tokens = event.message.usage.output_tokens or 0
                yield AnswerStarted(usage_from_anthropic(start_usage, 0))
            elif kind == "content_block_start":
                block = event.content_block.model_dump(exclude_none=True)
                if block["type"] == "tool_use":
                    block["input"] = {}
                    partial_json[event.index] = ""
                blocks[event.index] = block
            elif kind == "content_block_delta":
                delta = event.delta
                if delta.type == "text_delta":
                    blocks[event.index]["text"] = blocks[event.index].get("text", "") + delta.text
                    yield TextDelta(delta.text)
                elif delta.type == "input_json_delta":
                    partial_json[event.index] += delta.partial_json
                elif delta.type == "thinking_delta":
                    blocks[event.index]["thinking"] = blocks[event.index].get("thinking", "") + delta.thinking
                elif delta.type == "signature_delta":
                    blocks[event.index]["signature"] = delta.signature
            elif kind == "content_block_stop":
                block = blocks[event.index]
                if block["type"] == "tool_use":
                    try:
                        block["input"] = json.loads(partial_json.pop(event.index) or "{}")
                    except json.JSONDecodeError:
                        # Cut by max_tokens mid-input: the stop reason says so, and the call is never run.
                        continue
                    yield ToolUseBlock(id=block["id"], name=block["name"], input=block["input"])
            elif kind == "message_delta":
                stop_reason = event.delta.stop_reason or stop_reason
                output_tokens = event.usage.output_tokens
            elif kind == "message_stop":
                finished = True
        if not finished:
            raise StreamInterrupted("the Anthropic stream ended before message_stop")
        yield MessageDone(
            content=[blocks[i] for i in sorted(blocks)],
            stop_reason=stop_reason or "end_turn",
            usage=usage_from_anthropic(start_usage, output_tokens),
            request_id=request_id,
        )


def usage_from_anthropic(usage: Any, output_tokens: int) -> Usage:
    if usage is None:
        return Usage(output_tokens=output_tokens)
    split = getattr(usage, "cache_creation", None)
    return Usage(
        input_tokens=usage.input_tokens or 0,
        cache_creation_input_tokens=usage.cache_creation_input_tokens or 0,
        cache_read_input_tokens=usage.cache_read_input_tokens or 0,
        output_tokens=output_tokens,
        cache_creation_5m_input_tokens=(split.ephemeral_5m_input_tokens if split else 0) or 0,
        cache_creation_1h_input_tokens=(split.ephemeral_1h_input_tokens if split else 0) or 0,
    )


_STATUS_BY_TYPE = {
    "invalid_request_error": 400,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}


def _error_type(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    error = body.get("error") if isinstance(body, dict) else None
    return error.get("type", "") if isinstance(error, dict) else ""


def _error_message(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
    return str(exc)
