"""How deep a JSON value nests, measured without recursion: the value may come from anyone."""

from __future__ import annotations

from typing import Any


def nesting_depth(value: Any, limit: int) -> int:
    """How deep `value` nests objects and arrays (a scalar is 0), counted without recursion and
    only up to `limit` + 1: past the limit the exact figure does not matter."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest
