"""Any OpenAI-compatible chat-completions endpoint through the official `openai` SDK.

OpenAI, vLLM, Ollama and llama.cpp server cache prompt prefixes automatically, so
cache points are not sent; what they report is `cached_tokens`, a subset of
`prompt_tokens` (Anthropic's fields are disjoint), mapped here to the neutral
record as cache reads plus uncached input.

Usage is asked for in the stream. A server that sends none (llama-cpp-python's does
not, in streams) is counted with its own tokenizer endpoint where it has one, else
with our estimate, and the figure says which (`Usage.source`): a request that
consumed tokens is never recorded as zero.

The chat shape has no deferred tools: a `defer_loading` tool is sent only once a
`tool_reference` in a tool result has loaded it, appended after the resident tools
(never merged among them, TD-11), and the reference itself reads as a line of text.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import openai

from engine.providers.protocol import (
    MALFORMED_ARGUMENTS,
    InvalidRequest,
    MessageDone,
    Overloaded,
    PromptTooLong,
    ProviderError,
    ProviderEvent,
    RateLimited,
    StreamInterrupted,
    TextDelta,
    ToolUseBlock,
    Usage,
    error_for_status,
)
from engine.providers.retry import parse_retry_after, transport_errors
from engine.request import ModelRequestSpec, referenced_tools
from engine.tokens import estimate_text_tokens

# OpenAI: "...maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens";
# vLLM and llama-cpp-python: "...However, you requested 9000 tokens (8900 in the messages, 100 in the completion)".
_MAXIMUM = re.compile(r"maximum context length is (\d+) tokens")
_MEASURED = re.compile(r"resulted in (\d+) tokens|\((\d+) in the messages")
_STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "content_filter": "refusal"}


class OpenAICompatProvider:
    name = "openai"
    # No deferred tools in the chat shape: a loaded tool is appended to `tools`, which
    # changes the cached prefix from there on; the runtime records that miss (TD-11).
    defers_tool_loading = False
    # Chat completions has no assistant prefill: a cut stream is replayed instead.
    supports_prefill = False

    def __init__(
        self,
        *,
        api_key: str | None,
        base_url: str | None = None,
        timeout: float = 600.0,
        tool_results_as_text: bool = False,
        prompted_tools: bool = False,
        context_window: int | None = None,
    ) -> None:
        # Local servers (Ollama, vLLM) need no key, but the SDK insists on one.
        self._client = openai.OpenAI(api_key=api_key or "unused", base_url=base_url, max_retries=0, timeout=timeout)
        self._base_url = str(self._client.base_url).rstrip("/")
        self._stream_options = True
        # llama-cpp-python's `chatml-function-calling` template drops `tool` messages: the
        # model would never see a result, so they are sent as user text instead.
        self._tool_results_as_text = tool_results_as_text
        self._tokenizer = ServerTokenizer(self._base_url, api_key) if base_url else None
        # llama-cpp-python's chatml-function-calling cannot stream a call the model chooses itself
        # (tool_choice "auto") and ignores max_tokens there: with `prompted_tools` the tools are
        # written into the system prompt in that format's own words, the reply streams as text
        # within max_tokens, and "functions.NAME:" lines are read back as calls. A named
        # tool_choice still goes to the server, whose grammar constrains the arguments.
        self._prompted_tools = prompted_tools
        # The server's window, when known (the local server's n_ctx): llama-cpp-python reports a
        # prompt too long for a stream only in its log, after the first chunk, and ends the stream.
        self._context_window = context_window

    def stream(self, request: ModelRequestSpec) -> Iterator[ProviderEvent]:
        payload = to_chat_payload(request, tool_results_as_text=self._tool_results_as_text)
        prompted = self._prompted_tools and payload.get("tool_choice") == "auto"
        if prompted:
            payload = with_prompted_tools(payload)
        try:
            if prompted:
                yield from _prompted_calls(self._read(self._create(payload), payload))
                return
            try:
                chunks = self._create(payload)
            except openai.BadRequestError as exc:
                # A server that does not know `stream_options` is asked again without it (and usage is counted).
                if not self._stream_options or "stream_options" not in str(exc):
                    raise
                self._stream_options = False
                chunks = self._create(payload)
            try:
                yield from self._read(chunks, payload)
            except _EmptyStream:
                # llama-cpp-python cannot stream a call the model chose itself ("Automatic streaming
                # tool choice is not supported"): its stream ends before the first chunk. Asked again
                # whole, the answer comes back with its usage; the prompt is already in its cache.
                # The broken stream's connection is not reused: the request is sent on a fresh client.
                chunks.response.close()
                with openai.OpenAI(
                    api_key=self._client.api_key, base_url=self._base_url, max_retries=0, timeout=self._client.timeout
                ) as fresh:
                    whole = fresh.chat.completions.create(**payload, stream=False)
                yield from self._read_whole(whole, payload)
        except openai.APIStatusError as exc:
            raise _map_error(exc) from exc
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise StreamInterrupted(f"could not reach the model server at {self._base_url}: {cause}") from exc
        except openai.APIResponseValidationError:
            raise
        except openai.APIError as exc:
            # What remains is the SDK reading an `{"error": ...}` chunk in a 200 stream: the server
            # failed after its answer began, which no status code tells the retrying provider.
            raise _map_stream_error(exc) from exc
        except transport_errors() as exc:
            raise StreamInterrupted(f"the model server at {self._base_url} broke off the response: {exc}") from exc

    def _create(self, payload: dict[str, Any]) -> openai.Stream[Any]:
        options = {"stream_options": {"include_usage": True}} if self._stream_options else {}
        # The payload is built as a plain dict; the SDK's overloads type each keyword separately.
        stream: openai.Stream[Any] = self._client.chat.completions.create(**payload, stream=True, **options)  # type: ignore[call-overload]
        return stream

    def _read(self, chunks: openai.Stream[Any], payload: dict[str, Any]) -> Iterator[ProviderEvent]:
        # Closed when the reader stops, whatever stops it (a retry that gives up, a cancel): an
        # open connection kept llama.cpp's server generating an abandoned answer to its limit for
        # two minutes, every later request waiting behind it.
        with chunks:
            yield from self._events(chunks, payload)

    def _events(self, chunks: openai.Stream[Any], payload: dict[str, Any]) -> Iterator[ProviderEvent]:
        text = ""
        calls: dict[int, dict[str, str]] = {}
        finish_reason = ""
        usage: Usage | None = None
        received = 0
        for chunk in chunks:
            received += 1
            if chunk.usage is not None:
                usage = _usage(chunk.usage)
            for choice in chunk.choices:
                delta = choice.delta
                if delta.content:
                    text += delta.content
                    yield TextDelta(delta.content)
                for call in delta.tool_calls or []:
                    _add_call_delta(calls, call)
                if choice.finish_reason:
                    finish_reason = choice.finish_reason
        if not finish_reason:
            if received == 0 and payload.get("tools") and payload.get("tool_choice") == "auto":
                raise _EmptyStream()
            if not text and not calls:
                self._raise_if_too_long(payload)
            raise StreamInterrupted("the chat-completions stream ended before a finish_reason")
        yield from self._finish(text, calls, finish_reason, usage, payload)

    def _raise_if_too_long(self, payload: dict[str, Any]) -> None:
        if self._tokenizer is None or self._context_window is None:
            return
        tokens = self._tokenizer.count(_rendered_prompt(payload))
        if tokens is not None and tokens >= self._context_window:
            raise PromptTooLong(
                f"This model's maximum context length is {self._context_window} tokens; the prompt has {tokens} "
                "(counted with the server's tokenizer).",
                tokens=tokens,
                maximum=self._context_window,
            )

    def _read_whole(self, response: Any, payload: dict[str, Any]) -> Iterator[ProviderEvent]:
        choice = response.choices[0]
        text = choice.message.content or ""
        if text:
            yield TextDelta(text)
        calls = {
            index: {"id": call.id or "", "name": call.function.name, "arguments": call.function.arguments or ""}
            for index, call in enumerate(choice.message.tool_calls or [])
        }
        usage = _usage(response.usage) if response.usage is not None else None
        yield from self._finish(text, calls, choice.finish_reason or "stop", usage, payload)

    def _finish(
        self,
        text: str,
        calls: dict[int, dict[str, str]],
        finish_reason: str,
        usage: Usage | None,
        payload: dict[str, Any],
    ) -> Iterator[ProviderEvent]:
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        for index in sorted(calls):
            slot = calls[index]
            block = ToolUseBlock(
                id=slot["id"] or f"call_{index}", name=slot["name"], input=_arguments(slot["arguments"])
            )
            yield block
            content.append({"type": "tool_use", "id": block.id, "name": block.name, "input": block.input})
        if usage is None or (usage.prompt_tokens == 0 and payload["messages"]):
            usage = self._counted_usage(payload, text, calls)
        yield MessageDone(content=content, stop_reason=_STOP_REASONS.get(finish_reason, finish_reason), usage=usage)

    def _counted_usage(self, payload: dict[str, Any], text: str, calls: dict[int, dict[str, str]]) -> Usage:
        """What the request consumed when the server did not say: its own tokenizer, else our estimate."""
        prompt = _rendered_prompt(payload)
        output = text + "".join(f"{slot['name']}\n{slot['arguments']}" for slot in calls.values())
        if self._tokenizer is not None:
            counted = self._tokenizer.count(prompt), self._tokenizer.count(output) if output else 0
            if counted[0] is not None and counted[1] is not None:
                return Usage(
                    input_tokens=counted[0], output_tokens=counted[1], source="tokenizer", cache_reported=False
                )
        return Usage(
            input_tokens=estimate_text_tokens(prompt),
            output_tokens=estimate_text_tokens(output),
            source="estimate",
            cache_reported=False,
        )


PROMPTED_TOOLS = (
    "\n\nYou have access to the following functions:\n{functions}\n\n"
    "You can respond to users messages with either a single message or one or more function calls."
    "\n\nTo respond with a message begin the message with 'message:', use the following format:"
    "\n\nmessage:\n<message>"
    "\n\nTo respond with one or more function calls begin the message with 'functions.<function_name>:', "
    "use the following format:\n\nfunctions.<function_name>:\n"
    '{{ "arg1": "value1", "arg2": "value2" }}\nfunctions.<function_name>:\n{{ "arg1": "value1", "arg2": "value2" }}'
)
_PROMPTED_CALL = re.compile(r"functions\.([A-Za-z0-9_.:-]+?):\s*")


def with_prompted_tools(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload with its tools written into the system message, in chatml-function-calling's words."""
    functions = "".join(
        f"\nfunctions.{tool['function']['name']}:\n{tool['function']['description']}\n"
        f"{json.dumps(tool['function']['parameters'])}\n"
        for tool in payload["tools"]
    )
    messages = [dict(message) for message in payload["messages"]]
    block = PROMPTED_TOOLS.format(functions=functions)
    if messages and messages[0]["role"] == "system":
        messages[0]["content"] = f"{messages[0]['content']}{block}"
    else:
        messages.insert(0, {"role": "system", "content": block.lstrip()})
    return {
        key: value for key, value in {**payload, "messages": messages}.items() if key not in ("tools", "tool_choice")
    }


