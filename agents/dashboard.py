"""Observability dashboard: the aggregates it shows, read from recorded usage (RN-2, TD-15).

Everything here is a read. Cache ratio = cache-read tokens / all prompt tokens processed
(uncached input + cache writes + cache reads), as TD-15 defines it, over the requests whose
server reported its cache (`agents.usage`); a window with no such prompt tokens has no ratio
(None), never a flattering 0 or 1.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Count, F, Max, Q, Sum, Value
from django.db.models.functions import Coalesce, TruncDate
from django.utils import timezone

from agents.models import ModelRequest, Run
from agents.usage import RATIO_PARTS, ratio_of, ratio_sums
from conversations.models import Compaction
from toolcatalog.models import RetrievalMiss, ToolActivation
from toolcatalog.selectors import run_surface, surface_context

# Token categories, in the order the dashboard stacks them.
CATEGORIES = (
    ("uncached", "input_tokens", "Uncached input"),
    ("cache_write", "cache_creation_input_tokens", "Cache writes"),
    ("cache_read", "cache_read_input_tokens", "Cache reads"),
    ("output", "output_tokens", "Output"),
)


def _sums(prefix: str = "") -> dict[str, Any]:
    """Sum of each token category over the grouped requests (0 when there are none), and the cache
    ratio's inputs."""
    return {
        **{key: Coalesce(Sum(f"{prefix}{field}"), Value(0)) for key, field, _ in CATEGORIES},
        **ratio_sums(prefix),
    }


def _with_ratio(row: dict[str, Any]) -> dict[str, Any]:
    row["prompt"] = row["uncached"] + row["cache_write"] + row["cache_read"]
    row["cache_ratio"] = ratio_of(row)
    # The ratio's base: the prompt tokens of the requests whose server reported its cache.
    row["ratio_prompt"] = sum(row.pop(key) for key, _ in RATIO_PARTS)
    return row


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def usage_totals(*, user: User, since: Any) -> dict[str, Any]:
    requests = ModelRequest.objects.filter(owner=user, created_at__gte=since)
    totals = requests.aggregate(**_sums(), requests=Count("id"), runs=Count("run", distinct=True))
    return _with_ratio(totals)


def usage_by_day_and_model(*, user: User, since: Any) -> list[dict[str, Any]]:
    rows = (
        ModelRequest.objects.filter(owner=user, created_at__gte=since)
        .annotate(day=TruncDate("created_at"))
        .values("day", "model")
        .annotate(**_sums())
        .order_by("day", "model")
    )
    return [_with_ratio({**row, "day": row["day"].isoformat()}) for row in rows]


def usage_by_conversation(*, user: User, since: Any, limit: int = 10) -> list[dict[str, Any]]:
    """The conversations that processed the most prompt tokens, with their cache ratio."""
    rows = (
        ModelRequest.objects.filter(owner=user, created_at__gte=since)
        .values("run__conversation_id", "run__conversation__title")
        .annotate(**_sums(), runs=Count("run", distinct=True), last=Max("created_at"))
        .annotate(prompt_total=F("uncached") + F("cache_write") + F("cache_read"))
        .order_by("-prompt_total", "-last")[:limit]
    )
    return [
        _with_ratio(
            {
                "conversation_id": row["run__conversation_id"],
                # Deleted since: its usage stays in the owner's figures, under no conversation.
                "title": row["run__conversation__title"] or "(deleted conversations)",
                "runs": row["runs"],
                # The stubs type the row without the `**_sums()` annotated above.
                **{key: row[key] for key, _, _ in CATEGORIES},  # type: ignore[literal-required]
                **{key: row[key] for key, _ in RATIO_PARTS},  # type: ignore[literal-required]
            }
        )
        for row in rows
    ]


def recent_runs(*, user: User, limit: int = 20) -> list[dict[str, Any]]:
    """The latest runs with their summed usage: one grouped query, newest first."""
    rows = (
        Run.objects.filter(conversation__owner=user)
        .values("id", "status", "model", "conversation_id", "conversation__title", "created_at", "finished_at")
        .annotate(**_sums("model_requests__"), requests=Count("model_requests"))
        .order_by("-id")[:limit]
    )
    return [
        _with_ratio(
            {
                **{k: v for k, v in row.items() if k not in ("conversation__title", "created_at", "finished_at")},
                "title": row["conversation__title"],
                "created_at": _iso(row["created_at"]),
                "finished_at": _iso(row["finished_at"]),
            }
        )
        for row in rows
    ]


def runs_in_flight(*, user: User) -> list[dict[str, Any]]:
    rows = (
        # In flight = still holding its conversation (queued, running or waiting for a person).
        Run.objects.active()
        .filter(conversation__owner=user)
        .values("id", "status", "model", "conversation_id", "conversation__title", "created_at", "started_at")
        .order_by("id")
    )
    return [
        {
            "id": row["id"],
            "status": row["status"],
            "model": row["model"],
            "conversation_id": row["conversation_id"],
            "title": row["conversation__title"],
            "created_at": _iso(row["created_at"]),
            "started_at": _iso(row["started_at"]),
        }
        for row in rows
    ]


