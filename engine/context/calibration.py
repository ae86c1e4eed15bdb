"""Our request count brought to the provider's units by the usage it measured (CH-12).

Pure: the caller hands in what it recorded (our `RequestCount` of each answered request and the
prompt tokens the provider reported for it, oldest first) and gets a `Calibration` to apply to
the next request of the same conversation and model.

Only the heuristic parts of a count are scaled. The tool-use system prompt and images are
counted by the provider's documented rules; scaling them by a text tokenizer's ratio would turn
a snapshot pass, which swaps text for pages, into an error the size of the ratio.

The heuristic parts get a factor each: a tokenizer that reads prose at four characters a token
reads a build log or JSON at three, so one factor fitted on a request full of tool output is
wrong for the next one once compaction has elided that output. One request cannot tell the parts
apart; several, whose mix differs, can. The factors are the least-squares fit of the latest
requests' relative errors, the newest weighing most, pulled towards one common factor so a part
the requests do not tell apart keeps the common one instead of an arbitrary one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.context.transcript import RequestCount

# How far a measured request may move our estimate: tokenizers differ from four characters a token
# by 10-20 %, and a provider that counts some part another way must not make every turn compact.
CALIBRATION_BOUNDS = (0.8, 1.25)

# The heuristic parts fitted apart. The system prompt and the tool schemas go together: both are
# in every request at nearly the same size, so the requests could never tell them apart.
GROUPS: tuple[tuple[str, ...], ...] = (("system", "tools"), ("messages",), ("tool_results",))
# A request's weight halves about every six requests: the latest mix and content say most.
RECENCY = 0.9
# The pull towards one common factor, against the sum of squared relative errors it trades with:
# at 0.01, parts split apart only when that fits the requests clearly better (a 1 % relative error
# over several requests), not to chase the noise of one.
SHRINK = 0.01

# (our count of an answered request, the prompt tokens the provider measured for it)
Measured = tuple[RequestCount, int]


@dataclass(frozen=True)
class Calibration:
    """A factor per group of heuristic parts (`GROUPS`); the formula parts are taken as they are."""

    factors: tuple[float, ...] = (1.0,) * len(GROUPS)

    def tokens(self, count: RequestCount) -> int:
        """The count in the provider's units."""
        return round(count.formula + sum(f * x for f, x in zip(self.factors, _grouped(count), strict=True)))

    def factor(self, count: RequestCount) -> float:
        """The one multiplier that brings this count's total to `tokens(count)`: thresholds in the provider's
        units divided by it are in our estimate's."""
        return self.tokens(count) / count.total if count.total else 1.0


def calibration_from(measured: Sequence[Measured]) -> Calibration:
    """The factors that best explain the answered requests (oldest first), formula parts set aside on
    both sides; none (1.0) before any request was answered. From one request: its measured over our count."""
    rows = [(_grouped(count), tokens - count.formula) for count, tokens in measured if tokens > 0 and count.counted > 0]
    if not rows:
        return Calibration()
    size = len(GROUPS)
    # Normal equations of sum_i w_i (y_i - x_i . f)^2 + SHRINK * sum_g (f_g - mean(f))^2, with
    # w_i = RECENCY^age / y_i^2: relative errors, so a large request does not drown the small ones.
    normal = [[SHRINK * ((g == h) - 1 / size) for h in range(size)] for g in range(size)]
    target = [0.0] * size
    for age, (x, y) in enumerate(reversed(rows)):
        weight = RECENCY**age / max(1, y) ** 2
        for g in range(size):
            target[g] += weight * x[g] * y
            for h in range(size):
                normal[g][h] += weight * x[g] * x[h]
    factors = _solve(normal, target)
    if factors is None:
        # Cannot happen while a request has heuristic tokens (the shrink term fixes every difference
        # between factors, the data their common level); kept as the plain ratio of the latest.
        x, y = rows[-1]
        factors = [y / sum(x)] * size
    low, high = CALIBRATION_BOUNDS
    return Calibration(tuple(min(high, max(low, factor)) for factor in factors))


def _grouped(count: RequestCount) -> list[int]:
    return [sum(getattr(count, part) for part in group) for group in GROUPS]


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when the system is singular."""
    size = len(vector)
    rows = [[*matrix[i], vector[i]] for i in range(size)]
    for column in range(size):
        pivot = max(range(column, size), key=lambda r: abs(rows[r][column]))
        if abs(rows[pivot][column]) < 1e-12:
            return None
        rows[column], rows[pivot] = rows[pivot], rows[column]
        for r in range(size):
            if r != column:
                k = rows[r][column] / rows[column][column]
                rows[r] = [a - k * b for a, b in zip(rows[r], rows[column], strict=True)]
    return [rows[i][size] / rows[i][i] for i in range(size)]