def _prompted_calls(events: Iterator[ProviderEvent]) -> Iterator[ProviderEvent]:
    """Text until it is known to be a message (streamed, without "message:") or calls (read at the end)."""
    held, decided = "", ""
    for event in events:
        if isinstance(event, TextDelta):
            if decided == "message":
                yield event
                continue
            held += event.text
            stripped = held.lstrip()
            # Decided as soon as the text is, or can no longer become, one of the two openings.
            if stripped.startswith("functions."):
                decided = "calls"
            elif stripped.startswith("message:") or not (
                "functions.".startswith(stripped) or "message:".startswith(stripped)
            ):
                decided = "message"
                text = stripped[len("message:") :].lstrip("\n") if stripped.startswith("message:") else held
                if text:
                    yield TextDelta(text)
            continue
        if isinstance(event, MessageDone):
            if decided != "calls":
                stripped = held.lstrip()
                if decided == "" and stripped:
                    text = stripped[len("message:") :].lstrip("\n") if stripped.startswith("message:") else held
                    if text:
                        yield TextDelta(text)
                text_blocks = [b for b in event.content if b.get("type") == "text"]
                content = [{"type": "text", "text": _without_message_prefix(b["text"])} for b in text_blocks] + [
                    b for b in event.content if b.get("type") != "text"
                ]
                yield replace(event, content=[b for b in content if b.get("type") != "text" or b["text"]])
                return
            calls = _read_prompted_calls(held)
            yield from calls
            content = [{"type": "tool_use", "id": b.id, "name": b.name, "input": b.input} for b in calls]
            yield replace(event, content=content, stop_reason="tool_use" if calls else event.stop_reason)
            return
        yield event


