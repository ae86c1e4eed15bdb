"""Our request count brought to the provider's units by the usage it measured (CH-12).

Pure: the caller hands in what it recorded (our `RequestCount` of each answered request and the
prompt tokens the provider reported for it, oldest first) and gets a `Calibration` to apply to
the next request of the same conversation and model.

Only the heuristic parts of a count are scaled. The tool-use system prompt and images are
counted by the provider's documented rules; scaling them by a text tokenizer's ratio would turn
a snapshot pass, which swaps text for pages, into an error the size of the ratio.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.context.transcript import COUNTED_PARTS, RequestCount

# How far a measured request may move our estimate: tokenizers differ from four characters a token
# by 10-20 %, and a provider that counts some part another way must not make every turn compact.
CALIBRATION_BOUNDS = (0.8, 1.25)

# (our count of an answered request, the prompt tokens the provider measured for it)
Measured = tuple[RequestCount, int]


@dataclass(frozen=True)
class Calibration:
    """A factor per heuristic part of a count; the formula parts are taken as they are."""

    factors: tuple[float, ...] = (1.0,) * len(COUNTED_PARTS)

    def tokens(self, count: RequestCount) -> int:
        """The count in the provider's units."""
        scaled = sum(factor * getattr(count, part) for factor, part in zip(self.factors, COUNTED_PARTS, strict=True))
        return round(count.formula + scaled)

    def factor(self, count: RequestCount) -> float:
        """The one multiplier that brings this count's total to `tokens(count)`: thresholds in the provider's
        units divided by it are in our estimate's."""
        return self.tokens(count) / count.total if count.total else 1.0


def calibration_from(measured: Sequence[Measured]) -> Calibration:
    """The calibration the latest answered request gives: its measured tokens over our count, formula parts
    set aside on both sides; none (1.0) before any request was answered."""
    for count, prompt_tokens in reversed(measured):
        if prompt_tokens > 0 and count.counted > 0:
            low, high = CALIBRATION_BOUNDS
            ratio = min(high, max(low, (prompt_tokens - count.formula) / count.counted))
            return Calibration((ratio,) * len(COUNTED_PARTS))
    return Calibration()
