"""Request checks and the API's error shapes.

Every refusal the emulator gives is an `ApiError` carrying the status, error type
and wording of the real API; the HTTP server renders it in the Anthropic or the
OpenAI error shape.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import math
import re
from typing import Any

import jsonschema

TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}


class ApiError(Exception):
    """An error response, shaped like the real API's."""

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = headers or {}
        self.code = code
        self.param = param

    def anthropic_body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.error_type, "message": self.message}}

    def openai_body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}


def invalid_request(message: str) -> ApiError:
    return ApiError(400, "invalid_request_error", message)


# Deeper than any real request goes, shallow enough that every check below (recursive, like the
# API's own parser) runs within Python's recursion limit.
MAX_JSON_DEPTH = 100


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_body(raw: bytes) -> Any:
    """The request body as JSON, refused with a 400 where the API's parser refuses it: not JSON (`NaN`
    included), a lone surrogate escape (not encodable text), an integer too long to convert, or nesting
    deeper than `MAX_JSON_DEPTH`. An empty body is `{}`."""
    try:
        payload = json.loads(raw or b"{}", parse_constant=_reject_constant)
    except RecursionError:
        raise too_deep() from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError; so is an overlong int
        raise invalid_request(f"The request body is not valid JSON: {exc}") from None
    stack: list[tuple[Any, int]] = [(payload, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value)
        elif isinstance(value, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise too_deep()
            items = value.items() if isinstance(value, dict) else ((None, item) for item in value)
            for key, item in items:
                if key is not None:
                    _check_text(key)
                stack.append((item, depth + 1))
    return payload


def _check_text(value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid_request(
            "The request body is not valid JSON: it contains a lone surrogate escape (\\ud800-\\udfff), "
            "which is not valid Unicode text"
        ) from None


def too_deep() -> ApiError:
    return invalid_request(f"The request body is not valid JSON: nested deeper than {MAX_JSON_DEPTH} levels")


def milliseconds(value: Any, name: str) -> float:
    """A latency in ms as given over HTTP: a finite number, not negative."""
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite number of milliseconds, 0 or more; got {value!r}")
    return number


class StreamCut(Exception):
    """In process: the stream was cut mid-response (the HTTP server drops the connection)."""


def check_cache_control(control: Any, where: str) -> None:
    where = f"{where}.cache_control" if where else "cache_control"
    if not isinstance(control, dict) or control.get("type") != "ephemeral":
        raise invalid_request(f"{where}.type: Input should be 'ephemeral'")
    ttl = control.get("ttl", "5m")
    if ttl not in TTL_SECONDS:
        raise invalid_request(f"{where}.ttl: Input should be '5m' or '1h'")
    for key in control:
        if key not in ("type", "ttl"):
            raise invalid_request(f"{where}.{key}: Extra inputs are not permitted")


# --- the Messages request, as the API's request model refuses it -----------------------------

# model id -> (maximum output tokens, tool-use system prompt tokens for tool_choice auto/none, any/tool)
MODELS: dict[str, tuple[int, tuple[int, int]]] = {}
for _ids, _limits in (
    (("claude-opus-4-5", "claude-opus-4-5-20251101"), (64_000, (346, 313))),
    (("claude-sonnet-4-5", "claude-sonnet-4-5-20250929"), (64_000, (346, 313))),
    (("claude-haiku-4-5", "claude-haiku-4-5-20251001"), (64_000, (346, 313))),
    (("claude-opus-4-1", "claude-opus-4-1-20250805"), (32_000, (346, 313))),
    (("claude-opus-4-0", "claude-opus-4-20250514"), (32_000, (346, 313))),
    (("claude-sonnet-4-0", "claude-sonnet-4-20250514"), (64_000, (346, 313))),
    (("claude-3-7-sonnet-latest", "claude-3-7-sonnet-20250219"), (64_000, (346, 313))),
    (("claude-3-5-haiku-latest", "claude-3-5-haiku-20241022"), (8_192, (264, 340))),
    (("claude-3-haiku-20240307",), (4_096, (264, 340))),
    # Newer models the installed SDK lists, whose output limits and tool prompt sizes the emulator does
    # not know: counted like Sonnet 4.5 (see "Fidelity rules" in docs/providers.md).
    (
        (
            "claude-opus-4-6",
            "claude-sonnet-4-6",
            "claude-opus-4-7",
            "claude-opus-4-8",
            "claude-opus-5",
            "claude-sonnet-5",
            "claude-opus-5-5",
            "claude-sonnet-5-5",
            "claude-haiku-5-5",
        ),
        (64_000, (346, 313)),
    ),
):
    for _id in _ids:
        MODELS[_id] = _limits
# What an unknown model (offline accounting only) is counted as.
DEFAULT_MODEL_LIMITS = MODELS["claude-sonnet-4-5"]


def tool_use_system_prompt_tokens(model: str, *, forced: bool = False) -> int:
    """The tokens of the system prompt the API adds when a request has tools (documented per model)."""
    return MODELS.get(model, DEFAULT_MODEL_LIMITS)[1][1 if forced else 0]


MESSAGES_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "metadata",
        "stop_sequences",
        "stream",
        "temperature",
        "top_k",
        "top_p",
        "tools",
        "tool_choice",
        "thinking",
        "service_tier",
        "cache_control",
        # Accepted as the API accepts them, not modelled: they change nothing here.
        "container",
        "diagnostics",
        "inference_geo",
        "output_config",
        "speed",
        "user_profile_id",
        "workspace_id",
    }
)
COUNT_TOKENS_FIELDS = frozenset(
    {
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "cache_control",
        "output_config",
        "output_format",
        "speed",
        "user_profile_id",
        "workspace_id",
    }
)
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
IMAGE_MAX_BYTES = 5 * 1024 * 1024
IMAGE_MAX_EDGE = 8000
# Over 20 images in one request, each may be at most 2000 px on a side.
MANY_IMAGES = 20
MANY_IMAGES_MAX_EDGE = 2000
MAX_IMAGES = 100
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
TOOL_USE_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
METADATA_USER_ID_MAX = 256
TOOL_SEARCH_TYPES = {
    "tool_search_tool_bm25_20251119": "tool_search_tool_bm25",
    "tool_search_tool_regex_20251119": "tool_search_tool_regex",
}
USER_BLOCKS = ("text", "image", "tool_result", "document")
ASSISTANT_BLOCKS = (
    "text",
    "tool_use",
    "thinking",
    "redacted_thinking",
    "server_tool_use",
    "tool_search_tool_result",
)
TOOL_RESULT_BLOCKS = ("text", "image", "tool_reference", "document")
THINKING_MIN_BUDGET = 1024


def _type_name(value: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def _expect(value: Any, kind: type | tuple[type, ...], where: str, what: str) -> None:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float, (int, float))):
        raise invalid_request(f"{where}: Input should be {what}")


