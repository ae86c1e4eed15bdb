"""Money per run and per conversation, from recorded usage and per-model prices (UX-6).

Prices are USD per million tokens, (input, output), from `CC_MODEL_PRICES`, else the public
Anthropic list prices of the models offered. A cache write costs 1.25× an input token for the
5-minute cache and 2× for the 1-hour cache (the tools and system prefix are written with the 1-hour
TTL, TD-13); a write whose TTL the provider did not report counts as 5-minute. A cache read costs
0.1×. A model without a price has no money figure ("—"), never 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings

from agents.usage import summed_ratio

# Public list prices (anthropic.com/pricing), USD per million tokens: (input, output).
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4-1": (15.0, 75.0),
    "claude-opus-4": (15.0, 75.0),
    "claude-sonnet-4-5": (3.0, 15.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-3-7-sonnet": (3.0, 15.0),
    "claude-3-5-sonnet": (3.0, 15.0),
    "claude-haiku-4-5": (1.0, 5.0),
    "claude-3-5-haiku": (0.8, 4.0),
    "claude-3-haiku": (0.25, 1.25),
}
CACHE_WRITE_FACTOR = 1.25
CACHE_WRITE_1H_FACTOR = 2.0
CACHE_READ_FACTOR = 0.1
USAGE_FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")
# What money needs beyond the token kinds shown: the share of cache writes made with the 1-hour TTL.
COST_FIELDS = (*USAGE_FIELDS, "cache_creation_1h_input_tokens")


def price_for(model: str) -> tuple[float, float] | None:
    """The model's price: the setting's entry, else the longest default its name starts with
    (a dated name such as claude-sonnet-4-5-20250929 costs what its family costs)."""
    configured: Mapping[str, tuple[float, float]] = getattr(settings, "CC_MODEL_PRICES", {})
    if model in configured:
        return configured[model]
    for name in sorted(DEFAULT_PRICES, key=len, reverse=True):
        if model.startswith(name):
            return DEFAULT_PRICES[name]
    return None


def usage_cost(model: str, usage: Mapping[str, int]) -> float | None:
    price = price_for(model)
    if price is None:
        return None
    per_input, per_output = price
    written_1h = usage.get("cache_creation_1h_input_tokens") or 0
    written_5m = (usage.get("cache_creation_input_tokens") or 0) - written_1h
    return (
        usage.get("input_tokens", 0) * per_input
        + written_5m * per_input * CACHE_WRITE_FACTOR
        + written_1h * per_input * CACHE_WRITE_1H_FACTOR
        + usage.get("cache_read_input_tokens", 0) * per_input * CACHE_READ_FACTOR
        + usage.get("output_tokens", 0) * per_output
    ) / 1_000_000


def usage_summary(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Tokens by kind, the cache ratio and the money of rows of usage that each name their `model`
    and carry `agents.usage.ratio_sums()`; money is None if any priced-less model spent tokens."""
    rows = list(rows)
    totals = dict.fromkeys(USAGE_FIELDS, 0)
    cost: float | None = 0.0
    for row in rows:
        for field in USAGE_FIELDS:
            totals[field] += row.get(field) or 0
        spent = usage_cost(row["model"], row)
        if spent is None and any(row.get(field) for field in USAGE_FIELDS):
            cost = None
        elif spent is not None and cost is not None:
            cost += spent
    prompt = totals["input_tokens"] + totals["cache_creation_input_tokens"] + totals["cache_read_input_tokens"]
    return {
        **totals,
        "prompt_tokens": prompt,
        "cache_ratio": summed_ratio(rows),
        "cost": cost,
    }
