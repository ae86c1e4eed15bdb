"""Runs: start, claim, execute one turn, cancel (the only code that writes runs)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents import approvals
from agents.events import RunEventPublisher
from agents.models import ModelRequest, Run
from agents.providers import get_provider
from agents.subagents import SPAWN_AGENTS, SpawningToolBox, subagents_cancel, subagents_reap_orphans
from controlcenter.db import reconnecting
from controlcenter.errors import Conflict, DomainError
from conversations.models import Conversation, Message
from engine.actions import ActionLimits, ApprovalNeeded
from engine.catalog.toolbox import CatalogToolBox
from engine.loop import (
    CANCEL_POLL_SECONDS,
    ReactiveCompaction,
    TurnCancelled,
    TurnOutcome,
    polled_at_most_every,
    run_turn,
)
from engine.providers.protocol import PromptTooLong, ProviderError
from engine.pruning import PruneResult, prune_stale_tool_output
from engine.request import text_block
from engine.tokens import estimate_json_tokens
from scratchpad import services as scratchpad_services
from scratchpad.store import turn_toolbox
from toolcatalog.models import Mode
from toolcatalog.selectors import fit_surface_to_window
from toolcatalog.services import activations_record
from toolcatalog.toolbox import run_toolbox
from toolcatalog.workspace import workspace_root

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are an agent running in Control Center. Work in the conversation's workspace with the tools "
    "you are given; say plainly what you did and what you found."
)
# A run in one of these holds the conversation: no new message or retry until it ends.
ACTIVE_STATUSES = (Run.Status.QUEUED, Run.Status.RUNNING, Run.Status.WAITING)


def run_start(*, conversation: Conversation, trigger: Message) -> Run:
    """Create a queued run for `trigger` with the conversation's model and mode, and hand it to
    a worker once the row is committed."""
    from agents.dispatch import enqueue_run

    model = conversation.model or settings.CC_MODEL
    if model not in settings.CC_MODELS:
        raise DomainError(
            f"The conversation's model {model!r} is no longer offered; pick one of {', '.join(settings.CC_MODELS)}."
        )
    run = Run.objects.create(
        conversation=conversation,
        trigger=trigger,
        provider=settings.CC_MODELS[model],
        model=model,
        mode_id=conversation.mode_id,
    )
    transaction.on_commit(lambda: enqueue_run(run.pk))
    return run


def run_retry(*, run: Run) -> Run:
    """Run the same turn again: a new run answering the same user message."""
    if not run.retryable:
        raise Conflict(f"Run {run.pk} is {run.status}; only a failed or cancelled run can be retried.")
    from conversations.services import conversation_locked

    with transaction.atomic():
        return run_start(conversation=conversation_locked(run.conversation), trigger=run.trigger)


def run_claim(*, run_id: int, worker: str) -> bool:
    """Conditional UPDATE: exactly one worker moves a run from queued to running (STYLE #5)."""
    claimed = Run.objects.filter(pk=run_id, status=Run.Status.QUEUED).update(
        status=Run.Status.RUNNING, started_at=timezone.now(), worker=worker
    )
    return claimed == 1


def run_cancel(*, run: Run) -> Run:
    if run.is_finished:
        raise Conflict(f"Run {run.pk} has already finished ({run.status}).")
    # A queued or waiting run is cancelled at once; a running one stops at its next check.
    if Run.objects.filter(pk=run.pk, status__in=[Run.Status.QUEUED, Run.Status.WAITING]).update(
        status=Run.Status.CANCELLED, cancel_requested=True, finished_at=timezone.now()
    ):
        approvals.approvals_expire(run_id=run.pk)
        RunEventPublisher(run).publish("run_finished", {"status": Run.Status.CANCELLED, "error": ""})
    else:
        Run.objects.filter(pk=run.pk).update(cancel_requested=True)
    # Its subagents stop with it (TD-14), whether they run, wait for approval or are still queued.
    subagents_cancel(parent_id=run.pk)
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
            subagents_cancel(parent_id=run.pk)
            reaped.append(run.pk)
    if reaped:
        logger.warning("failed %d run(s) whose worker stopped mid-turn: %s", len(reaped), reaped)
    subagents_reap_orphans(live=live, settled=settled)
    return reaped


def run_execute(*, run_id: int, worker: str) -> None:
    """Run one agent turn for a queued run; persist it at the turn boundary (CH-5)."""
    if not run_claim(run_id=run_id, worker=worker):
        logger.info("run %s is not queued any more; %s leaves it alone", run_id, worker)
        return
    run = Run.objects.select_related("conversation", "trigger", "mode").get(pk=run_id)
    publisher = RunEventPublisher(run)
    first_event_seen = False

    def emit(event_type: str, payload: dict[str, Any]) -> None:
        nonlocal first_event_seen
        publisher.publish(event_type, payload)
        if not first_event_seen:
            first_event_seen = True
            reconnecting(lambda: Run.objects.filter(pk=run.pk).update(first_event_at=timezone.now()))

    emit(
        "run_started",
        {"provider": run.provider, "model": run.model, "mode": run.mode.name if run.mode else None, "worker": worker},
    )
    history: list[dict[str, Any]] = []
    try:
        # Scratchpad (SP-10): collect expired entries at the start of every turn.
        scratchpad_services.gc()
        catalog, toolbox = turn_toolboxes(run_id=run.pk, conversation_id=run.conversation_id, mode=run.mode)
        system = turn_system(catalog)
        overhead = estimate_json_tokens([system, toolbox.schemas()])
        history = _turn_history(run, overhead_tokens=overhead, emit=emit)
        outcome = run_turn(
            provider=get_provider(run.provider),
            model=run.model,
            system=system,
            history=history,
            toolbox=toolbox,
            emit=emit,
            is_cancelled=_cancel_checker(run.pk),
            # Measured when the provider refuses: tools loaded during the turn count too.
            **_runtime_options(run, emit, lambda: estimate_json_tokens([system, toolbox.schemas()])),
        )
    except ApprovalNeeded as pause:
        try:
            waiting = approvals.approval_pause(run=run, pause=pause, publisher=publisher)
        except Exception as exc:
            logger.exception("run %s could not pause for approval", run.pk)
            error = f"internal error while pausing for approval: {type(exc).__name__}: {exc}"
            if _finish(run, Run.Status.FAILED, error):
                publisher.publish("run_finished", {"status": Run.Status.FAILED, "error": error})
            return
        if waiting is None and _finish(run, Run.Status.CANCELLED, ""):
            publisher.publish("run_finished", {"status": Run.Status.CANCELLED, "error": ""})
        return
    except TurnCancelled:
        if _finish(run, Run.Status.CANCELLED, ""):
            publisher.publish("run_finished", {"status": Run.Status.CANCELLED, "error": ""})
        return
    except PromptTooLong as exc:
        error = _too_long_message(run, history, exc)
        if _finish(run, Run.Status.FAILED, error):
            publisher.publish("run_finished", {"status": Run.Status.FAILED, "error": error})
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
    if reconnecting(lambda: Run.objects.filter(pk=run.pk, cancel_requested=True).exists()):
        # Asked to stop while the last step ran (the loop checks at most every 0.5 s), or it
        # ended a fan-out's wait (TD-14): the cancel wins over the reply, which is not stored.
        if _finish(run, Run.Status.CANCELLED, ""):
            publisher.publish("run_finished", {"status": Run.Status.CANCELLED, "error": ""})
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
    ModelRequest.objects.bulk_create(approvals.model_request_rows(run, outcome.steps))
    activations_record(run_id=run.pk, activations=toolbox.activations, misses=toolbox.misses)
    Run.objects.filter(pk=run.pk).update(pending_turn=None)
    _finish(run, Run.Status.SUCCEEDED, "")
    return parent


# --- runtime options: approvals, limits, parallel tools, prompt too long (RN-4) -------


# --- what a turn sends: one code path for runs and the Context view (TD-15) ----------


def turn_system(catalog: CatalogToolBox) -> list[dict[str, Any]]:
    """The system blocks: the prompt, then the deferred-name index (TD-2)."""
    return [text_block(SYSTEM_PROMPT), *catalog.surface.system_blocks()]


def turn_pruned(messages: list[dict[str, Any]]) -> PruneResult:
    """Stale tool output pruned in rare deep rewrites; between them requests only append (TD-12)."""
    return prune_stale_tool_output(
        messages, keep_turns=settings.CC_PRUNE_KEEP_TURNS, min_tokens=settings.CC_PRUNE_MIN_TOKENS
    )


def turn_toolboxes(
    *, run_id: int, conversation_id: int, mode: Mode | None = None
) -> tuple[CatalogToolBox, approvals.GatedToolBox]:
    """The run's catalog toolbox, and the stack the loop talks to, outermost first:

    approvals (RN-4: which calls wait for a person) -> scratchpad (SP-1, SP-7, SP-9:
    offload, `scratchpad_read`, references) -> subagents (TD-14: `spawn_agents`) ->
    catalog (TD-2..TD-8: resident set, deferred activation, built-in implementations).
    """
    catalog = run_toolbox(
        workspace=workspace_root(conversation_id),
        conversation_id=conversation_id,
        mode=mode,
        # The loop asks a person before a call that requires approval, so the catalog runs what it gets.
        approve=lambda tool, arguments: None,
    )
    # spawn_agents is a tool like any other to the mode: a mode that denies it never offers it (TD-8).
    spawning = SpawningToolBox(catalog, run_id=run_id) if catalog.surface.mode.admits(SPAWN_AGENTS) else catalog
    scratchpad = turn_toolbox(inner=spawning, run_id=run_id, conversation_id=conversation_id)
    stack = approvals.GatedToolBox(scratchpad)
    fit_surface_to_window(catalog, stack.schemas())  # LM-2: a small window gets a smaller resident set
    return catalog, stack


def _turn_history(run: Run, *, overhead_tokens: int, emit: Callable[[str, dict[str, Any]], None]) -> list[dict]:
    """What the turn sends: the latest compaction view plus later messages (CH-2), then pruned (TD-12)."""
    from conversations.services import turn_context  # conversations.services starts runs: import at use

    context = turn_context(trigger=run.trigger, overhead_tokens=overhead_tokens, run=run)
    if context.compaction is not None:
        emit("compaction", _compaction_event(context.compaction))
    pruning = turn_pruned(context.messages)
    if pruning.rewrote_now:
        emit("context_pruned", {"results_pruned": pruning.results_pruned, "tokens_freed": pruning.tokens_freed})
    return pruning.messages


def _compaction_event(compaction: Any) -> dict[str, Any]:
    return {
        "trigger": compaction.trigger,
        "rung": compaction.rung,
        "tokens_before": compaction.tokens_before,
        "tokens_after": compaction.tokens_after,
    }


def _reactive_compaction(
    run: Run, emit: Callable[[str, dict[str, Any]], None], overhead_tokens: Callable[[], int] = lambda: 0
) -> ReactiveCompaction:
    """The loop's prompt-too-long hook: one ladder pass without a model call, recorded like any other (CH-2)."""
    from conversations.services import reactive_compaction

    def compact(history: list[dict[str, Any]], turn: list[dict[str, Any]], error: PromptTooLong) -> list | None:
        maximum = error.maximum or settings.CC_CONTEXT_WINDOW_TOKENS
        # Room for the system prompt and tools, this turn's own messages and the reply, and a
        # margin because the estimate was low once already.
        limit = int(maximum * 0.9) - estimate_json_tokens(turn) - overhead_tokens() - settings.CC_MAX_OUTPUT_TOKENS
        if limit <= 0:
            return None
        compacted = reactive_compaction(trigger=run.trigger, history=history, limit_tokens=limit, run=run)
        if compacted is None:
            return None
        view, compaction = compacted
        emit("compaction", _compaction_event(compaction))
        return view

    return compact


def _runtime_options(
    run: Run, emit: Callable[[str, dict[str, Any]], None], overhead: Callable[[], int] = lambda: 0
) -> dict[str, Any]:
    return {
        "limits": ActionLimits(per_run=settings.CC_RUN_MAX_ACTIONS, per_tool=settings.CC_TOOL_ACTION_LIMITS),
        "max_parallel_tools": settings.CC_MAX_PARALLEL_TOOLS,
        "resume": approvals.paused_turn_of(run),
        "decisions": approvals.decisions_for(run),
        "on_prompt_too_long": _reactive_compaction(run, emit, overhead),
        "max_tokens": settings.CC_MAX_OUTPUT_TOKENS,  # scaled to the window (LM-2)
    }


def _too_long_message(run: Run, history: list[dict[str, Any]], exc: PromptTooLong) -> str:
    measured = exc.tokens if exc.tokens is not None else estimate_json_tokens(history)
    limit = f" against a maximum of {exc.maximum}" if exc.maximum is not None else ""
    return (
        f"The prompt is too long for {run.model}: {measured} tokens{limit} "
        f"({len(history)} messages in the conversation path). Nothing of this turn was kept; "
        "shorten the conversation (branch from an earlier message) or start a new one."
    )


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


def _cancel_checker(run_id: int) -> Callable[[], bool]:
    return polled_at_most_every(
        CANCEL_POLL_SECONDS,
        lambda: reconnecting(lambda: Run.objects.filter(pk=run_id, cancel_requested=True).exists()),
    )
