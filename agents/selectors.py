from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import TruncDate

from agents.models import Approval, ModelRequest, Run, RunEvent, Subagent
from agents.usage import ratio_of, ratio_sums, requests_ratio
from controlcenter.errors import NotFound
from conversations.models import Conversation
from engine.loop import TOOL_ACTIVATION_MISS
from toolcatalog.models import RetrievalMiss, ToolActivation


def run_visible_to(*, run_id: int, user: User) -> bool:
    return Run.objects.filter(pk=run_id, conversation__owner=user).exists()


def conversation_visible_to(*, conversation_id: int, user: User) -> bool:
    return Conversation.objects.filter(pk=conversation_id, owner=user).exists()


def runs_for_user(*, user: User) -> QuerySet[Run]:
    return Run.objects.filter(conversation__owner=user)


def run_events_after(*, run: Run, after: int) -> QuerySet[RunEvent]:
    return RunEvent.objects.filter(run=run, seq__gt=after).order_by("seq")


# --- the run page ---------------------------------------------------------------------

_TIMELINE_TEXT_PREVIEW = 400
_PAYLOAD_PREVIEW = 400


def run_for_user(*, user: User, run_id: int) -> Run:
    """The run if `user` owns its conversation; another user's answers exactly like a missing one."""
    try:
        return Run.objects.select_related("conversation", "mode").get(pk=run_id, conversation__owner=user)
    except Run.DoesNotExist:
        raise NotFound(f"Run {run_id} does not exist.") from None


def cache_verdict(request: ModelRequest) -> str:
    """'hit' when the provider read from its cache (unless the runtime knows loading tools broke the
    prefix: `cache_miss`, TD-11); 'miss' when a breakpoint was set but the prefix was not read;
    'uncached' when the request marked no breakpoint and read nothing; 'unreported' when the server
    said nothing of its cache (`agents.usage`)."""
    if not request.cache_reported:
        return "unreported"
    if request.cache_read_input_tokens > 0 and not request.cache_miss:
        return "hit"
    if request.breakpoints or request.cache_creation_input_tokens > 0:
        return "miss"
    return "uncached"


def run_model_requests(*, run: Run) -> list[dict[str, Any]]:
    """The run's requests, each with the subagent that made it (None for the run's own, TD-14): a child's
    step 1 beside the run's step 1 is another agent's request, not a duplicate."""
    children = Subagent.objects.filter(parent=run).only("fanout_id", "index", "profile")
    by_label = {child.label: child for child in children}
    rows = []
    for request in ModelRequest.objects.filter(run=run).order_by("step", "id"):
        prompt = request.prompt_tokens
        rows.append(
            {
                "request": request,
                "prompt": prompt,
                "verdict": cache_verdict(request),
                "cache_ratio": requests_ratio([request]),
                "subagent": by_label.get(request.subagent) if request.subagent else None,
            }
        )
    return rows


def _event_summary(event_type: str, payload: dict[str, Any]) -> str:
    if event_type == "run_started":
        return f"{payload.get('provider')}/{payload.get('model')} on {payload.get('worker', '?')}"
    if event_type == "tool_call":
        return f"{payload.get('name')}({json.dumps(payload.get('input'), sort_keys=True)[:_PAYLOAD_PREVIEW]})"
    if event_type == "tool_result":
        output = payload.get("output") or {}
        outcome = "failed" if isinstance(output, dict) and output.get("ok") is False else "ok"
        return f"{payload.get('name')} {outcome}"
    if event_type == "usage" and payload.get("cache_reported") is False:
        return (
            f"step {payload.get('step')}: {payload.get('input_tokens', 0)} input, "
            f"{payload.get('output_tokens', 0)} output (the server reports no cache figures)"
        )
    if event_type == "usage":
        return (
            f"step {payload.get('step')}: {payload.get('input_tokens', 0)} uncached, "
            f"{payload.get('cache_creation_input_tokens', 0)} cache write, "
            f"{payload.get('cache_read_input_tokens', 0)} cache read, {payload.get('output_tokens', 0)} output"
        )
    if event_type == "cache_miss":
        tools = ", ".join(payload.get("tools") or [])
        return f"step {payload.get('step')}: {payload.get('cause')} on {payload.get('provider')}: loading {tools}"
    if event_type == "tools_unloaded":
        return (
            f"step {payload.get('step')}: unloaded {', '.join(payload.get('tools') or [])} (the window's tool budget)"
        )
    if event_type == "model_stopped":
        return f"step {payload.get('step')}: {payload.get('stop_reason')}: {payload.get('detail', '')}"
    if event_type == "approval_requested":
        return f"{payload.get('name')} waits for approval ({payload.get('approval_id')})"
    if event_type == "approval_decided":
        return f"approval {payload.get('approval_id')}: {payload.get('decision')}"
    if event_type.startswith("subagent_"):
        child = payload.get("subagent") or {}
        who = f"subagent {child.get('index')} ({child.get('profile')})"
        if event_type == "subagent_status":
            return " ".join(part for part in (who, payload.get("status", ""), payload.get("error", "")) if part)
        return f"{who}: {_event_summary(event_type.removeprefix('subagent_'), payload)}"
    if event_type == "run_finished":
        return " ".join(part for part in (payload.get("status", ""), payload.get("error", "")) if part)
    return json.dumps(payload, sort_keys=True, ensure_ascii=False)[:_PAYLOAD_PREVIEW]


