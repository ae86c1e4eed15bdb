"""The OpenAI-compatible chat-completions route (automatic prefix caching)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PIL import Image

from engine.emulator.cache import Entry, PrefixCache
from engine.emulator.policy import Fault
from engine.emulator.sse import shape_reply, word_chunks
from engine.emulator.validation import MODELS, ApiError, StreamCut
from engine.request import canonical_json
from engine.tokens import estimate_json_tokens

if TYPE_CHECKING:
    from engine.emulator.core import Emulator

# OpenAI's vision guide ("Calculating costs"), GPT-4o class: other models scale these (gpt-4o-mini bills
# 2833 + 5667 a tile) or count 32 px patches instead; the emulator answers every model with this rule.
OPENAI_IMAGE_BASE_TOKENS = 85
OPENAI_IMAGE_TILE_TOKENS = 170
OPENAI_IMAGE_TILE = 512
OPENAI_IMAGE_MAX_EDGE = 2048
OPENAI_IMAGE_SHORT_EDGE = 768
OPENAI_MIN_CACHE_TOKENS = 1024
OPENAI_CACHE_STEP = 128
OPENAI_CACHE_TTL = 300.0
DEFAULT_MAX_COMPLETION_TOKENS = 16_384
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
CHAT_FIELDS = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "n",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "user",
        "parallel_tool_calls",
        "metadata",
        "store",
        "reasoning_effort",
        "service_tier",
        "response_format",
        # Accepted and ignored: the reply carries no log probabilities.
        "logprobs",
        "top_logprobs",
    }
)
# OpenAI's chat models and their documented maximum output tokens (the models pages). A name in
# OpenAI's namespace that is not here is refused as OpenAI refuses it; any other name is an
# OpenAI-compatible server's own model (vLLM, Ollama, llama.cpp, the app's tests), answered.
OPENAI_MODELS: dict[str, int] = {
    **dict.fromkeys(("gpt-4o", "gpt-4o-2024-11-20", "gpt-4o-2024-08-06", "chatgpt-4o-latest"), 16_384),
    **dict.fromkeys(("gpt-4o-mini", "gpt-4o-mini-2024-07-18"), 16_384),
    "gpt-4o-2024-05-13": 4_096,
    **dict.fromkeys(
        (
            "gpt-4.1",
            "gpt-4.1-2025-04-14",
            "gpt-4.1-mini",
            "gpt-4.1-mini-2025-04-14",
            "gpt-4.1-nano",
            "gpt-4.1-nano-2025-04-14",
        ),
        32_768,
    ),  # fmt: skip
    **dict.fromkeys(("gpt-4-turbo", "gpt-4-turbo-2024-04-09", "gpt-3.5-turbo", "gpt-3.5-turbo-0125"), 4_096),
    **dict.fromkeys(("gpt-4", "gpt-4-0613"), 8_192),
    **dict.fromkeys(("o1", "o1-2024-12-17", "o3", "o3-2025-04-16", "o3-mini", "o3-mini-2025-01-31"), 100_000),
    **dict.fromkeys(("o4-mini", "o4-mini-2025-04-16"), 100_000),
    "o1-mini": 65_536,
    **dict.fromkeys(("gpt-5", "gpt-5-mini", "gpt-5-nano", "gpt-5.1"), 128_000),
    "gpt-5-chat-latest": 16_384,
}
OPENAI_NAMESPACE = re.compile(r"^(gpt-|chatgpt-|o\d|text-|davinci|babbage|ft:)")
FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")
FUNCTION_NAME_MAX = 64
TOOL_CHOICES = ("none", "auto", "required")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
IMAGE_DETAILS = ("auto", "low", "high")
IMAGE_URL = re.compile(r"^(https?://[^\s/?#]+[^\s]*|data:image/[a-zA-Z0-9.+-]+;base64,[A-Za-z0-9+/=\s]*)$")
ROLES = ("system", "assistant", "user", "function", "tool", "developer")


def _error(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, "invalid_request_error", message, param=param, code=code)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {int: "integer", float: "decimal", str: "string", list: "array", dict: "object"}.get(type(value), "value")


def _type_error(param: str, expected: str, value: Any) -> ApiError:
    return _error(
        f"Invalid type for '{param}': expected {expected}, but got {_kind(value)} instead.", param, "invalid_type"
    )


def _listed(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values[:-1]) + f", and '{values[-1]}'"


def _empty_array(param: str) -> ApiError:
    return _error(
        f"Invalid '{param}': empty array. Expected an array with minimum length 1, but got an empty array instead.",
        param,
        "empty_array",
    )


def _parts(content: Any, param: str, allowed: tuple[str, ...], *, required: bool = True) -> None:
    if content is None and not required:
        return
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not all(isinstance(p, dict) for p in content):
        raise _type_error(param, "one of a string or array of objects", content)
    if not content:
        raise _empty_array(param)
    for i, part in enumerate(content):
        kind = part.get("type")
        if kind not in allowed:
            listed = ", ".join(f"'{a}'" for a in allowed)
            raise _error(
                f"Invalid value: {json.dumps(kind)}. Supported values are: {listed}.",
                f"{param}[{i}].type",
                "invalid_value",
            )
        if kind == "text" and not isinstance(part.get("text"), str):
            raise _type_error(f"{param}[{i}].text", "a string", part.get("text"))
        if kind == "image_url":
            _check_image_url(part.get("image_url"), f"{param}[{i}].image_url")


def _check_image_url(image_url: Any, param: str) -> None:
    if not isinstance(image_url, dict):
        raise _type_error(param, "an object", image_url)
    url = image_url.get("url")
    if "url" not in image_url:
        raise _error(f"Missing required parameter: '{param}.url'.", f"{param}.url", "missing_required_parameter")
    if not isinstance(url, str):
        raise _type_error(f"{param}.url", "a string", url)
    if not IMAGE_URL.match(url):
        raise _error(
            f"Invalid '{param}.url'. Expected a valid URL, but got a value with an invalid format.",
            f"{param}.url",
            "invalid_value",
        )
    if image_url.get("detail") is not None and image_url["detail"] not in IMAGE_DETAILS:
        raise _error(
            f"Invalid value: '{image_url['detail']}'. Supported values are: {_listed(IMAGE_DETAILS)}.",
            f"{param}.detail",
            "invalid_value",
        )


def _check_model(payload: dict[str, Any]) -> None:
    """An OpenAI model OpenAI does not have is a 404; `max_tokens` above a known model's output limit a 400."""
    model = payload["model"]
    if model not in OPENAI_MODELS and OPENAI_NAMESPACE.match(model):
        raise ApiError(
            404,
            "invalid_request_error",
            f"The model `{model}` does not exist or you do not have access to it.",
            code="model_not_found",
        )
    # A Claude model served over this route (the app's tests do so) keeps its own output limit.
    limit = OPENAI_MODELS.get(model) or (MODELS[model][0] if model in MODELS else None)
    for name in ("max_tokens", "max_completion_tokens"):
        value = payload.get(name)
        if limit is not None and isinstance(value, int) and value > limit:
            raise _error(
                f"{name} is too large: {value}. This model supports at most {limit} completion tokens, "
                f"whereas you provided {value}.",
                name,
                "invalid_value",
            )


def _check_tools(payload: dict[str, Any]) -> list[str]:
    """`tools` as OpenAI refuses them; returns the function names."""
    tools = payload.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise _type_error("tools", "an array of objects", tools)
    if not tools:
        raise _empty_array("tools")
    names = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise _error(f"Invalid value: {json.dumps(tool.get('type'))}. Supported values are: 'function'.",
                         f"tools[{i}].type", "invalid_value")  # fmt: skip
        function = tool.get("function")
        if not isinstance(function, dict):
            raise _type_error(f"tools[{i}].function", "an object", function)
        name = function.get("name")
        param = f"tools[{i}].function.name"
        if not isinstance(name, str):
            raise _type_error(param, "a string", name)
        if not name:
            raise _error(f"Invalid '{param}': empty string. Expected a string with minimum length 1, but got an "
                         "empty string instead.", param, "empty_string")  # fmt: skip
        if len(name) > FUNCTION_NAME_MAX:
            raise _error(f"Invalid '{param}': string too long. Expected a string with maximum length "
                         f"{FUNCTION_NAME_MAX}, but got a string with length {len(name)} instead.", param,
                         "string_above_max_length")  # fmt: skip
        if not FUNCTION_NAME.match(name):
            raise _error(f"Invalid '{param}': string does not match pattern. Expected a string that matches the "
                         f"pattern '{FUNCTION_NAME.pattern}'.", param, "invalid_value")  # fmt: skip
        if "parameters" in function and not isinstance(function["parameters"], dict):
            raise _type_error(f"tools[{i}].function.parameters", "an object", function["parameters"])
        if "description" in function and not isinstance(function["description"], str):
            raise _type_error(f"tools[{i}].function.description", "a string", function["description"])
        names.append(name)
    return names


