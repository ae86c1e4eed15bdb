"""Any OpenAI-compatible chat-completions endpoint through the official `openai` SDK.

OpenAI, vLLM, Ollama and llama.cpp server cache prompt prefixes automatically, so
cache points are not sent; what they report is `cached_tokens`, a subset of
`prompt_tokens` (Anthropic's fields are disjoint), mapped here to the neutral
record as cache reads plus uncached input.

The chat shape has no deferred tools: a `defer_loading` tool is sent only once a
`tool_reference` in a tool result has loaded it, appended after the resident tools
(never merged among them, TD-11), and the reference itself reads as a line of text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import openai

from engine.providers.protocol import (
    MessageDone,
    PromptTooLong,
    ProviderEvent,
    StreamInterrupted,
    TextDelta,
    ToolUseBlock,
    Usage,
    error_for_status,
)
from engine.providers.retry import parse_retry_after, transport_errors
from engine.request import ModelRequestSpec, referenced_tools

_CONTEXT = re.compile(r"maximum context length is (\d+) tokens.*?resulted in (\d+) tokens", re.DOTALL)
_STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "content_filter": "refusal"}


class OpenAICompatProvider:
    name = "openai"
    # No deferred tools in the chat shape: a loaded tool is appended to `tools`, which
    # changes the cached prefix from there on; the runtime records that miss (TD-11).
    defers_tool_loading = False
    # Chat completions has no assistant prefill: a cut stream is replayed instead.
    supports_prefill = False

    def __init__(self, *, api_key: str | None, base_url: str | None = None, timeout: float = 600.0) -> None:
        # Local servers (Ollama, vLLM) need no key, but the SDK insists on one.
        self._client = openai.OpenAI(api_key=api_key or "unused", base_url=base_url, max_retries=0, timeout=timeout)

    def stream(self, request: ModelRequestSpec) -> Iterator[ProviderEvent]:
        try:
            chunks = self._client.chat.completions.create(
                **to_chat_payload(request), stream=True, stream_options={"include_usage": True}
            )
            yield from self._read(chunks)
        except openai.APIStatusError as exc:
            raise _map_error(exc) from exc
        except (openai.APIConnectionError, *transport_errors()) as exc:
            raise StreamInterrupted(f"connection to the OpenAI-compatible API failed: {exc}") from exc

    def _read(self, chunks: Any) -> Iterator[ProviderEvent]:
        text = ""
        calls: dict[int, dict[str, str]] = {}
        finish_reason = ""
        usage: Usage | None = None
        for chunk in chunks:
            if chunk.usage is not None:
                usage = _usage(chunk.usage)
            for choice in chunk.choices:
                delta = choice.delta
                if delta.content:
                    text += delta.content
                    yield TextDelta(delta.content)
                for call in delta.tool_calls or []:
                    slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] = call.id or slot["id"]
                    if call.function is not None:
                        slot["name"] = call.function.name or slot["name"]
                        slot["arguments"] += call.function.arguments or ""
                if choice.finish_reason:
                    finish_reason = choice.finish_reason
        if not finish_reason:
            raise StreamInterrupted("the chat-completions stream ended before a finish_reason")
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        for index in sorted(calls):
            slot = calls[index]
            block = ToolUseBlock(id=slot["id"], name=slot["name"], input=json.loads(slot["arguments"] or "{}"))
            yield block
            content.append({"type": "tool_use", "id": block.id, "name": block.name, "input": block.input})
        yield MessageDone(
            content=content, stop_reason=_STOP_REASONS.get(finish_reason, finish_reason), usage=usage or Usage()
        )


def _usage(usage: Any) -> Usage:
    details = getattr(usage, "prompt_tokens_details", None)
    cached = (getattr(details, "cached_tokens", None) or 0) if details is not None else 0
    return Usage(
        input_tokens=usage.prompt_tokens - cached,
        cache_read_input_tokens=cached,
        output_tokens=usage.completion_tokens or 0,
    )


def _map_error(exc: openai.APIStatusError) -> Exception:
    body = exc.body if isinstance(exc.body, dict) else {}
    error = body.get("error", body) if isinstance(body.get("error", body), dict) else {}
    message = error.get("message") or str(exc)
    if error.get("code") == "context_length_exceeded":
        found = _CONTEXT.search(message)
        tokens, maximum = (int(found.group(2)), int(found.group(1))) if found else (None, None)
        return PromptTooLong(message, tokens=tokens, maximum=maximum)
    return error_for_status(exc.status_code, message, retry_after=parse_retry_after(exc.response.headers))


def to_chat_payload(request: ModelRequestSpec) -> dict[str, Any]:
    """The canonical (Anthropic-shaped) request as a chat-completions payload."""
    tools = request.tools
    by_name = {tool["name"]: tool for tool in tools}
    loaded = [name for name in referenced_tools(request.messages) if name in by_name]
    offered = [tool for tool in tools if not tool.get("defer_loading")]
    offered += [by_name[name] for name in loaded if by_name[name].get("defer_loading")]
    messages: list[dict[str, Any]] = []
    system = "\n\n".join(block.get("text", "") for block in request.system if block.get("type") == "text")
    if system:
        messages.append({"role": "system", "content": system})
    for message in request.messages:
        messages.extend(_chat_messages(message))
    payload: dict[str, Any] = {"model": request.model, "messages": messages, "max_tokens": request.max_tokens}
    if offered:
        payload["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool["name"],
                    "description": tool.get("description", ""),
                    "parameters": tool.get("input_schema", {"type": "object", "properties": {}}),
                },
            }
            for tool in offered
        ]
    return payload


def _chat_messages(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    if isinstance(content, str):
        return [{"role": message["role"], "content": content}]
    if message["role"] == "assistant":
        text = "".join(block.get("text", "") for block in content if block.get("type") == "text")
        calls = [
            {
                "id": block["id"],
                "type": "function",
                "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}), sort_keys=True)},
            }
            for block in content
            if block.get("type") == "tool_use"
        ]
        out: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            out["tool_calls"] = calls
        return [out]
    # Tool results must directly follow the assistant's tool calls, before any user text.
    results = [
        {"role": "tool", "tool_call_id": block["tool_use_id"], "content": _result_text(block.get("content"))}
        for block in content
        if block.get("type") == "tool_result"
    ]
    parts = [_user_part(block) for block in content if block.get("type") in ("text", "image")]
    if not parts:
        return results
    if all(part["type"] == "text" for part in parts):
        return [*results, {"role": "user", "content": "\n\n".join(part["text"] for part in parts)}]
    return [*results, {"role": "user", "content": parts}]


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    lines = []
    for item in content or []:
        if item.get("type") == "text":
            lines.append(item.get("text", ""))
        elif item.get("type") == "tool_reference":
            lines.append(f"Tool loaded: {item.get('tool_name')}")
    return "\n".join(lines)


def _user_part(block: dict[str, Any]) -> dict[str, Any]:
    if block["type"] == "text":
        return {"type": "text", "text": block.get("text", "")}
    source = block.get("source", {})
    url = source.get("url") or f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    return {"type": "image_url", "image_url": {"url": url}}
