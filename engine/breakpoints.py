"""Where the four cache breakpoints go (TD-13), and the bytes the cache keys on (TD-11).

Pure: no Django. The provider allows four markers; the runtime spends them as

| label          | block                                   | TTL |
|----------------|-----------------------------------------|-----|
| `tools`        | last resident tool                      | 1h  |
| `system`       | last system block (tools + system)      | 1h  |
| `previous_turn`| where the previous request stopped      | 5m  |
| `current_turn` | last block of the whole history         | 5m  |

The previous-request marker is what makes the hit structural: one step with many
parallel tool calls can push the end of the previous request beyond the provider's
lookback window from the new end; a marker on the exact block where the previous
request stopped is found whatever lies in between.
"""

from __future__ import annotations

from typing import Any, Literal

from engine.request import CachePoint, ModelRequestSpec, canonical_json

Ttl = Literal["5m", "1h"]
TOOLS_TTL: Ttl = "1h"
SYSTEM_TTL: Ttl = "1h"
HISTORY_TTL: Ttl = "5m"


def last_resident_tool(tools: list[dict[str, Any]], resident_count: int | None = None) -> int | None:
    """Index of the last tool of the cached block.

    `resident_count` comes from a toolbox that appends activated schemas after its
    resident block (TD-11); without it, the last tool not marked `defer_loading`.
    """
    if resident_count is not None:
        return resident_count - 1 if 0 < resident_count <= len(tools) else None
    for index in range(len(tools) - 1, -1, -1):
        if not tools[index].get("defer_loading"):
            return index
    return None


def place_breakpoints(
    spec: ModelRequestSpec, *, previous_end: int | None, resident_count: int | None = None
) -> ModelRequestSpec:
    """Set the four TD-13 markers on `spec` (replacing any) and record their labels.

    `previous_end` is the index of the last message the previous request sent (for
    the first step of a turn: the end of the previous turn). Markers beside blocks,
    never inside them: the history itself is not touched (TD-11).
    """
    points: list[CachePoint] = []
    tool_index = last_resident_tool(spec.tools, resident_count)
    if tool_index is not None:
        points.append(CachePoint("tools", tool_index, ttl=TOOLS_TTL, label="tools"))
    if spec.system:
        points.append(CachePoint("system", len(spec.system) - 1, ttl=SYSTEM_TTL, label="system"))
    last = len(spec.messages) - 1
    if previous_end is not None and 0 <= previous_end < last and _has_blocks(spec.messages[previous_end]):
        points.append(CachePoint("messages", previous_end, ttl=HISTORY_TTL, label="previous_turn"))
    if last >= 0 and _has_blocks(spec.messages[last]):
        points.append(CachePoint("messages", last, ttl=HISTORY_TTL, label="current_turn"))
    spec.cache_points = points
    spec.breakpoints = spec.breakpoint_labels()
    return spec


def _has_blocks(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return bool(content) if isinstance(content, list) else bool(content)


def prefix_bytes(spec: ModelRequestSpec, *, messages: int | None = None) -> bytes:
    """The request as the cache reads it: resident tools, system, then messages, markers stripped.

    `messages` limits how many messages are included. Request N+1 is append-only
    over request N when `prefix_bytes(n1, messages=len(n.messages)) == prefix_bytes(n)`.
    """
    payload = spec.as_payload()
    # A `defer_loading` tool is not part of the prefix: it enters where a tool_reference loads it.
    parts = [canonical_json(_strip(tool)) for tool in payload.get("tools", []) if not tool.get("defer_loading")]
    parts += [canonical_json(_strip(block)) for block in payload["system"]]
    chosen = payload["messages"] if messages is None else payload["messages"][:messages]
    parts += [canonical_json(_strip(message)) for message in chosen]
    return b"\n".join(parts)


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value
