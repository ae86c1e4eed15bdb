"""Token estimates shared by the whole product (runtime, Context view, emulator).

A calibrated heuristic: about four characters per token for English prose and
JSON. Provider counts replace it wherever the provider reports them.
"""

from __future__ import annotations

import json
from typing import Any

CHARS_PER_TOKEN = 4


def estimate_text_tokens(text: str) -> int:
    if not text:
        return 0
    return max(1, (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN)


def estimate_json_tokens(value: Any) -> int:
    return estimate_text_tokens(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False))


def cache_ratio(*, uncached: int, cache_write: int, cache_read: int) -> float | None:
    """Cache reads over every prompt token processed (TD-15, RN-2); undefined (None) when none was."""
    prompt = uncached + cache_write + cache_read
    return cache_read / prompt if prompt else None