def _check_tool_choice(payload: dict[str, Any], names: list[str]) -> None:
    choice = payload.get("tool_choice")
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise _error(f"Invalid value: '{choice}'. Supported values are: {_listed(TOOL_CHOICES)}.",
                         "tool_choice", "invalid_value")  # fmt: skip
    elif isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "function":
            function = choice.get("function")
            if not isinstance(function, dict):
                raise _type_error("tool_choice.function", "an object", function)
            if not isinstance(function.get("name"), str):
                raise _type_error("tool_choice.function.name", "a string", function.get("name"))
            if names and function["name"] not in names:
                # wording: ours (OpenAI refuses it; its words are not documented)
                raise _error(f"Invalid value for 'tool_choice': function '{function['name']}' is not among "
                             "the functions in 'tools'.", "tool_choice", "invalid_value")  # fmt: skip
        elif kind != "allowed_tools":
            raise _error(f"Invalid value: '{kind}'. Supported values are: 'function' and "
                         "'allowed_tools'.", "tool_choice.type", "invalid_value")  # fmt: skip
    else:
        raise _type_error("tool_choice", "one of a string or object", choice)
    if not names:
        raise _error("Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
                     "tool_choice")  # fmt: skip


def _check_response_format(payload: dict[str, Any]) -> None:
    response_format = payload.get("response_format")
    if response_format is None:
        return
    if not isinstance(response_format, dict):
        raise _type_error("response_format", "an object", response_format)
    kind = response_format.get("type")
    if kind not in RESPONSE_FORMATS:
        raise _error(f"Invalid value: '{kind}'. Supported values are: {_listed(RESPONSE_FORMATS)}.",
                     "response_format.type", "invalid_value")  # fmt: skip
    if kind == "json_schema":
        schema = response_format.get("json_schema")
        if not isinstance(schema, dict):
            if schema is None:
                raise _error("Missing required parameter: 'response_format.json_schema'.",
                             "response_format.json_schema", "missing_required_parameter")  # fmt: skip
            raise _type_error("response_format.json_schema", "an object", schema)
        if not isinstance(schema.get("name"), str):
            raise _error("Missing required parameter: 'response_format.json_schema.name'.",
                         "response_format.json_schema.name", "missing_required_parameter")  # fmt: skip


