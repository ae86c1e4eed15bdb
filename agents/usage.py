"""Recorded model requests: each one's record (`request_recorder`), and their cache ratio, counted only
where the model server reported its cache (RN-2, TD-15).

A server that sends no cache figures (llama.cpp's) did not say "nothing was cached": its requests
count in every token total, never in a ratio, so a window of them alone has no ratio ("—"),
never a measured-looking 0 %.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.db.models import Q, Sum, Value
from django.db.models.functions import Coalesce

from agents.models import ModelRequest, Run
from controlcenter.db import db_turn, reconnecting
from engine.loop import RETRIED, StepRecord
from engine.tokens import cache_ratio

# Ratio inputs: (key in a row, ModelRequest field).
RATIO_PARTS = (
    ("ratio_uncached", "input_tokens"),
    ("ratio_cache_write", "cache_creation_input_tokens"),
    ("ratio_cache_read", "cache_read_input_tokens"),
)


def requests_ratio(requests: Iterable[ModelRequest]) -> float | None:
    """The cache ratio of ModelRequest rows already loaded."""
    reported = [request for request in requests if request.cache_reported]
    return ratio_of({key: sum(getattr(request, field) for request in reported) for key, field in RATIO_PARTS})


def ratio_sums(prefix: str = "") -> dict[str, Any]:
    """Aggregates of the ratio inputs over the grouped requests that reported their cache; `prefix`
    reaches ModelRequest from another model (`"model_requests__"` from Run)."""
    reported = Q(**{f"{prefix}cache_reported": True})
    return {key: Coalesce(Sum(f"{prefix}{field}", filter=reported), Value(0)) for key, field in RATIO_PARTS}


def ratio_of(row: Mapping[str, Any]) -> float | None:
    """The cache ratio of a row annotated with `ratio_sums()`, or of summed such rows."""
    return cache_ratio(
        uncached=row["ratio_uncached"], cache_write=row["ratio_cache_write"], cache_read=row["ratio_cache_read"]
    )


def summed_ratio(rows: Iterable[Mapping[str, Any]]) -> float | None:
    """The cache ratio of several rows annotated with `ratio_sums()` taken together."""
    totals = dict.fromkeys((key for key, _ in RATIO_PARTS), 0)
    for row in rows:
        for key in totals:
            totals[key] += row[key]
    return ratio_of(totals)


def request_recorder(run: Run, *, label: str = "") -> Callable[[StepRecord], None]:
    """Store each model request once its answer begins, and again as its reply comes in (a step's
    later record replaces its earlier one): it was paid for however the turn ends (failed, cancelled,
    handed off, its worker killed, its turn dropped), and the usage bar and dashboard show a long
    turn's spend while it runs. An attempt broken off and retried keeps a row of its own ("retried").
    A child's requests are its parent run's, labelled `<fan-out>/<index>` (TD-14), and a summary
    call's `summary`."""
    rows: dict[int, ModelRequest] = {}

    def record(step: StepRecord) -> None:
        row = ModelRequest(
            pk=rows[step.step].pk if step.step in rows else None,
            run=run,
            owner_id=run.conversation.owner_id,
            subagent=label,
            step=step.step,
            model=run.model,
            input_tokens=step.usage.input_tokens,
            cache_creation_input_tokens=step.usage.cache_creation_input_tokens,
            cache_read_input_tokens=step.usage.cache_read_input_tokens,
            cache_creation_5m_input_tokens=step.usage.cache_creation_5m_input_tokens,
            cache_creation_1h_input_tokens=step.usage.cache_creation_1h_input_tokens,
            output_tokens=step.usage.output_tokens,
            usage_source=step.usage.source,
            cache_reported=step.usage.cache_reported,
            request_id=step.request_id,
            breakpoints=step.breakpoints,
            tools_loaded=step.tools_loaded,
            cache_miss=step.cache_miss,
            stop_reason=step.stop_reason,
            duration_ms=step.duration_ms,
            estimated_tokens=step.estimate.total,
            estimated_parts=step.estimate.as_dict(),
        )
        if step.step in rows:
            row.created_at = rows[step.step].created_at  # when the request was made, not when it ended
        with db_turn():
            reconnecting(row.save)
        if step.stop_reason == RETRIED:
            rows.pop(step.step, None)  # closed: the retry is a request of its own
        else:
            rows[step.step] = row

    return record