def ratio_series_by_model(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Cache ratio over time: one point per finished run, one series per model, oldest first."""
    finished = [run for run in reversed(runs) if run["requests"]]
    models = sorted({run["model"] for run in finished})
    return {
        "labels": [f"#{run['id']}" for run in finished],
        "series": [
            {
                "model": model,
                "points": [
                    round(run["cache_ratio"], 4) if run["model"] == model and run["cache_ratio"] is not None else None
                    for run in finished
                ],
            }
            for model in models
        ],
    }


# A cache read is billed at a tenth of an uncached input token (Anthropic's published rate).
CACHE_READ_PRICE = 0.1


def cache_savings(totals: dict[str, Any]) -> dict[str, Any]:
    """Input-token equivalents the cache saved: each cache read billed at 0.1x instead of 1x;
    unknown (None) when no server reported its cache."""
    if totals["prompt"] and not totals["ratio_prompt"]:
        return {"cache_read": None, "saved_tokens": None}
    read = totals["cache_read"]
    return {"cache_read": read, "saved_tokens": round(read * (1 - CACHE_READ_PRICE))}


def deferral_savings(*, user: User, since: Any) -> dict[str, Any]:
    """Schema tokens deferral kept out of requests: per run, what the current surface withholds
    minus the schemas the run loaded, times the run's requests.

    Measured against today's catalog and mode (the surface is not recorded per run); a tool a
    run loaded is counted as sent on all its requests, so the figure errs low.
    """
    tools = surface_context(run_surface()[0])
    cost = {item["name"]: item["schema_tokens"] for item in tools["deferred"]}
    requests = dict(
        ModelRequest.objects.filter(owner=user, created_at__gte=since)
        .values_list("run_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    loaded: dict[int, int] = {}
    for run_id, name in ToolActivation.objects.filter(run_id__in=list(requests)).values_list("run_id", "tool_name"):
        loaded[run_id] = loaded.get(run_id, 0) + cost.get(name, 0)
    saved = sum(n * max(0, tools["withheld_tokens"] - loaded.get(run_id, 0)) for run_id, n in requests.items())
    return {
        "withheld_per_request": tools["withheld_tokens"],
        "deferred_tools": len(tools["deferred"]),
        "requests": sum(requests.values()),
        "saved_tokens": saved,
    }


def top_activations(*, user: User, since: Any, limit: int = 10) -> list[dict[str, Any]]:
    """The deferred tools runs loaded most: candidates for the resident set (TD-15)."""
    rows = (
        ToolActivation.objects.filter(run__conversation__owner=user, created_at__gte=since)
        .values("tool_name")
        .annotate(
            activations=Count("id"),
            runs=Count("run", distinct=True),
            direct=Count("id", filter=Q(trigger=ToolActivation.Trigger.DIRECT)),
            search=Count("id", filter=Q(trigger=ToolActivation.Trigger.SEARCH)),
        )
        .order_by("-activations", "tool_name")[:limit]
    )
    # The rows are dicts; mypy never lets the stubs' TypedDict for them stand for dict[str, Any].
    return list(rows)  # type: ignore[arg-type]


def retrieval_misses(*, user: User, since: Any, limit: int = 20) -> list[dict[str, Any]]:
    """Searches that found nothing, newest first, with the run to look at."""
    rows = (
        RetrievalMiss.objects.filter(run__conversation__owner=user, created_at__gte=since)
        .values("id", "query", "run_id", "created_at")
        .order_by("-id")[:limit]
    )
    return [{**row, "created_at": _iso(row["created_at"])} for row in rows]


def compactions_by_rung(*, user: User, since: Any) -> list[dict[str, Any]]:
    rows = (
        Compaction.objects.filter(conversation__owner=user, created_at__gte=since)
        .values("rung")
        .annotate(passes=Count("id"), before=Sum("tokens_before"), after=Sum("tokens_after"))
        .order_by("rung")
    )
    return [{**row, "freed": row["before"] - row["after"]} for row in rows]


def dashboard_snapshot(*, user: User, days: int = 14, runs: int = 50) -> dict[str, Any]:
    """Everything the dashboard draws, JSON-ready; the page and the live updates share it."""
    now = timezone.now()
    since = now - timedelta(days=days)
    latest = recent_runs(user=user, limit=runs)
    totals = usage_totals(user=user, since=since)
    return {
        "generated_at": now.isoformat(),
        "window_days": days,
        "categories": [{"key": key, "label": label, "total": totals[key]} for key, _, label in CATEGORIES],
        "totals": totals,
        "by_day": usage_by_day_and_model(user=user, since=since),
        "by_conversation": usage_by_conversation(user=user, since=since),
        "ratio_over_time": ratio_series_by_model(latest),
        "recent_runs": latest[:20],
        "in_flight": runs_in_flight(user=user),
        "savings": {"cache": cache_savings(totals), "deferral": deferral_savings(user=user, since=since)},
        "top_activations": top_activations(user=user, since=since),
        "retrieval_misses": retrieval_misses(user=user, since=since),
        "compactions": compactions_by_rung(user=user, since=since),
        "status_counts": dict(
            Run.objects.filter(conversation__owner=user, created_at__gte=since)
            .values_list("status")
            .annotate(n=Count("id"))
            .order_by()
        ),
    }