def _without_message_prefix(text: str) -> str:
    stripped = text.lstrip()
    return stripped[len("message:") :].lstrip("\n") if stripped.startswith("message:") else text


def _read_prompted_calls(text: str) -> list[ToolUseBlock]:
    found = list(_PROMPTED_CALL.finditer(text))
    calls = []
    for number, match in enumerate(found):
        end = found[number + 1].start() if number + 1 < len(found) else len(text)
        raw = text[match.end() : end].strip()
        calls.append(
            ToolUseBlock(id=f"call_{number}_{uuid.uuid4().hex[:12]}", name=match.group(1), input=_arguments(raw))
        )
    return calls


class _EmptyStream(Exception):
    """A 200 stream that ended before its first chunk."""


class ServerTokenizer:
    """llama-cpp-python's `/extras/tokenize/count`, beside `/v1`; remembered as absent after one miss."""

    def __init__(self, base_url: str, api_key: str | None) -> None:
        root = base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url
        self.url = f"{root}/extras/tokenize/count"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.available: bool | None = None

    def count(self, text: str) -> int | None:
        if self.available is False:
            return None
        try:
            response = httpx.post(self.url, json={"input": text}, headers=self._headers, timeout=10.0)
            count = response.json().get("count") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            count = None
        if not isinstance(count, int):
            self.available = False
            return None
        self.available = True
        return count


