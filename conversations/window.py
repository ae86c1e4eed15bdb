"""What the window budget is (LM-2), as the Context view and its API show it."""

from __future__ import annotations

from typing import Any

from django.conf import settings


def window_budget(*, resident_tokens: int, loaded_budget_tokens: int | None = None) -> dict[str, Any]:
    """Every figure that scales with CC_CONTEXT_WINDOW_TOKENS, and the tool block against its share
    (`loaded_budget_tokens`: what of that share the tools a run loads may take, None without deferral)."""
    window = settings.CC_CONTEXT_WINDOW_TOKENS
    tool_budget = window * settings.CC_TOOL_WINDOW_PERCENT // 100
    return {
        "window_tokens": window,
        "tool_budget_tokens": tool_budget,
        "tool_percent": round(100 * resident_tokens / window, 1),
        "tool_percent_limit": settings.CC_TOOL_WINDOW_PERCENT,
        "loaded_budget_tokens": loaded_budget_tokens,
        "compact_at_tokens": window * settings.CC_COMPACT_AT_PERCENT // 100,
        "compact_tail_tokens": settings.CC_COMPACT_TAIL_TOKENS,
        "prune_min_tokens": settings.CC_PRUNE_MIN_TOKENS,
        "scratchpad_threshold_bytes": settings.SCRATCHPAD_THRESHOLD_BYTES,
        "scratchpad_summary_chars": settings.SCRATCHPAD_SUMMARY_CHARS,
        "max_output_tokens": settings.CC_MAX_OUTPUT_TOKENS,
        "snapshot_page_pixels": settings.CC_SNAPSHOT_PAGE_PIXELS,
    }
