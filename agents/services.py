"""Runs: start, claim, execute one turn, cancel (the only code that writes runs)."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents.events import RunEventPublisher
from agents.models import ModelRequest, Run
from agents.providers.base import ProviderError
from agents.providers.registry import get_provider
from agents.runtime.loop import TurnCancelled, TurnOutcome, run_turn
from agents.runtime.pruning import prune_stale_tool_output
from agents.runtime.request import text_block
from controlcenter.db import reconnecting
from controlcenter.errors import Conflict
from conversations.models import Conversation, Message
from conversations.selectors import path_to
from scratchpad import services as scratchpad_services
from scratchpad.store import turn_toolbox
from toolcatalog.runtime import CatalogToolBox
from toolcatalog.services import activations_record
from toolcatalog.toolbox import run_toolbox
from toolcatalog.workspace import workspace_root

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are an agent running in Control Center. Work in the conversation's workspace with the tools "
    "you are given; say plainly what you did and what you found."
)
_CANCEL_POLL_SECONDS = 0.5
ACTIVE_STATUSES = (Run.Status.QUEUED, Run.Status.RUNNING)


def run_start(*, conversation: Conversation, trigger: Message) -> Run:
    """Create a queued run for `trigger` and hand it to a worker once the row is committed."""
    from agents.dispatch import enqueue_run

    run = Run.objects.create(
        conversation=conversation, trigger=trigger, provider=settings.CC_PROVIDER, model=settings.CC_MODEL
    )
    transaction.on_commit(lambda: enqueue_run(run.pk))
    return run


def run_retry(*, run: Run) -> Run:
    """Run the same turn again: a new run answering the same user message."""
    if not run.retryable:
        raise Conflict(f"Run {run.pk} is {run.status}; only a failed or cancelled run can be retried.")
    with transaction.atomic():
        conversation = Conversation.objects.select_for_update().get(pk=run.conversation_id)
        if Run.objects.filter(conversation=conversation, status__in=ACTIVE_STATUSES).exists():
            raise Conflict("A run is still in progress in this conversation; wait for it or cancel it.")
        return run_start(conversation=conversation, trigger=run.trigger)


def run_claim(*, run_id: int, worker: str) -> bool:
    """Conditional UPDATE: exactly one worker moves a run from queued to running (STYLE #5)."""
    claimed = Run.objects.filter(pk=run_id, status=Run.Status.QUEUED).update(
        status=Run.Status.RUNNING, started_at=timezone.now(), worker=worker
    )
    return claimed == 1


def run_cancel(*, run: Run) -> Run:
    if run.is_finished:
        raise Conflict(f"Run {run.pk} has already finished ({run.status}).")
    # A queued run is cancelled at once; a running one stops at its next check.
    if Run.objects.filter(pk=run.pk, status=Run.Status.QUEUED).update(
        status=Run.Status.CANCELLED, cancel_requested=True, finished_at=timezone.now()
    ):
        RunEventPublisher(run).publish("run_finished", {"status": Run.Status.CANCELLED, "error": ""})
    else:
        Run.objects.filter(pk=run.pk).update(cancel_requested=True)
    run.refresh_from_db()
    return run


WORKER_LOST = (
    "The worker running this turn stopped before the turn ended ({worker}); nothing of the turn was stored, "
    "so the conversation is exactly as it was before. Retry the run."
)


def runs_reap_orphans(*, live: Collection[str], grace_seconds: float | None = None) -> list[int]:
    """Fail, as retryable, the runs whose worker is gone; the turn was never half-written (CH-5)."""
    from agents.heartbeat import ttl_seconds

    grace = ttl_seconds() if grace_seconds is None else grace_seconds
    settled = timezone.now() - timedelta(seconds=grace)
    candidates = Run.objects.filter(status=Run.Status.RUNNING, started_at__lt=settled).exclude(worker__in=live)
    reaped = []
    for run in candidates.select_related("conversation"):
        error = WORKER_LOST.format(worker=run.worker or "unknown worker")
        # Conditional: another worker's reaper, or the run itself finishing, may win the race.
        if Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING).update(
            status=Run.Status.FAILED, error=error, finished_at=timezone.now()
        ):
            RunEventPublisher(run).publish("run_finished", {"status": Run.Status.FAILED, "error": error})
            reaped.append(run.pk)
    if reaped:
        logger.warning("failed %d run(s) whose worker stopped mid-turn: %s", len(reaped), reaped)
    return reaped