def _rendered_prompt(payload: dict[str, Any]) -> str:
    """The request in ChatML, the template most local models use: close to what the server tokenizes."""
    parts = []
    for message in payload["messages"]:
        content = message.get("content")
        if not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False) if content else ""
        if message.get("tool_calls"):
            content += "".join(
                f"functions.{call['function']['name']}:\n{call['function']['arguments']}"
                for call in message["tool_calls"]
            )
        if message["role"] == "system" and payload.get("tools"):
            content += "".join(
                f"\nfunctions.{tool['function']['name']}:\n{json.dumps(tool['function']['parameters'])}\n"
                for tool in payload["tools"]
            )
        parts.append(f"<|im_start|>{message['role']}\n{content}<|im_end|>\n")
    return "".join(parts) + "<|im_start|>assistant\n"


def _add_call_delta(calls: dict[int, dict[str, str]], call: Any) -> None:
    """One streamed piece of a tool call; arguments arrive split across chunks, several calls per step."""
    index = call.index
    if index is None:
        # Some servers send each call whole without an index: a new id starts a new call.
        known = next((i for i, slot in calls.items() if call.id and slot["id"] == call.id), None)
        index = known if known is not None else (len(calls) if call.id or not calls else max(calls))
    slot = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
    slot["id"] = call.id or slot["id"]
    if call.function is not None:
        slot["name"] = call.function.name or slot["name"]
        slot["arguments"] += call.function.arguments or ""