def _extra(block: dict[str, Any], allowed: set[str] | frozenset[str], where: str) -> None:
    for key in block:
        if key not in allowed:
            prefix = f"{where}." if where else ""
            raise invalid_request(f"{prefix}{key}: Extra inputs are not permitted")


def _tag_error(tag: Any, expected: tuple[str, ...], where: str) -> ApiError:
    listed = ", ".join(f"'{t}'" for t in expected)
    return invalid_request(
        f"{where}: Input tag {json.dumps(tag)} found using 'type' does not match any of the expected tags: {listed}"
    )


def check_request_fields(payload: dict[str, Any], *, count_only: bool, known_model: bool) -> dict[str, Any]:
    """Top-level fields: unknown ones, types and ranges. Returns the model's limits and the thinking budget."""
    _extra(payload, COUNT_TOKENS_FIELDS if count_only else MESSAGES_FIELDS, "")
    model = payload.get("model")
    if "model" not in payload:
        raise invalid_request("model: Field required")
    _expect(model, str, "model", "a valid string")
    if not model:
        raise invalid_request("model: String should have at least 1 character")
    if model not in MODELS and known_model:
        raise ApiError(404, "not_found_error", f"model: {model}")
    max_output, _tool_prompt = MODELS.get(model, DEFAULT_MODEL_LIMITS)
    max_tokens = payload.get("max_tokens")
    if not count_only:
        if "max_tokens" not in payload:
            raise invalid_request("max_tokens: Field required")
        _expect(max_tokens, int, "max_tokens", "a valid integer")
        assert isinstance(max_tokens, int)  # _expect raised otherwise; tells the type checker
        if max_tokens < 1:
            raise invalid_request("max_tokens: Input should be greater than or equal to 1")
        if max_tokens > max_output:
            raise invalid_request(
                f"max_tokens: {max_tokens} > {max_output}, which is the maximum allowed number of output tokens "
                f"for {model}"
            )
    if "messages" not in payload:
        raise invalid_request("messages: Field required")
    _expect(payload["messages"], list, "messages", "a valid list")
    for name, low, high in (("temperature", 0.0, 1.0), ("top_p", 0.0, 1.0)):
        if payload.get(name) is not None:
            _expect(payload[name], (int, float), name, "a valid number")
            if not low <= payload[name] <= high:
                bound = "less than or equal to 1" if payload[name] > high else "greater than or equal to 0"
                raise invalid_request(f"{name}: Input should be {bound}")
    if payload.get("top_k") is not None:
        _expect(payload["top_k"], int, "top_k", "a valid integer")
        if payload["top_k"] < 0:
            raise invalid_request("top_k: Input should be greater than or equal to 0")
    if "stream" in payload:
        _expect(payload["stream"], bool, "stream", "a valid boolean")
    if payload.get("metadata") is not None:
        _expect(payload["metadata"], dict, "metadata", "a valid dictionary")
        _extra(payload["metadata"], {"user_id"}, "metadata")
        user_id = payload["metadata"].get("user_id")
        if user_id is not None:
            _expect(user_id, str, "metadata.user_id", "a valid string")
            if len(user_id) > METADATA_USER_ID_MAX:
                raise invalid_request(f"metadata.user_id: String should have at most {METADATA_USER_ID_MAX} characters")
    if "service_tier" in payload and payload["service_tier"] not in ("auto", "standard_only"):
        raise invalid_request("service_tier: Input should be 'auto' or 'standard_only'")
    stops = payload.get("stop_sequences")
    if stops is not None:
        _expect(stops, list, "stop_sequences", "a valid list")
        for i, stop in enumerate(stops):
            _expect(stop, str, f"stop_sequences.{i}", "a valid string")
            if not stop.strip():
                raise invalid_request("stop_sequences: each stop sequence must contain non-whitespace")
    if payload.get("cache_control") is not None:
        check_cache_control(payload["cache_control"], "")
    budget = _check_thinking(payload, max_tokens if not count_only else None)
    thinking_on = budget is not None
    _check_tool_choice(payload, thinking_on)
    if payload.get("tools") is not None:
        _expect(payload["tools"], list, "tools", "a valid list")
    return {
        "max_output": max_output,
        "tool_prompt": _tool_prompt,
        "thinking_budget": budget,
        "thinking": payload.get("thinking") if thinking_on else None,
    }


