"""Pure transcript helpers: token estimates, call/result pairing, trim for resume (CH-6).

Messages are plain dicts in the Anthropic shape (`role`, `content` blocks); an
optional `id` key carries the database id through and is never sent. No Django here.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from PIL import Image

from engine.tokens import estimate_json_tokens, estimate_text_tokens

Msg = dict[str, Any]

# Image billing rules, chosen per provider. Anthropic documents about
# width * height / 750 tokens after scaling the image to fit 1568 px on the long
# edge and about 1.15 megapixels; some providers bill a flat rate per image.
# OpenAI's vision guide ("Calculating costs", GPT-4o class) bills 85 tokens at `low`
# detail, else fits the image in 2048 px, brings its shortest side to 768 px and adds
# 170 per 512 px tile; `auto` (what the app sends: no detail) counts as `high`.
AREA_DIVISOR = 750
AREA_MAX_EDGE = 1568
AREA_MAX_PIXELS = 1_150_000
FIXED_IMAGE_TOKENS = 1120
FIXED_MAX_EDGE = 2048
OPENAI_BASE_TOKENS = 85
OPENAI_TILE_TOKENS = 170
OPENAI_TILE = 512
OPENAI_MAX_EDGE = 2048
OPENAI_SHORT_EDGE = 768
UNKNOWN_IMAGE_TOKENS = 1600
IMAGE_RULES = ("area", "fixed", "openai")


def provider_image_rule(provider: str) -> str:
    """The image billing rule of a provider (CH-12): the chat-completions route's tiles for OpenAI,
    Anthropic's area rule for the Messages API and the offline model and emulator that model it."""
    return "openai" if provider == "openai" else "area"