def run_timeline(*, run: Run) -> list[dict[str, Any]]:
    """The run's events oldest first, consecutive text deltas of a step folded into one row."""
    timeline: list[dict[str, Any]] = []
    start = None
    for event in RunEvent.objects.filter(run=run).order_by("seq").only("seq", "type", "payload", "created_at"):
        start = start or event.created_at
        offset_ms = int((event.created_at - start).total_seconds() * 1000)
        previous = timeline[-1] if timeline else None
        if (
            event.type == "text_delta"
            and previous is not None
            and previous["type"] == "text_delta"
            and previous["step"] == event.payload.get("step")
        ):
            previous["count"] += 1
            previous["last_seq"] = event.seq
            if len(previous["summary"]) < _TIMELINE_TEXT_PREVIEW:
                previous["summary"] = (previous["summary"] + event.payload.get("text", ""))[:_TIMELINE_TEXT_PREVIEW]
            continue
        timeline.append(
            {
                "seq": event.seq,
                "last_seq": event.seq,
                "type": event.type,
                "step": event.payload.get("step"),
                "offset_ms": offset_ms,
                "count": 1,
                "summary": event.payload.get("text", "")[:_TIMELINE_TEXT_PREVIEW]
                if event.type == "text_delta"
                else _event_summary(event.type, event.payload),
            }
        )
    return timeline


def approvals_of(*, run: Run) -> QuerySet[Approval]:
    """The run's approvals, its subagents' included (they belong to the run: TD-14)."""
    return Approval.objects.filter(run=run).select_related("decided_by", "subagent").order_by("id")


def approvals_of_conversation(*, conversation: Conversation, status: str | None = None) -> QuerySet[Approval]:
    """Every approval asked for in a conversation: its runs' calls and their subagents' (TD-14)."""
    approvals = Approval.objects.filter(run__conversation=conversation)
    if status is not None:
        approvals = approvals.filter(status=status)
    return approvals.select_related("decided_by", "subagent").order_by("id")


CACHE_GROUPS = {
    "run": "run_id",
    "conversation": "run__conversation_id",
    "model": "model",
    "day": "day",
}


def cache_metrics(*, user: User, group: str, run_id: int | None = None) -> list[dict]:
    """Usage summed per run, conversation, model or day (UTC) over the user's requests, with the cache ratio."""
    field = CACHE_GROUPS[group]
    requests = ModelRequest.objects.filter(owner=user)
    if run_id is not None:
        requests = requests.filter(run_id=run_id)
    if group == "day":
        requests = requests.annotate(day=TruncDate("created_at"))
    rows = (
        requests.values(field)
        .annotate(
            # First: the sums below take these fields' names.
            **ratio_sums(),
            requests=Count("id"),
            input_tokens=Sum("input_tokens"),
            cache_creation_input_tokens=Sum("cache_creation_input_tokens"),
            cache_read_input_tokens=Sum("cache_read_input_tokens"),
            output_tokens=Sum("output_tokens"),
            activation_misses=Count("id", filter=Q(cache_miss=TOOL_ACTIVATION_MISS)),
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
                # None: requests whose conversation (or run) was deleted; their usage stays the owner's.
                "key": "deleted" if row[field] is None else str(row[field]),
                "requests": row["requests"],
                **tokens,
                "prompt_tokens": prompt,
                # Requests that could not read the previous prefix because tools were loaded
                # on a provider without deferred loading (TD-11): a cost counted, not hidden.
                "activation_misses": row["activation_misses"],
                "cache_ratio": _rounded(ratio_of(row)),
            }
        )
    return result


def run_context_activity(*, run: Run) -> dict[str, Any]:
    """What the run did to its context: deferred tools it loaded (trigger, query), searches that
    found nothing, and the compaction passes its turn made (proactive or reactive; TD-15, CH-1).
    """
    return {
        "activations": list(ToolActivation.objects.filter(run=run).order_by("id")),
        "misses": list(RetrievalMiss.objects.filter(run=run).order_by("id")),
        "compactions": list(run.compactions.order_by("id")),
        "pruned": list(RunEvent.objects.filter(run=run, type="context_pruned").order_by("seq")),
    }


def _rounded(ratio: float | None) -> float | None:
    return None if ratio is None else round(ratio, 4)