def _arguments(raw: str) -> dict[str, Any]:
    """The call's input; a model's malformed arguments are kept as written, for a tool error it will see."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {MALFORMED_ARGUMENTS: raw}
    return value if isinstance(value, dict) else {MALFORMED_ARGUMENTS: raw}


def _usage(usage: Any) -> Usage:
    # OpenAI reports `prompt_tokens_details.cached_tokens` (0 included); llama.cpp's server omits it.
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    prompt = usage.prompt_tokens or 0
    return Usage(
        input_tokens=max(0, prompt - (cached or 0)),
        cache_read_input_tokens=min(cached or 0, prompt),
        output_tokens=usage.completion_tokens or 0,
        cache_reported=cached is not None,
    )


def _map_error(exc: openai.APIStatusError) -> Exception:
    body = exc.body if isinstance(exc.body, dict) else {}
    error = body.get("error", body) if isinstance(body.get("error", body), dict) else {}
    message = str(error.get("message") or exc.message or exc)
    too_long = _too_long(error, message)
    if too_long is not None:
        return too_long
    return error_for_status(exc.status_code, message, retry_after=parse_retry_after(exc.response.headers))


# Mid-stream error chunks name their kind in `type` or `code`: OpenAI's `server_error`, vLLM's and
# llama.cpp's own words, the emulator's `overloaded` (EM-3).
_RATE_LIMIT_KINDS = {"rate_limit_exceeded", "rate_limit_error", "tokens", "requests"}
_REFUSED_KINDS = {"invalid_request_error", "invalid_request", "BadRequestError"}


def _map_stream_error(exc: openai.APIError) -> ProviderError:
    """The typed error for an `{"error": ...}` chunk: transient unless it says the request itself was refused."""
    error = exc.body if isinstance(exc.body, dict) else {}
    message = str(error.get("message") or exc.message)
    too_long = _too_long(error, message)
    if too_long is not None:
        return too_long
    kinds = {str(error.get("type") or ""), str(error.get("code") or "")}
    if kinds & _RATE_LIMIT_KINDS:
        return RateLimited(message)
    if kinds & _REFUSED_KINDS:
        return InvalidRequest(f"the model server refused the request mid-stream: {message}")
    # A server failing after it began to answer (OpenAI's `server_error`, an overload) is worth asking again.
    return Overloaded(message)


def _too_long(error: dict[str, Any], message: str) -> PromptTooLong | None:
    too_long = error.get("code") == "context_length_exceeded" or error.get("type") == "exceed_context_size_error"
    if not too_long and not _MAXIMUM.search(message):
        return None
    maximum = _MAXIMUM.search(message)
    measured = _MEASURED.search(message)
    # llama.cpp's own server names both figures as fields.
    tokens = int(next(g for g in measured.groups() if g)) if measured else error.get("n_prompt_tokens")
    limit = int(maximum.group(1)) if maximum else error.get("n_ctx")
    return PromptTooLong(message, tokens=tokens, maximum=limit)


def to_chat_payload(request: ModelRequestSpec, *, tool_results_as_text: bool = False) -> dict[str, Any]:
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
        messages.extend(_chat_messages(message, tool_results_as_text=tool_results_as_text))
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
        # Said outright: OpenAI defaults to "auto" with tools, but llama-cpp-python's
        # chatml-function-calling leaves the tools out of the prompt without it.
        payload["tool_choice"] = _tool_choice(request.tool_choice)
    return payload


def _tool_choice(choice: dict[str, Any] | None) -> Any:
    kind = (choice or {}).get("type", "auto")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice["name"]}}  # type: ignore[index]
    return {"any": "required", "none": "none"}.get(kind, "auto")


def _chat_messages(message: dict[str, Any], *, tool_results_as_text: bool = False) -> list[dict[str, Any]]:
    content = message["content"]
    if isinstance(content, str):
        return [{"role": message["role"], "content": content}]
    if message["role"] == "assistant":
        text = "".join(block.get("text", "") for block in content if block.get("type") == "text")
        calls = [
            {
                "id": block["id"],
                "type": "function",
                "function": {"name": block["name"], "arguments": _call_arguments(block.get("input", {}))},
            }
            for block in content
            if block.get("type") == "tool_use"
        ]
        # llama-cpp-python refuses a null content (and its template cannot do without the key).
        out: dict[str, Any] = {"role": "assistant", "content": text or ("" if tool_results_as_text else None)}
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
    if tool_results_as_text and results:
        lines = [f"Result of tool call {result['tool_call_id']}:\n{result['content']}" for result in results]
        results, parts = [], [{"type": "text", "text": "\n\n".join(lines)}, *parts]
    if not parts:
        return results
    if all(part["type"] == "text" for part in parts):
        return [*results, {"role": "user", "content": "\n\n".join(part["text"] for part in parts)}]
    return [*results, {"role": "user", "content": parts}]


def _call_arguments(arguments: dict[str, Any]) -> str:
    # Malformed arguments go back as the model wrote them, so its own mistake is what it sees.
    if set(arguments) == {MALFORMED_ARGUMENTS}:
        return str(arguments[MALFORMED_ARGUMENTS])
    return json.dumps(arguments, sort_keys=True)


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