def _check_thinking(payload: dict[str, Any], max_tokens: int | None) -> int | None:
    thinking = payload.get("thinking")
    if thinking is None:
        return None
    _expect(thinking, dict, "thinking", "a valid dictionary")
    kind = thinking.get("type")
    if kind == "disabled":
        _extra(thinking, {"type"}, "thinking.disabled")
        return None
    if kind in ("adaptive", "between_tools"):
        # The model decides how much to think: no budget to check (0 = thinking on, no budget).
        _extra(thinking, {"type", "display"}, f"thinking.{kind}")
        return 0
    if kind != "enabled":
        raise _tag_error(kind, ("enabled", "disabled", "adaptive", "between_tools"), "thinking")
    _extra(thinking, {"type", "budget_tokens", "display"}, "thinking.enabled")
    budget = thinking.get("budget_tokens")
    if "budget_tokens" not in thinking:
        raise invalid_request("thinking.enabled.budget_tokens: Field required")
    _expect(budget, int, "thinking.enabled.budget_tokens", "a valid integer")
    if budget < THINKING_MIN_BUDGET:
        raise invalid_request(
            f"thinking.enabled.budget_tokens: Input should be greater than or equal to {THINKING_MIN_BUDGET}"
        )
    if max_tokens is not None and max_tokens <= budget:
        raise invalid_request("`max_tokens` must be greater than `thinking.budget_tokens`")
    if payload.get("temperature") is not None and payload["temperature"] != 1:
        raise invalid_request(
            "`temperature` may only be set to 1 when thinking is enabled. "
            "Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
        )
    if payload.get("top_k") is not None:
        raise invalid_request("`top_k` must be unset when thinking is enabled.")
    if payload.get("top_p") is not None and not 0.95 <= payload["top_p"] <= 1:
        raise invalid_request("`top_p` must be between 0.95 and 1 when thinking is enabled.")
    return int(budget)