def check_chat_request(payload: dict[str, Any]) -> None:
    """The chat-completions request as OpenAI's validator refuses it (wording as its API answers)."""
    for key in payload:
        if key not in CHAT_FIELDS:
            raise _error(f"Unrecognized request argument supplied: {key}", None)
    if "model" not in payload:
        raise _error("you must provide a model parameter", None)
    if not isinstance(payload["model"], str):
        raise _type_error("model", "a string", payload["model"])
    messages = payload.get("messages")
    if "messages" not in payload:
        raise _error("Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise _type_error("messages", "an array of objects", messages)
    if not messages:
        raise _error("[] is too short - 'messages'", "messages", "empty_array")
    for name, low, high in (("temperature", 0, 2), ("top_p", 0, 1), ("presence_penalty", -2, 2),
                            ("frequency_penalty", -2, 2)):  # fmt: skip
        value = payload.get(name)
        if value is None:
            continue
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise _type_error(name, "a decimal", value)
        if not low <= value <= high:
            raise _error(f"Invalid '{name}': decimal above maximum value. Expected a value <= {high}, but got "
                         f"{value} instead." if value > high else f"Invalid '{name}': decimal below minimum value. "
                         f"Expected a value >= {low}, but got {value} instead.", name, "decimal_above_max_value"
                         if value > high else "decimal_below_min_value")  # fmt: skip
    for name in ("max_tokens", "max_completion_tokens", "n", "seed"):
        value = payload.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise _type_error(name, "an integer", value)
        if name != "seed" and value < 1:
            raise _error(
                f"Invalid '{name}': integer below minimum value. Expected a value >= 1, but got {value} instead.",
                name,
                "integer_below_min_value",
            )
    if payload.get("n") not in (None, 1):
        raise _error("The emulator answers one choice only: n must be 1.", "n", "unsupported_value")
    for name in ("stream", "parallel_tool_calls", "store"):
        if name in payload and payload[name] is not None and not isinstance(payload[name], bool):
            raise _type_error(name, "a boolean", payload[name])
    if payload.get("stream_options") is not None:
        if not isinstance(payload["stream_options"], dict):
            raise _type_error("stream_options", "an object", payload["stream_options"])
        if not payload.get("stream"):
            raise _error("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options")
    stop = payload.get("stop")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise _type_error("stop", "one of a string or array of strings", stop)
        if len(stop) > 4:
            raise _error(f"Invalid 'stop': array too long. Expected an array with maximum length 4, but got an "
                         f"array with length {len(stop)} instead.", "stop", "array_above_max_length")  # fmt: skip
    _check_tool_choice(payload, _check_tools(payload))
    _check_response_format(payload)
    if payload.get("logprobs") is not None and not isinstance(payload["logprobs"], bool):
        raise _type_error("logprobs", "a boolean", payload["logprobs"])
    top = payload.get("top_logprobs")
    if top is not None:
        if not isinstance(top, int) or isinstance(top, bool):
            raise _type_error("top_logprobs", "an integer", top)
        if top > 20:
            raise _error(f"Invalid 'top_logprobs': integer above maximum value. Expected a value <= 20, but got "
                         f"{top} instead.", "top_logprobs", "integer_above_max_value")  # fmt: skip
        if top < 0:
            raise _error(f"Invalid 'top_logprobs': integer below minimum value. Expected a value >= 0, but got "
                         f"{top} instead.", "top_logprobs", "integer_below_min_value")  # fmt: skip
    _check_model(payload)
    pending: list[str] = []
    pending_at = -1
    for m, message in enumerate(messages):
        param = f"messages[{m}]"
        if not isinstance(message, dict):
            raise _type_error(param, "an object", message)
        role = message.get("role")
        if "role" not in message:
            raise _error(f"Missing required parameter: '{param}.role'.", f"{param}.role", "missing_required_parameter")
        if role not in ROLES:
            listed = ", ".join(f"'{r}'" for r in ROLES[:-1]) + f", and '{ROLES[-1]}'"
            raise _error(f"Invalid value: {json.dumps(role)}. Supported values are: {listed}.", f"{param}.role",
                         "invalid_value")  # fmt: skip
        if role == "tool":
            if not isinstance(message.get("tool_call_id"), str):
                raise _type_error(f"{param}.tool_call_id", "a string", message.get("tool_call_id"))
            if message["tool_call_id"] not in pending:
                raise _error(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
                    "with 'tool_calls'.",
                    f"{param}.role",
                )
            pending.remove(message["tool_call_id"])
            _parts(message.get("content"), f"{param}.content", ("text",))
            continue
        if pending:
            raise _error(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(pending)}",
                f"messages.[{pending_at}].role",
            )
        if role == "assistant":
            _parts(message.get("content"), f"{param}.content", ("text", "refusal"), required=False)
            calls = message.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
                    raise _type_error(f"{param}.tool_calls", "an array of objects", calls)
                for c, call in enumerate(calls):
                    where = f"{param}.tool_calls[{c}]"
                    if not isinstance(call.get("id"), str):
                        raise _type_error(f"{where}.id", "a string", call.get("id"))
                    function = call.get("function")
                    if not isinstance(function, dict):
                        raise _type_error(f"{where}.function", "an object", function)
                    if not isinstance(function.get("name"), str):
                        raise _type_error(f"{where}.function.name", "a string", function.get("name"))
                    if not isinstance(function.get("arguments"), str):
                        raise _type_error(f"{where}.function.arguments", "a string", function.get("arguments"))
                pending = [call["id"] for call in calls]
                pending_at = m
            elif message.get("content") is None:
                raise _error(f"Invalid value for '{param}.content': expected a string, got null.",
                             f"{param}.content", "invalid_value")  # fmt: skip
        elif role == "function":
            raise _error("The 'function' role is deprecated and not supported by the emulator; use 'tool'.",
                         f"{param}.role", "invalid_value")  # fmt: skip
        else:
            allowed = ("text", "image_url") if role == "user" else ("text",)
            if "content" not in message:
                raise _error(f"Missing required parameter: '{param}.content'.", f"{param}.content",
                             "missing_required_parameter")  # fmt: skip
            _parts(message["content"], f"{param}.content", allowed)
    if pending:
        raise _error(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(pending)}",
            f"messages.[{pending_at}].role",
        )


