"""A provider-neutral model request, in the canonical Anthropic shape.

Serialization is deterministic (sorted keys, no whitespace) so that equal
prefixes are equal bytes, which is what a prompt cache keys on (TD-11).

Cache breakpoints are carried beside the blocks (`cache_points`), not inside
them, so the runtime can move its rolling markers without touching the blocks it
already sent; `as_payload()` renders them as `cache_control` on the named blocks.
Tools may carry `defer_loading: true`: sent, but not part of the cached prefix
until a `tool_reference` block in a tool result loads them (TD-11).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Literal

CacheTTL = Literal["5m", "1h"]
_TTLS = ("5m", "1h")


@dataclass(frozen=True)
class CachePoint:
    """A breakpoint: cache the prefix up to and including one block.

    `section` is "tools", "system" or "messages"; `index` is the tool, system block
    or message index; `block` is the content-block index inside a message (-1 = its
    last block). `label` is what the run records (e.g. "tools", "previous_turn").
    """

    section: Literal["tools", "system", "messages"]
    index: int
    block: int = -1
    ttl: CacheTTL = "5m"
    label: str = ""

    def __post_init__(self) -> None:
        if self.section not in ("tools", "system", "messages"):
            raise ValueError(f"cache point section must be tools, system or messages, not {self.section!r}")
        if self.ttl not in _TTLS:
            raise ValueError(f"cache point ttl must be one of {_TTLS}, not {self.ttl!r}")


@dataclass
class ModelRequestSpec:
    model: str
    system: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    max_tokens: int = 4096
    breakpoints: list[str] = field(default_factory=list)
    cache_points: list[CachePoint] = field(default_factory=list)
    # Anthropic's shape ({"type": "auto" | "any" | "tool", "name": ...}); None leaves the API's default.
    tool_choice: dict[str, Any] | None = None

    def as_payload(self) -> dict[str, Any]:
        system, tools, messages = self.system, self.tools, self.messages
        if self.cache_points:
            # Copies: the caller's history must stay exactly as it was sent (TD-11).
            system, tools, messages = copy.deepcopy((system, tools, messages))
            for point in self.cache_points:
                _target_block(point, tools=tools, system=system, messages=messages)["cache_control"] = _cache_control(
                    point.ttl
                )
        payload: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": system,
            "messages": messages,
        }
        if tools:
            payload["tools"] = tools
        if self.tool_choice is not None:
            payload["tool_choice"] = self.tool_choice
        return payload

    def serialize(self) -> bytes:
        return canonical_json(self.as_payload())

    def breakpoint_labels(self) -> list[str]:
        return [point.label or f"{point.section}[{point.index}]:{point.ttl}" for point in self.cache_points]


def _cache_control(ttl: CacheTTL) -> dict[str, str]:
    # "5m" is the API's default; spelling it out keeps both forms from meaning one thing twice.
    return {"type": "ephemeral"} if ttl == "5m" else {"type": "ephemeral", "ttl": ttl}


def _target_block(
    point: CachePoint, *, tools: list[dict[str, Any]], system: list[dict[str, Any]], messages: list[dict[str, Any]]
) -> dict[str, Any]:
    try:
        if point.section == "tools":
            return tools[point.index]
        if point.section == "system":
            return system[point.index]
        message = messages[point.index]
    except IndexError:
        raise ValueError(f"cache point {point} names a block that does not exist") from None
    if isinstance(message["content"], str):
        message["content"] = [text_block(message["content"])]
    try:
        block: dict[str, Any] = message["content"][point.block]
        return block
    except IndexError:
        raise ValueError(f"cache point {point} names a block that does not exist") from None


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def tool_reference(name: str) -> dict[str, Any]:
    """Inside a tool result: loads the `defer_loading` tool `name` at this point of the prompt (TD-11)."""
    return {"type": "tool_reference", "tool_name": name}


def without_tool_references(messages: list[dict[str, Any]], names: set[str]) -> list[dict[str, Any]]:
    """`messages` with the `tool_reference` blocks that name one of `names` taken out of their tool results."""

    def keep(item: Any) -> bool:
        return not (isinstance(item, dict) and item.get("type") == "tool_reference" and item.get("tool_name") in names)

    cleaned = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = [
                {**block, "content": [item for item in block["content"] if keep(item)]}
                if isinstance(block, dict) and isinstance(block.get("content"), list)
                else block
                for block in content
            ]
        cleaned.append({**message, "content": content})
    return cleaned


def referenced_tools(messages: list[dict[str, Any]]) -> list[str]:
    """Names loaded by `tool_reference` blocks in the tool results of `messages`, in order of first reference."""
    names: list[str] = []
    for message in messages:
        for block in message["content"] if isinstance(message.get("content"), list) else []:
            for item in block.get("content") if isinstance(block.get("content"), list) else []:
                if item.get("type") == "tool_reference" and item.get("tool_name") not in names:
                    names.append(item["tool_name"])
    return names


def called_tools(messages: list[dict[str, Any]]) -> set[str]:
    """The names `messages` call (`tool_use` blocks)."""
    return {
        block.get("name", "")
        for message in messages
        for block in (message["content"] if isinstance(message.get("content"), list) else [])
        if block.get("type") == "tool_use"
    }


def tools_by_recency(messages: list[dict[str, Any]]) -> list[str]:
    """Every tool `messages` called (`tool_use`) or loaded (`tool_reference`), the least recently used first."""
    order: list[str] = []
    for message in messages:
        for block in message["content"] if isinstance(message.get("content"), list) else []:
            used = [block.get("name", "")] if block.get("type") == "tool_use" else []
            for item in block.get("content") if isinstance(block.get("content"), list) else []:
                if isinstance(item, dict) and item.get("type") == "tool_reference":
                    used.append(item.get("tool_name", ""))
            for name in used:
                if name in order:
                    order.remove(name)
                order.append(name)
    return order
