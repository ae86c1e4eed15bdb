"""Runs as a person starts them: start, retry, cancel. Executing them is agents/lifecycle.py."""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.db import transaction

from agents import lifecycle
from agents.events import publish_conversation_changed
from agents.models import Run
from agents.subagents import subagents_cancel
from controlcenter.errors import Conflict
from conversations.models import Conversation, Message
from conversations.services import check_rungs, conversation_locked


def run_start(*, conversation: Conversation, trigger: Message, compact_rungs: list[str] | None = None) -> Run:
    """Create a queued run for `trigger` with the conversation's model and mode, and hand it to
    a worker once the row is committed; with `compact_rungs`, a compaction run over the path to it."""
    model = conversation.model or settings.CC_MODEL
    if model not in settings.CC_MODELS:
        raise Conflict(
            f"The conversation's model {model!r} is no longer offered; pick one of {', '.join(settings.CC_MODELS)}."
        )
    lifecycle.queue_reachable()
    run = Run.objects.create(
        conversation=conversation,
        trigger=trigger,
        provider=settings.CC_MODELS[model],
        model=model,
        mode_id=conversation.mode_id,
        compact_rungs=compact_rungs,
    )
    # Announced before the run is handed out, so every tab draws the prompt before its reply (UX-4).
    transaction.on_commit(lambda: publish_conversation_changed(conversation_id=conversation.pk, reason="run_queued"))
    transaction.on_commit(lambda: lifecycle.enqueue_run(run.pk))
    return run


def run_retry(*, run: Run) -> Run:
    """Run the turn again: a new run answering the same user message, or going on from the end of
    what a cancelled run kept (OP-3). The tip moves there first, as Regenerate moves it: a run
    retried after the conversation moved on answered off the path, its reply on a branch nobody
    was shown (QA)."""
    if not run.retryable:
        raise Conflict(f"Run {run.pk} is {run.status}; only a failed or cancelled run can be retried.")
    with transaction.atomic():
        locked = conversation_locked(run.conversation)
        trigger = lifecycle.retry_trigger(run)
        if run.compact_rungs is None and locked.tip_id != trigger.pk:
            locked.tip = trigger
            locked.save(update_fields=["tip", "updated_at"])
        return run_start(conversation=locked, trigger=trigger, compact_rungs=run.compact_rungs)


def compaction_start(*, conversation: Conversation, rungs: Sequence[str]) -> Run:
    """Queue a compaction run that may call the model (CH-14: the summary rung, API and `/compact summary`).

    The web process never calls a model (RN-1), so a worker climbs the rungs, with the
    conversation's own model for the summary; the run records its cost. A run in flight
    holds the conversation (409); bad rungs or an empty conversation change nothing (400).
    """
    check_rungs(rungs)
    with transaction.atomic():
        locked = conversation_locked(conversation)
        if locked.tip is None:
            raise Conflict("The conversation has no messages yet; there is nothing to compact.")
        return run_start(conversation=locked, trigger=locked.tip, compact_rungs=list(rungs))


def run_cancel(*, run: Run) -> Run:
    """Cancel a run that has not finished; a finished one is a Conflict.

    Decided by the run's state when the cancel lands, not when the request loaded it: of several
    cancels sent at once, one is the cancel and the others find the run finished (409), as a later
    one would (they answered 200, 409 and 200 in turn, by how their loads and updates interleaved).
    """
    # A queued or waiting run is cancelled at once; a running one stops at its next check. A run
    # can move between running and waiting while this runs (an approval pause, a decision): each
    # pass looks again, and only such a move, made by the run or a person, brings another pass.
    while True:
        if lifecycle.run_cancel_now(run):
            break
        if Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING).update(cancel_requested=True):
            break
        run.refresh_from_db()
        if run.is_finished:
            raise Conflict(f"Run {run.pk} has already finished ({run.status}).")
    # Its subagents stop with it (TD-14), whether they run, wait for approval or are still queued.
    subagents_cancel(parent_id=run.pk)
    run.refresh_from_db()
    return run