def openai_image_tokens(width: int, height: int, detail: str = "auto") -> int:
    """One image's tokens as OpenAI's vision guide documents them for the GPT-4o class: `low` detail
    is a flat 85; `high` (and `auto`, counted as high) fits the image in 2048 x 2048, brings its
    shortest side down to 768 px, then costs 85 plus 170 per 512 px tile."""
    if detail == "low" or width <= 0 or height <= 0:
        return OPENAI_IMAGE_BASE_TOKENS
    scale = min(1.0, OPENAI_IMAGE_MAX_EDGE / max(width, height))
    scale *= min(1.0, OPENAI_IMAGE_SHORT_EDGE / (min(width, height) * scale))
    w, h = round(width * scale), round(height * scale)
    tiles = -(-w // OPENAI_IMAGE_TILE) * -(-h // OPENAI_IMAGE_TILE)
    return OPENAI_IMAGE_BASE_TOKENS + OPENAI_IMAGE_TILE_TOKENS * tiles


def _image_url_tokens(part: dict[str, Any]) -> int:
    image_url = part.get("image_url")
    url, detail = (image_url.get("url"), image_url.get("detail")) if isinstance(image_url, dict) else (image_url, None)
    detail = detail if detail in ("low", "high") else "auto"
    size = _data_url_size(url) if isinstance(url, str) else None
    # The emulator fetches nothing: an image it cannot see is counted at the largest size the formula allows.
    return openai_image_tokens(*size, detail) if size else openai_image_tokens(768, 2048, detail)


def _data_url_size(url: str) -> tuple[int, int] | None:
    header, _, data = url.partition(",")
    if not header.startswith("data:") or not header.endswith(";base64"):
        return None
    try:
        with Image.open(io.BytesIO(base64.b64decode(data, validate=True))) as image:
            return image.size
    except (binascii.Error, OSError, ValueError, Image.DecompressionBombError):
        return None


def chat_part_tokens(message: Any) -> int:
    """A chat message's tokens: the JSON estimate of its text, and each image by the documented formula,
    never by the length of its base64 data (EM-2)."""
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return estimate_json_tokens(message)
    images = [p for p in content if isinstance(p, dict) and p.get("type") == "image_url"]
    if not images:
        return estimate_json_tokens(message)
    rest = {**message, "content": [p for p in content if not (isinstance(p, dict) and p.get("type") == "image_url")]}
    return estimate_json_tokens(rest) + sum(_image_url_tokens(p) for p in images)


def openai_begin(emulator: Emulator, payload: dict[str, Any], fault: Fault | None = None) -> OpenAIPendingResponse:
    started_at = emulator.clock.now()
    fault = emulator.next_fault_openai(fault)
    check_chat_request(payload)
    model = payload["model"]
    messages = payload["messages"]
    parts = [["tool", t] for t in payload.get("tools") or []] + [["m", m] for m in messages]
    digest = hashlib.sha256(b"model:" + model.encode()).digest()
    hashes, cumulative, total = [], [], 0
    for part in parts:
        digest = hashlib.sha256(digest + canonical_json(part)).digest()
        hashes.append(digest.hex())
        total += chat_part_tokens(part[1]) if part[0] == "m" else estimate_json_tokens(part[1])
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
    content, stop = emulator.reply(openai_to_anthropic(payload))
    limit = payload.get("max_completion_tokens") or payload.get("max_tokens") or DEFAULT_MAX_COMPLETION_TOKENS
    stops = payload.get("stop") or []
    shaped = shape_reply(
        [b for b in content if b.get("type") in ("text", "tool_use")],
        max_tokens=limit,
        stop_sequences=[stops] if isinstance(stops, str) else stops,
        stop=stop,
    )
    return OpenAIPendingResponse(
        cache,
        f"chatcmpl-emu{emulator.next_id():08d}",
        model,
        shaped.content,
        total,
        cached,
        shaped.output_tokens,
        writes,
        fault,
        FINISH_REASONS.get(shaped.stop_reason, "stop"),
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
    finish_reason: str = "stop"
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

    def delta_count(self) -> int:
        return sum(len(word_chunks(b["text"])) for b in self.content if b.get("type") == "text") + len(
            self._tool_calls()
        )

    def _finish_reason(self) -> str:
        return self.finish_reason

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
        faulted = self.fault is not None and self.fault.kind in ("stream_cut", "stream_overloaded")
        budget = self.fault.after_chars if faulted and self.fault is not None else None
        streamed = 0
        yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
        for block in self.content:
            if block.get("type") != "text":
                continue
            for chunk in word_chunks(block["text"]):
                if budget is not None and streamed + len(chunk) > budget:
                    yield from self._interrupt(streamed)
                streamed += len(chunk)
                yield {**base, "choices": [{"index": 0, "delta": {"content": chunk}, "finish_reason": None}]}
        if budget is not None:
            yield from self._interrupt(streamed)
        for index, call in enumerate(self._tool_calls()):
            yield {
                **base,
                "choices": [{"index": 0, "delta": {"tool_calls": [{"index": index, **call}]}, "finish_reason": None}],
            }
        yield {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": self._finish_reason()}]}
        if include_usage:
            yield {**base, "choices": [], "usage": self.usage()}

    def _interrupt(self, streamed: int) -> Iterator[dict[str, Any]]:
        if self.fault is not None and self.fault.kind == "stream_overloaded":
            # OpenAI-compatible servers report a failure mid-stream as an `error` chunk, then end the stream.
            yield {"error": {"message": "Overloaded", "type": "server_error", "param": None, "code": "overloaded"}}
            raise StreamEnded
        raise StreamCut(f"stream cut after {streamed} characters")


class StreamEnded(Exception):
    """The stream ends early but cleanly (after an error chunk)."""


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
            else " ".join(p.get("text", "") for p in content or [] if p.get("type") == "text")
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
                arguments = call["function"].get("arguments") or "{}"
                try:
                    parsed = json.loads(arguments)
                except ValueError:
                    parsed = None
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": call["function"]["name"],
                        "input": parsed if isinstance(parsed, dict) else {"arguments": arguments},
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
