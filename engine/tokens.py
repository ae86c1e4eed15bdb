"""Token estimates shared by the whole product (runtime, Context view, emulator).

A calibrated heuristic: about four characters per token for English prose and
JSON. Provider counts replace it wherever the provider reports them.
"""

from __future__ import annotations

import json
from typing import Any

CHARS_PER_TOKEN = 4

# The system prompt Anthropic's Messages API adds to every request that carries tools, in tokens, as
# documented per model with tool-use pricing: (tool_choice auto or none, tool_choice any or tool).
# The first prefix that matches the model id wins; other models are counted like Claude 4.
TOOL_USE_SYSTEM_PROMPT: tuple[tuple[str, tuple[int, int]], ...] = (
    ("claude-3-5-haiku", (264, 340)),
    ("claude-3-haiku", (264, 340)),
)
DEFAULT_TOOL_USE_SYSTEM_PROMPT = (346, 313)
# Providers that count a request as the Messages API does: the API itself, and the offline model and
# the in-process emulator, which account through the emulator. An OpenAI-compatible server renders
# tools into its own chat template, whose size we do not know: calibration absorbs it there.
MESSAGES_API_PROVIDERS = frozenset({"anthropic", "offline", "emulator"})


def estimate_text_tokens(text: str) -> int:
    if not text:
        return 0
    return max(1, (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN)


def estimate_json_tokens(value: Any) -> int:
    return estimate_text_tokens(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False))


def tool_prompt_tokens(provider: str, model: str, *, forced: bool = False) -> int:
    """Tokens the provider adds to a request with tools, before any of ours (CH-12); 0 when unknown."""
    if provider not in MESSAGES_API_PROVIDERS:
        return 0
    sizes = next((sizes for prefix, sizes in TOOL_USE_SYSTEM_PROMPT if model.startswith(prefix)), None)
    return (sizes or DEFAULT_TOOL_USE_SYSTEM_PROMPT)[1 if forced else 0]


def cache_ratio(*, uncached: int, cache_write: int, cache_read: int) -> float | None:
    """Cache reads over every prompt token processed (TD-15, RN-2); undefined (None) when none was."""
    prompt = uncached + cache_write + cache_read
    return cache_read / prompt if prompt else None
