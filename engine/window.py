"""Budgets that scale with the model's context window (LM-2).

The defaults were written for a 200K window; an 8K local model needs the same product
at a smaller scale. Each figure is its configured default capped at a share of the
window, so a large window keeps today's behaviour exactly and a small one shrinks
every threshold with it. Pure: settings call `budget_for_window` once at start.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.tokens import CHARS_PER_TOKEN

# Shares of the window; the reasoning is in each field's comment below.
TOOL_SHARE = 0.25
PRUNE_SHARE = 0.10
TAIL_SHARE = 0.25
OBSERVATION_SHARE = 0.05
SUMMARY_SHARE = 0.02
OUTPUT_SHARE = 0.25
PAGE_SHARE = 0.05


@dataclass(frozen=True)
class WindowBudget:
    window_tokens: int
    # The resident tool block may take at most this much; the rest is deferred (TD-2).
    tool_tokens: int
    # Pruning frees at least this much at once (TD-12): a rare rewrite, never a steady miss.
    prune_min_tokens: int
    # The literal tail compaction keeps (CH-2).
    compact_tail_tokens: int
    # Observations larger than this go to the scratchpad (SP-1)...
    scratchpad_threshold_bytes: int
    # ...and the model sees this many characters of each end instead (SP-4).
    summary_chars: int
    # What a request asks the model to write at most.
    max_output_tokens: int
    # Compact from this share of the window, down to that one (CH-2): below the room the reply needs.
    compact_at_percent: int
    compact_to_percent: int
    # The side of a square snapshot page, whose image costs at most PAGE_SHARE of the window (CH-3).
    page_pixels: int


def budget_for_window(
    window_tokens: int,
    *,
    prune_min_tokens: int = 20_000,
    compact_tail_tokens: int = 8_000,
    scratchpad_threshold_bytes: int = 4096,
    summary_chars: int = 500,
    max_output_tokens: int = 4096,
    page_pixels: int = 1072,
    compact_at_percent: int = 80,
    compact_to_percent: int = 50,
) -> WindowBudget:
    """Each default, capped at its share of `window_tokens` (never below a floor that still works)."""
    window = max(1024, window_tokens)
    # An image costs about width * height / 750 tokens (the area rule).
    page_side = int((window * PAGE_SHARE * 750) ** 0.5)
    output = min(max_output_tokens, max(256, int(window * OUTPUT_SHARE)))
    # The prompt and the reply it asks room for share the window; 10 points for the estimate's error.
    compact_at = min(compact_at_percent, 100 - (100 * output + window - 1) // window - 10)
    return WindowBudget(
        window_tokens=window,
        tool_tokens=int(window * TOOL_SHARE),
        prune_min_tokens=min(prune_min_tokens, max(256, int(window * PRUNE_SHARE))),
        compact_tail_tokens=min(compact_tail_tokens, max(256, int(window * TAIL_SHARE))),
        scratchpad_threshold_bytes=min(
            scratchpad_threshold_bytes, max(512, int(window * OBSERVATION_SHARE * CHARS_PER_TOKEN))
        ),
        summary_chars=min(summary_chars, max(80, int(window * SUMMARY_SHARE * CHARS_PER_TOKEN) // 2)),
        max_output_tokens=output,
        compact_at_percent=compact_at,
        compact_to_percent=min(compact_to_percent, compact_at - 20),
        page_pixels=min(page_pixels, max(256, page_side)),
    )
