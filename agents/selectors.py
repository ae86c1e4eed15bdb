from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, QuerySet, Sum
from django.db.models.functions import TruncDate

from agents.models import Approval, ModelRequest, Run, RunEvent
from conversations.models import Conversation


def run_visible_to(*, run_id: int, user: AbstractBaseUser) -> bool:
    return Run.objects.filter(pk=run_id, conversation__owner=user).exists()


def conversation_visible_to(*, conversation_id: int, user: AbstractBaseUser) -> bool:
    return Conversation.objects.filter(pk=conversation_id, owner=user).exists()


def runs_for_user(*, user: AbstractBaseUser) -> QuerySet[Run]:
    return Run.objects.filter(conversation__owner=user)


def run_events_after(*, run: Run, after: int) -> QuerySet[RunEvent]:
    return RunEvent.objects.filter(run=run, seq__gt=after).order_by("seq")


def approvals_of(*, run: Run) -> QuerySet[Approval]:
    return Approval.objects.filter(run=run).select_related("decided_by").order_by("id")


CACHE_GROUPS = {
    "run": "run_id",
    "conversation": "run__conversation_id",
    "model": "model",
    "day": "day",
}


def cache_ratio(*, input_tokens: int, cache_creation_input_tokens: int, cache_read_input_tokens: int) -> float:
    """Cache reads over every prompt token processed (TD-15, RN-2); 0.0 when nothing was processed."""
    total = input_tokens + cache_creation_input_tokens + cache_read_input_tokens
    return round(cache_read_input_tokens / total, 4) if total else 0.0


def cache_metrics(*, user: AbstractBaseUser, group: str, run_id: int | None = None) -> list[dict]:
    """Usage summed per run, conversation, model or day (UTC) over the user's requests, with the cache ratio."""
    field = CACHE_GROUPS[group]
    requests = ModelRequest.objects.filter(run__conversation__owner=user)
    if run_id is not None:
        requests = requests.filter(run_id=run_id)
    if group == "day":
        requests = requests.annotate(day=TruncDate("created_at"))
    rows = (
        requests.values(field)
        .annotate(
            requests=Count("id"),
            input_tokens=Sum("input_tokens"),
            cache_creation_input_tokens=Sum("cache_creation_input_tokens"),
            cache_read_input_tokens=Sum("cache_read_input_tokens"),
            output_tokens=Sum("output_tokens"),
        )
        .order_by(field)
    )
    result = []
    for row in rows:
        tokens = {
            name: row[name] or 0
            for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")
        }
        prompt = tokens["input_tokens"] + tokens["cache_creation_input_tokens"] + tokens["cache_read_input_tokens"]
        result.append(
            {
                "key": str(row[field]),
                "requests": row["requests"],
                **tokens,
                "prompt_tokens": prompt,
                "cache_ratio": cache_ratio(
                    input_tokens=tokens["input_tokens"],
                    cache_creation_input_tokens=tokens["cache_creation_input_tokens"],
                    cache_read_input_tokens=tokens["cache_read_input_tokens"],
                ),
            }
        )
    return result