def _check_tool_choice(payload: dict[str, Any], thinking: bool) -> None:
    choice = payload.get("tool_choice")
    if choice is None:
        return
    _expect(choice, dict, "tool_choice", "a valid dictionary")
    kind = choice.get("type")
    allowed = {"auto": {"disable_parallel_tool_use"}, "any": {"disable_parallel_tool_use"}, "none": set()}
    if kind == "tool":
        _extra(choice, {"type", "name", "disable_parallel_tool_use"}, "tool_choice.tool")
        _expect(choice.get("name"), str, "tool_choice.tool.name", "a valid string")
        names = [t.get("name") for t in payload.get("tools") or [] if isinstance(t, dict)]
        if choice["name"] not in names:
            raise invalid_request(f"tool_choice.tool.name: Tool '{choice['name']}' not found in provided tools")
    elif isinstance(kind, str) and kind in allowed:
        _extra(choice, {"type"} | allowed[kind], f"tool_choice.{kind}")
    else:
        raise _tag_error(kind, ("auto", "any", "tool", "none"), "tool_choice")
    if "disable_parallel_tool_use" in choice:
        _expect(choice["disable_parallel_tool_use"], bool, f"tool_choice.{kind}.disable_parallel_tool_use", "a bool")
    if thinking and kind in ("any", "tool"):
        raise invalid_request("Thinking may not be enabled when tool_choice forces tool use.")


@functools.lru_cache(maxsize=4096)
def _valid_schema(schema: str) -> bool:
    # Checking a schema against the meta-schema is slow; agents send the same tools on every request.
    try:
        jsonschema.Draft202012Validator.check_schema(json.loads(schema))
    except jsonschema.SchemaError:
        return False
    return True


def check_tool(tool: Any, where: str) -> str:
    """One tool definition; returns its kind: 'custom' or a tool search type."""
    _expect(tool, dict, where, "a valid dictionary")
    kind = tool.get("type", "custom")
    if not isinstance(kind, str):
        raise _tag_error(kind, ("custom", *TOOL_SEARCH_TYPES), where)
    if kind in TOOL_SEARCH_TYPES:
        _extra(tool, {"type", "name", "cache_control"}, f"{where}.{kind}")
        if tool.get("name") != TOOL_SEARCH_TYPES[kind]:
            raise invalid_request(f"{where}.{kind}.name: Input should be '{TOOL_SEARCH_TYPES[kind]}'")
        return str(kind)
    if kind != "custom":
        raise _tag_error(kind, ("custom", *TOOL_SEARCH_TYPES), where)
    where = f"{where}.custom"
    _extra(tool, {"type", "name", "description", "input_schema", "cache_control", "defer_loading", "strict",
                  "allowed_callers", "eager_input_streaming", "input_examples"}, where)  # fmt: skip
    if "name" not in tool:
        raise invalid_request(f"{where}.name: Field required")
    _expect(tool["name"], str, f"{where}.name", "a valid string")
    if not TOOL_NAME.fullmatch(tool["name"]):
        raise invalid_request(f"{where}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'")
    if "description" in tool:
        _expect(tool["description"], str, f"{where}.description", "a valid string")
    if "input_schema" not in tool:
        raise invalid_request(f"{where}.input_schema: Field required")
    schema = tool["input_schema"]
    _expect(schema, dict, f"{where}.input_schema", "a valid dictionary")
    if schema.get("type") != "object":
        raise invalid_request(f"{where}.input_schema.type: Input should be 'object'")
    if not _valid_schema(json.dumps(schema, sort_keys=True)):
        raise invalid_request(
            f"{where}.input_schema: JSON schema is invalid - please consult https://json-schema.org "
            "or our documentation at https://docs.claude.com/en/docs/tool-use"
        )
    if "defer_loading" in tool:
        _expect(tool["defer_loading"], bool, f"{where}.defer_loading", "a valid boolean")
    return str(kind)