def image_tokens(width: int, height: int, *, rule: str = "area", detail: str = "auto") -> int:
    """Estimated tokens a provider bills for one image of this size (`detail` matters to `openai` only)."""
    if width <= 0 or height <= 0:
        return 0
    if rule == "openai":
        return _openai_image_tokens(width, height, detail)
    if rule == "fixed":
        # A flat rate per image up to the maximum size; larger ones are split into tiles.
        tiles = -(-width // FIXED_MAX_EDGE) * -(-height // FIXED_MAX_EDGE)
        return FIXED_IMAGE_TOKENS * tiles
    if rule != "area":
        raise ValueError(f"unknown image billing rule {rule!r}; use one of {', '.join(IMAGE_RULES)}")
    scale = min(1.0, AREA_MAX_EDGE / max(width, height), (AREA_MAX_PIXELS / (width * height)) ** 0.5)
    w, h = int(width * scale), int(height * scale)
    return max(1, (w * h + AREA_DIVISOR - 1) // AREA_DIVISOR)


# The emulator (engine/emulator/openai_route.py) keeps its own copy of this rule on purpose: it stands
# for the provider, and tests/engine/test_image_estimate_rules.py checks that the two agree.
def _openai_image_tokens(width: int, height: int, detail: str) -> int:
    if detail == "low":
        return OPENAI_BASE_TOKENS
    scale = min(1.0, OPENAI_MAX_EDGE / max(width, height))
    scale *= min(1.0, OPENAI_SHORT_EDGE / (min(width, height) * scale))
    w, h = round(width * scale), round(height * scale)
    tiles = -(-w // OPENAI_TILE) * -(-h // OPENAI_TILE)
    return OPENAI_BASE_TOKENS + OPENAI_TILE_TOKENS * tiles


def image_size(block: dict[str, Any]) -> tuple[int, int] | None:
    """Width and height of an image block, from a hint or from the image header."""
    if "width" in block and "height" in block:
        return int(block["width"]), int(block["height"])
    source = block.get("source") or {}
    if source.get("type") != "base64":
        return None
    try:
        with Image.open(io.BytesIO(base64.b64decode(source.get("data", ""), validate=False))) as image:
            return image.size
    except (binascii.Error, OSError, ValueError):
        return None


def block_tokens(block: dict[str, Any], *, image_rule: str = "area") -> int:
    return sum(block_parts(block, image_rule=image_rule).values())


def block_parts(block: dict[str, Any], *, image_rule: str = "area") -> dict[str, int]:
    """A content block's tokens by the part of a `RequestCount` they belong to."""
    kind = block.get("type")
    if kind == "text":
        return {"messages": estimate_text_tokens(block.get("text", ""))}
    if kind == "image":
        size = image_size(block)
        # No block carries a detail and the OpenAI route sends none: the provider counts `auto`.
        return {"images": image_tokens(*size, rule=image_rule) if size else UNKNOWN_IMAGE_TOKENS}
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, list):
            parts = {"tool_results": 8}
            for inner in content:
                for part, tokens in block_parts(inner, image_rule=image_rule).items():
                    # Text inside a result is the tool's output, whatever block it comes in.
                    part = "images" if part == "images" else "tool_results"
                    parts[part] = parts.get(part, 0) + tokens
            return parts
        return {"tool_results": 8 + estimate_text_tokens(content if isinstance(content, str) else json.dumps(content))}
    # A cache marker is not billed: the API reads it and drops it.
    return {"messages": estimate_json_tokens(_unmarked(block))}


def _unmarked(value: dict[str, Any]) -> dict[str, Any]:
    return {key: item for key, item in value.items() if key != "cache_control"}


def message_tokens(message: Msg, *, image_rule: str = "area") -> int:
    # A few tokens of framing per message, like the providers' own accounting.
    return 4 + sum(block_tokens(block, image_rule=image_rule) for block in message.get("content") or [])


def transcript_tokens(messages: Sequence[Msg], *, image_rule: str = "area") -> int:
    return sum(message_tokens(message, image_rule=image_rule) for message in messages)


def tool_use_ids(message: Msg) -> list[str]:
    return [b["id"] for b in message.get("content") or [] if b.get("type") == "tool_use"]


def tool_result_ids(message: Msg) -> list[str]:
    return [b["tool_use_id"] for b in message.get("content") or [] if b.get("type") == "tool_result"]


def pairing_problems(messages: Sequence[Msg]) -> list[str]:
    """Why a provider would reject this transcript's tool pairing; empty when it is sendable."""
    problems = []
    calls: set[str] = set()
    results: set[str] = set()
    for message in messages:
        for result_id in tool_result_ids(message):
            if result_id not in calls:
                problems.append(f"tool result {result_id} has no tool call before it")
            results.add(result_id)
        calls.update(tool_use_ids(message))
    problems.extend(f"tool call {call_id} has no result" for call_id in sorted(calls - results))
    return problems


def is_clean_boundary(messages: Sequence[Msg]) -> bool:
    """A transcript ending here is a finished turn: a final answer with no pending tool call."""
    if not messages:
        return True
    last = messages[-1]
    return last.get("role") == "assistant" and not tool_use_ids(last)


@dataclass(frozen=True)
class Trimmed:
    messages: list[Msg]
    start: int
    tokens: int
    dropped: int


def valid_cut_starts(messages: Sequence[Msg]) -> list[int]:
    """Indexes where a suffix may start: it begins with a user turn and keeps every call with its result."""
    n = len(messages)
    # Walk backwards so each check is O(1): a suffix is valid when every result in it
    # has its call in it and every call in it has its result in it.
    starts = []
    calls_in: set[str] = set()
    results_in: set[str] = set()
    unmatched_results = 0
    unmatched_calls = 0
    for index in range(n - 1, -1, -1):
        message = messages[index]
        for call_id in tool_use_ids(message):
            calls_in.add(call_id)
            if call_id in results_in:
                unmatched_results -= 1
            else:
                unmatched_calls += 1
        for result_id in tool_result_ids(message):
            # Only a call earlier than its result can match it; a result before its
            # call stays unmatched, so no cut that includes it is offered.
            results_in.add(result_id)
            unmatched_results += 1
        if unmatched_results == 0 and unmatched_calls == 0 and message.get("role") == "user":
            starts.append(index)
    starts.reverse()
    return starts


def trim_for_resume(messages: Sequence[Msg], *, budget_tokens: int, image_rule: str = "area") -> Trimmed:
    """The longest suffix within `budget_tokens` that starts with a user turn and orphans nothing (CH-6).

    A transcript that cannot be sent is worse than a short one, so when no valid
    suffix fits the budget the result is empty rather than a cut through a pair.
    """
    sizes = [message_tokens(message, image_rule=image_rule) for message in messages]
    suffix_tokens = [0] * (len(messages) + 1)
    for index in range(len(messages) - 1, -1, -1):
        suffix_tokens[index] = suffix_tokens[index + 1] + sizes[index]
    for start in valid_cut_starts(messages):
        if suffix_tokens[start] <= budget_tokens:
            kept = list(messages[start:])
            return Trimmed(kept, start, suffix_tokens[start], start)
    return Trimmed([], len(messages), 0, len(messages))


def text_of(message: Msg) -> str:
    return "\n".join(b.get("text", "") for b in message.get("content") or [] if b.get("type") == "text")


def api_messages(messages: Sequence[Msg]) -> list[Msg]:
    """The messages as a provider takes them: only `role` and `content`."""
    return [{"role": message["role"], "content": message["content"]} for message in messages]


# Parts of a request counted with our characters-a-token heuristic: a calibration scales them to the
# provider's tokenizer. The other parts are counted by the provider's documented rule and never scaled.
COUNTED_PARTS = ("system", "tools", "messages", "tool_results")
FORMULA_PARTS = ("tool_prompt", "images")


@dataclass(frozen=True)
class RequestCount:
    """Our count of one request by part (CH-12).

    `tool_prompt` is the system prompt the provider adds when tools are present (a documented
    size per model) and `images` are counted by the documented size formula: neither is text our
    heuristic could mis-count, so calibration leaves them as they are (`formula`). The rest
    (`counted`) is four characters a token, which a provider's tokenizer sees differently.
    """

    system: int = 0
    tools: int = 0
    tool_prompt: int = 0
    messages: int = 0
    tool_results: int = 0
    images: int = 0

    @property
    def total(self) -> int:
        return self.counted + self.formula

    @property
    def formula(self) -> int:
        return self.tool_prompt + self.images

    @property
    def counted(self) -> int:
        return self.system + self.tools + self.messages + self.tool_results

    def __add__(self, other: RequestCount) -> RequestCount:
        return RequestCount(
            **{part: getattr(self, part) + getattr(other, part) for part in (*COUNTED_PARTS, *FORMULA_PARTS)}
        )

    def as_dict(self) -> dict[str, int]:
        return {part: getattr(self, part) for part in (*COUNTED_PARTS, *FORMULA_PARTS)}

    @classmethod
    def from_dict(cls, parts: dict[str, Any]) -> RequestCount:
        return cls(**{part: int(parts.get(part, 0)) for part in (*COUNTED_PARTS, *FORMULA_PARTS)})


def messages_count(messages: Sequence[Msg], *, image_rule: str = "area") -> RequestCount:
    """The messages' share of a request by part; its total is `transcript_tokens(messages)`."""
    parts = dict.fromkeys(("messages", "tool_results", "images"), 0)
    for message in messages:
        parts["messages"] += 4
        for block in message.get("content") or []:
            for part, tokens in block_parts(block, image_rule=image_rule).items():
                parts[part] += tokens
    return RequestCount(**parts)


def overhead_count(
    system: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], *, tool_prompt: int = 0
) -> RequestCount:
    """What a request carries besides its messages: the system blocks' text, every tool schema sent and,
    when there are tools, the tool-use system prompt the provider adds (`tool_prompt`, its documented size)."""
    return RequestCount(
        system=sum(estimate_text_tokens(block.get("text", "")) for block in system),
        tools=sum(estimate_json_tokens(_unmarked(tool)) for tool in tools),
        tool_prompt=tool_prompt if tools else 0,
    )


def request_count(
    system: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]],
    messages: Sequence[Msg],
    *,
    tool_prompt: int = 0,
    image_rule: str = "area",
) -> RequestCount:
    """The one estimate of a whole request (CH-12): system, tools and the provider's tool-use prompt,
    messages, images by the documented rule.

    The trigger, the Context view, reactive recovery and the recorded estimate all use it,
    so they can never disagree about whether a request fits.
    """
    return overhead_count(system, tools, tool_prompt=tool_prompt) + messages_count(messages, image_rule=image_rule)


def request_tokens(
    system: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]],
    messages: Sequence[Msg],
    *,
    tool_prompt: int = 0,
    image_rule: str = "area",
) -> int:
    return request_count(system, tools, messages, tool_prompt=tool_prompt, image_rule=image_rule).total
