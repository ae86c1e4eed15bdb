"""Runs as a person starts them: start, retry, cancel. Executing them is agents/lifecycle.py."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from agents import lifecycle
from agents.events import publish_conversation_changed
from agents.models import Run
from agents.subagents import subagents_cancel
from controlcenter.errors import Conflict
from conversations.models import Conversation, Message
from conversations.services import conversation_locked


def run_start(*, conversation: Conversation, trigger: Message) -> Run:
    """Create a queued run for `trigger` with the conversation's model and mode, and hand it to
    a worker once the row is committed."""
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
    )
    # Announced before the run is handed out, so every tab draws the prompt before its reply (UX-4).
    transaction.on_commit(lambda: publish_conversation_changed(conversation_id=conversation.pk, reason="run_queued"))
    transaction.on_commit(lambda: lifecycle.enqueue_run(run.pk))
    return run


def run_retry(*, run: Run) -> Run:
    """Run the turn again: a new run answering the same user message, or going on from the end of
    what a cancelled run kept (OP-3)."""
    if not run.retryable:
        raise Conflict(f"Run {run.pk} is {run.status}; only a failed or cancelled run can be retried.")
    with transaction.atomic():
        return run_start(conversation=conversation_locked(run.conversation), trigger=lifecycle.retry_trigger(run))


def run_cancel(*, run: Run) -> Run:
    if run.is_finished:
        raise Conflict(f"Run {run.pk} has already finished ({run.status}).")
    # A queued or waiting run is cancelled at once; a running one stops at its next check.
    if not lifecycle.run_cancel_now(run):
        Run.objects.filter(pk=run.pk).update(cancel_requested=True)
    # Its subagents stop with it (TD-14), whether they run, wait for approval or are still queued.
    subagents_cancel(parent_id=run.pk)
    run.refresh_from_db()
    return run