def check_block(block: Any, where: str, allowed: tuple[str, ...]) -> None:
    """One content block: its tag, fields and field types (images are checked where they are counted)."""
    _expect(block, dict, where, "a valid dictionary")
    kind = block.get("type")
    if kind not in allowed:
        raise _tag_error(kind, allowed, where)
    where = f"{where}.{kind}"
    if "cache_control" in block:
        check_cache_control(block["cache_control"], where)
    if kind == "text":
        _extra(block, {"type", "text", "cache_control", "citations"}, where)
        if "text" not in block:
            raise invalid_request(f"{where}.text: Field required")
        _expect(block["text"], str, f"{where}.text", "a valid string")
        if not block["text"]:
            if "cache_control" in block:
                raise invalid_request("cache_control cannot be set for empty text blocks")
            raise invalid_request("messages: text content blocks must be non-empty")
    elif kind == "image":
        _extra(block, {"type", "source", "cache_control", "transformations"}, where)
        source = block.get("source")
        _expect(source, dict, f"{where}.source", "a valid dictionary")
        if source.get("type") == "base64":
            _extra(source, {"type", "media_type", "data"}, f"{where}.source.base64")
            if source.get("media_type") not in IMAGE_MEDIA_TYPES:
                listed = ", ".join(f"'{t}'" for t in IMAGE_MEDIA_TYPES[:-1]) + f" or '{IMAGE_MEDIA_TYPES[-1]}'"
                raise invalid_request(f"{where}.source.base64.media_type: Input should be {listed}")
            _expect(source.get("data"), str, f"{where}.source.base64.data", "a valid string")
        elif source.get("type") == "url":
            _extra(source, {"type", "url"}, f"{where}.source.url")
            _expect(source.get("url"), str, f"{where}.source.url.url", "a valid string")
        else:
            raise _tag_error(source.get("type"), ("base64", "url"), f"{where}.source")
    elif kind == "document":
        _extra(block, {"type", "source", "cache_control", "title", "context", "citations"}, where)
        _expect(block.get("source"), dict, f"{where}.source", "a valid dictionary")
    elif kind == "tool_use" or kind == "server_tool_use":
        _extra(block, {"type", "id", "name", "input", "cache_control", "caller", "toolset_name"}, where)
        for name, expected in (("id", str), ("name", str), ("input", dict)):
            if name not in block:
                raise invalid_request(f"{where}.{name}: Field required")
            _expect(
                block[name], expected, f"{where}.{name}", "a valid " + ("dictionary" if expected is dict else "string")
            )
        if kind == "tool_use" and not TOOL_USE_ID.fullmatch(block["id"]):
            raise invalid_request(f"{where}.id: String should match pattern '{TOOL_USE_ID.pattern}'")
    elif kind == "tool_result":
        _extra(block, {"type", "tool_use_id", "content", "is_error", "cache_control", "toolset_name"}, where)
        if "tool_use_id" not in block:
            raise invalid_request(f"{where}.tool_use_id: Field required")
        _expect(block["tool_use_id"], str, f"{where}.tool_use_id", "a valid string")
        if "is_error" in block:
            _expect(block["is_error"], bool, f"{where}.is_error", "a valid boolean")
        content = block.get("content")
        if content is not None and not isinstance(content, str):
            _expect(content, list, f"{where}.content", "a valid string or list")
            for i, inner in enumerate(content):
                check_block(inner, f"{where}.content.{i}", TOOL_RESULT_BLOCKS)
    elif kind == "tool_reference":
        _extra(block, {"type", "tool_name", "cache_control"}, where)
        _expect(block.get("tool_name"), str, f"{where}.tool_name", "a valid string")
    elif kind == "thinking":
        _extra(block, {"type", "thinking", "signature"}, where)
        _expect(block.get("thinking"), str, f"{where}.thinking", "a valid string")
        _expect(block.get("signature"), str, f"{where}.signature", "a valid string")
    elif kind == "redacted_thinking":
        _extra(block, {"type", "data"}, where)
        _expect(block.get("data"), str, f"{where}.data", "a valid string")
    elif kind == "tool_search_tool_result":
        _extra(block, {"type", "tool_use_id", "content", "cache_control"}, where)
        _expect(block.get("tool_use_id"), str, f"{where}.tool_use_id", "a valid string")
        _expect(block.get("content"), dict, f"{where}.content", "a valid dictionary")