def run_execute(*, run_id: int, worker: str) -> None:
    """Run one agent turn for a queued run; persist it at the turn boundary (CH-5)."""
    if not run_claim(run_id=run_id, worker=worker):
        logger.info("run %s is not queued any more; %s leaves it alone", run_id, worker)
        return
    run = Run.objects.select_related("conversation", "trigger").get(pk=run_id)
    publisher = RunEventPublisher(run)
    first_event_seen = False

    def emit(event_type: str, payload: dict[str, Any]) -> None:
        nonlocal first_event_seen
        publisher.publish(event_type, payload)
        if not first_event_seen:
            first_event_seen = True
            reconnecting(lambda: Run.objects.filter(pk=run.pk).update(first_event_at=timezone.now()))

    emit("run_started", {"provider": run.provider, "model": run.model, "worker": worker})
    stored = [{"role": message.role, "content": message.content} for message in path_to(run.trigger)]
    # TD-12: stale tool output goes in rare deep rewrites; between them requests only append.
    pruning = prune_stale_tool_output(
        stored, keep_turns=settings.CC_PRUNE_KEEP_TURNS, min_tokens=settings.CC_PRUNE_MIN_TOKENS
    )
    if pruning.rewrote_now:
        emit("context_pruned", {"results_pruned": pruning.results_pruned, "tokens_freed": pruning.tokens_freed})
    history = pruning.messages
    try:
        # Scratchpad (SP-10): collect expired entries at the start of every turn.
        scratchpad_services.gc()
        # Tool catalog (TD-2..TD-8): resident schemas, the deferred-name index as a system block.
        catalog = run_toolbox(workspace=workspace_root(run.conversation_id), conversation_id=run.conversation_id)
        # Scratchpad (SP-1, SP-7, SP-9): large results offloaded, references resolved, reads offered.
        toolbox = turn_toolbox(inner=catalog, run_id=run.pk, conversation_id=run.conversation_id)
        outcome = run_turn(
            provider=get_provider(run.provider),
            model=run.model,
            system=[text_block(SYSTEM_PROMPT), *catalog.surface.system_blocks()],
            history=history,
            toolbox=toolbox,
            emit=emit,
            is_cancelled=_cancel_checker(run.pk),
        )
    except TurnCancelled:
        if _finish(run, Run.Status.CANCELLED, ""):
            publisher.publish("run_finished", {"status": Run.Status.CANCELLED, "error": ""})
        return
    except ProviderError as exc:
        error = f"{type(exc).__name__}: {exc}"
        if _finish(run, Run.Status.FAILED, error):
            publisher.publish("run_finished", {"status": Run.Status.FAILED, "error": error})
        return
    except Exception as exc:
        logger.exception("run %s failed", run.pk)
        error = f"internal error: {type(exc).__name__}: {exc}"
        if _finish(run, Run.Status.FAILED, error):
            publisher.publish("run_finished", {"status": Run.Status.FAILED, "error": error})
        return
    reply = reconnecting(lambda: _persist_turn(run, outcome, catalog))
    if reply is None:
        # Failed meanwhile (its worker was taken for dead) or cancelled: the turn is dropped,
        # so a retry that may already be running is the only answer stored (no duplicates).
        logger.warning("run %s ended while its turn ran; the turn was not stored", run.pk)
        return
    publisher.publish(
        "run_finished",
        {"status": Run.Status.SUCCEEDED, "error": "", "message_id": reply.pk, "stop_reason": outcome.stop_reason},
    )


@transaction.atomic
def _persist_turn(run: Run, outcome: TurnOutcome, toolbox: CatalogToolBox) -> Message | None:
    # Only a run that is still running may store its turn, decided under the row lock.
    if not list(Run.objects.select_for_update().filter(pk=run.pk, status=Run.Status.RUNNING).values_list("pk")):
        return None
    parent = run.trigger
    for message in outcome.messages:
        parent = Message.objects.create(
            conversation_id=run.conversation_id, parent=parent, role=message["role"], content=message["content"]
        )
    # Move the tip only if nobody branched away while the turn ran; otherwise the
    # reply stays reachable on its own branch (CH-7).
    Conversation.objects.filter(pk=run.conversation_id, tip_id=run.trigger_id).update(
        tip=parent, updated_at=timezone.now()
    )
    ModelRequest.objects.bulk_create(
        ModelRequest(
            run=run,
            step=step.step,
            model=run.model,
            input_tokens=step.usage.input_tokens,
            cache_creation_input_tokens=step.usage.cache_creation_input_tokens,
            cache_read_input_tokens=step.usage.cache_read_input_tokens,
            output_tokens=step.usage.output_tokens,
            breakpoints=step.breakpoints,
            stop_reason=step.stop_reason,
            duration_ms=step.duration_ms,
        )
        for step in outcome.steps
    )
    activations_record(run_id=run.pk, activations=toolbox.activations, misses=toolbox.misses)
    _finish(run, Run.Status.SUCCEEDED, "")
    return parent


def _finish(run: Run, status: str, error: str) -> bool:
    # Conditional: a run the reaper already failed keeps the reaper's verdict (and its one run_finished).
    return (
        reconnecting(
            lambda: Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING).update(
                status=status, error=error, finished_at=timezone.now()
            )
        )
        == 1
    )


def _cancel_checker(run_id: int):
    last_check = 0.0

    def is_cancelled() -> bool:
        nonlocal last_check
        now = time.monotonic()
        if now - last_check < _CANCEL_POLL_SECONDS:
            return False
        last_check = now
        return reconnecting(lambda: Run.objects.filter(pk=run_id, cancel_requested=True).exists())

    return is_cancelled