def check_messages(messages: list[Any], *, thinking: bool) -> list[list[dict[str, Any]]]:
    """Every message and block; returns each message's content as a list of blocks."""
    contents: list[list[dict[str, Any]]] = []
    for m, message in enumerate(messages):
        where = f"messages.{m}"
        _expect(message, dict, where, "a valid dictionary")
        _extra(message, {"role", "content"}, where)
        if "role" not in message:
            raise invalid_request(f"{where}.role: Field required")
        if message["role"] not in ("user", "assistant"):
            raise invalid_request(f"{where}.role: Input should be 'user' or 'assistant'")
        if "content" not in message:
            raise invalid_request(f"{where}.content: Field required")
        content = message["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}] if content else []
        elif not isinstance(content, list):
            raise invalid_request(f"{where}.content: Input should be a valid string or list")
        final_assistant = m == len(messages) - 1 and message["role"] == "assistant"
        if not content and not final_assistant:
            raise invalid_request(
                f"{where}: all messages must have non-empty content except for the optional final assistant message"
            )
        allowed = USER_BLOCKS if message["role"] == "user" else ASSISTANT_BLOCKS
        for b, block in enumerate(content):
            check_block(block, f"{where}.content.{b}", allowed)
            if block["type"] == "text" and not block["text"].strip():
                raise invalid_request("messages: text content blocks must contain non-whitespace text")
        contents.append(content)
    if contents and not contents[-1]:
        contents[-1] = []
    check_tool_pairing(messages, contents)
    if thinking:
        _check_thinking_turn(messages, contents)
    return contents


def check_tool_pairing(messages: list[dict[str, Any]], contents: list[list[dict[str, Any]]]) -> None:
    seen: set[str] = set()
    for m, content in enumerate(contents):
        role = messages[m]["role"]
        if role == "assistant":
            for b, block in enumerate(content):
                if block["type"] in ("tool_use", "server_tool_use"):
                    if block["id"] in seen:
                        raise invalid_request(f"messages.{m}.content.{b}: `tool_use` ids must be unique")
                    seen.add(block["id"])
            ids = [block["id"] for block in content if block["type"] == "tool_use"]
            if not ids:
                continue
            following = contents[m + 1] if m + 1 < len(contents) else []
            answered = set()
            if m + 1 < len(contents) and messages[m + 1]["role"] == "user":
                # tool_result blocks must come first in the user message; any text after them.
                for block in following:
                    if block["type"] != "tool_result":
                        break
                    answered.add(block["tool_use_id"])
            missing = [i for i in ids if i not in answered]
            if missing:
                raise invalid_request(
                    f"messages.{m}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                    f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block "
                    "in the next message."
                )
        else:
            previous = contents[m - 1] if m > 0 and messages[m - 1]["role"] == "assistant" else []
            offered = {block["id"] for block in previous if block["type"] == "tool_use"}
            for b, block in enumerate(content):
                if block["type"] == "tool_result" and block["tool_use_id"] not in offered:
                    raise invalid_request(
                        f"messages.{m}.content.{b}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{block['tool_use_id']}. Each `tool_result` block must have a corresponding `tool_use` "
                        "block in the previous message."
                    )


def _check_thinking_turn(messages: list[dict[str, Any]], contents: list[list[dict[str, Any]]]) -> None:
    """With thinking on, the assistant message before the last tool results must start with its thinking."""
    last = len(contents) - 1
    if last < 1 or messages[last]["role"] != "user":
        return
    if not any(block["type"] == "tool_result" for block in contents[last]):
        return
    previous = contents[last - 1]
    if previous and previous[0]["type"] not in ("thinking", "redacted_thinking"):
        raise invalid_request(
            f"messages.{last - 1}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
            f"`{previous[0]['type']}`. When `thinking` is enabled, a final `assistant` message must start with a "
            "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you "
            "include thinking blocks from previous turns. To avoid this requirement, disable `thinking`. Please "
            "consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
        )


# Thinking signatures are the emulator's own: a block edited or invented by the client fails the check.
_SIGNING_KEY = b"control-center-emulator-thinking"


def sign_thinking(text: str) -> str:
    return base64.b64encode(hmac.new(_SIGNING_KEY, text.encode(), hashlib.sha256).digest()).decode()


def check_signature(block: dict[str, Any], where: str) -> None:
    if not hmac.compare_digest(block["signature"], sign_thinking(block["thinking"])):
        raise invalid_request(f"{where}: Invalid `signature` in `thinking` block")
