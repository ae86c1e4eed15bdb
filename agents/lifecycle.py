"""One run lifecycle (AR-1): enqueue → claim → execute → finish → publish, for runs and subagents.

Every state change is a conditional UPDATE (STYLE #5), so whoever wins a race decides:

    queued ──claim──▶ running ──finish──▶ succeeded | failed | cancelled
      ▲                  │
      └──all decided── waiting (for a person, RN-4)

A run announces its end with exactly one `run_finished` event, sent by whoever won the
finish; a subagent has no event log of its own (its parent polls its row). The reaper
fails what a dead worker held; its view of "held by a worker" is the `running` status
(queued and waiting work belongs to no worker; `agents.models.ACTIVE_STATUSES` is what
still holds a conversation).

Where work runs: services mode sends a Celery task by name (agents/tasks.py only calls
back into this module); embedded mode submits the same function to a thread pool here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Collection, Hashable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import User
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from agents import approvals, heartbeat, subagents, turns
from agents.events import RunEventPublisher
from agents.models import Approval, Run, RunEvent, Subagent
from agents.providers import get_provider
from agents.usage import request_recorder
from controlcenter.db import db_turn, reconnecting
from controlcenter.errors import ServiceUnavailable
from conversations.models import Compaction, Conversation, Message
from conversations.services import tip_back_to_latest_answer
from engine.actions import ActionLimits, ApprovalNeeded, denied_observation, tool_result, tool_uses_of
from engine.catalog.toolbox import CatalogToolBox
from engine.context.transcript import RequestCount, overhead_count
from engine.loop import (
    CANCEL_POLL_SECONDS,
    TurnCancelled,
    TurnHandedOff,
    TurnOutcome,
    polled_at_most_every,
    run_turn,
)
from engine.providers.protocol import PromptTooLong, ProviderError
from engine.tokens import estimate_json_tokens, tool_prompt_tokens
from scratchpad import services as scratchpad_services
from toolcatalog import sandbox
from toolcatalog.services import activations_record

logger = logging.getLogger(__name__)

RUN_TASK = "agents.run_turn"
SUBAGENT_TASK = "agents.run_subagent"

# "No message": the model requests the turn made are recorded, since they were paid for.
WORKER_LOST = (
    "The worker running this turn stopped before the turn ended ({worker}); no message of the turn was stored, "
    "so the conversation's messages are exactly as they were before. Retry the run."
)
WORKER_LOST_COMPACTION = (
    "The worker running this compaction stopped before it ended ({worker}); no compaction was recorded, so the "
    "conversation sends what it sent before. Retry the run."
)
WORKER_LOST_CANCELLED = (
    "Cancelled. Its worker ({worker}) had stopped before it could end the run; no message of the turn was stored."
)
# OP-4: a tool that was running is killed with its worker, but what it did until then stays.
WORKER_LOST_MID_TOOL = (
    " It stopped during the tool call {name} ({tool_use_id}); that call's processes were killed with the worker, "
    "but what it changed in the workspace before then is still there."
)
# A step's results are recorded when all its calls have ended: which of them had ended is unknown.
WORKER_LOST_MID_STEP = (
    " It stopped during a step of {count} tool calls run together: {calls}; any of them may have been cut off "
    "(their processes were killed with the worker), and what they changed in the workspace before then is "
    "still there."
)
SUBAGENT_WORKER_LOST = "the worker running this subagent stopped before it finished."
SUBAGENT_CANCELLED = "cancelled before it finished."


# --- enqueue ------------------------------------------------------------------------
#
# The database is the source of truth for work (OP-2). A broker message is only a wake-up
# call: next to each one a mark `cc:queued:<kind>:<id>` says "the broker holds this". A Redis
# flush or restart loses messages and marks together, and an enqueue that failed sets no
# mark, so the workers' sweep queues again exactly the queued rows without a mark. A message
# sent twice is harmless: the claim is a conditional UPDATE, one wins, the other is a no-op.

QUEUE_MARK_TTL_SECONDS = 600
_TASKS = {"run": RUN_TASK, "subagent": SUBAGENT_TASK}


def _mark(kind: str, pk: int) -> str:
    return f"cc:queued:{kind}:{pk}"


def _send(kind: str, pk: int) -> None:
    """Send the task, then mark it held; a broker that is down is logged, and the sweep sends it later."""
    try:
        # The project app is current: controlcenter/__init__.py creates it before any app module loads.
        current_app.send_task(_TASKS[kind], (pk,), queue=settings.CC_RUN_QUEUE)
        heartbeat.redis_client().set(_mark(kind, pk), "sent", ex=QUEUE_MARK_TTL_SECONDS)
    except Exception as exc:  # kombu and redis-py raise their own families; both mean "not queued"
        logger.warning("could not queue %s %s (%s); the sweep queues it once the broker is back", kind, pk, exc)


def enqueue_run(run_id: int) -> None:
    if settings.CC_MODE == "services":
        _send("run", run_id)
    else:
        _embedded_pool().submit(_in_thread, run_execute, run_id)


def enqueue_subagent(subagent_id: int) -> None:
    """One child of a fan-out (TD-14), where runs run: at its start, or again once its approvals are decided."""
    if settings.CC_MODE == "services":
        _send("subagent", subagent_id)
    else:
        _subagent_pool().submit(_in_thread, subagent_execute, subagent_id)


def queue_reachable() -> None:
    """Refuse new work up front while the broker is down (OP-2): 503, and nothing is stored."""
    if settings.CC_MODE != "services":
        return
    try:
        heartbeat.redis_client().ping()
    except Exception as exc:
        logger.warning("the run queue is unreachable: %s", exc)
        raise ServiceUnavailable(
            "The run queue (Redis) is unreachable, so nothing was saved. Send the message again in a moment; "
            "/healthz shows when the queue is back."
        ) from None


def _stale_queued(model: type[Run] | type[Subagent], cutoff: datetime) -> QuerySet:
    return model.objects.filter(status=Run.Status.QUEUED, queued_at__lt=cutoff)


def stale_queued_counts(*, older_than: float | None = None) -> dict[str, int]:
    """How many runs and subagents have been queued longer than the sweep interval (for /healthz)."""
    seconds = settings.CC_QUEUE_SWEEP_SECONDS if older_than is None else older_than
    cutoff = timezone.now() - timedelta(seconds=seconds)
    return {"runs": _stale_queued(Run, cutoff).count(), "subagents": _stale_queued(Subagent, cutoff).count()}


def sweep_lost_work() -> list[str]:
    """Queue again the work queued longer than the sweep interval whose broker message is gone."""
    cutoff = timezone.now() - timedelta(seconds=settings.CC_QUEUE_SWEEP_SECONDS)
    client = heartbeat.redis_client()
    requeued = []
    for kind, model in (("run", Run), ("subagent", Subagent)):
        for pk in _stale_queued(model, cutoff).values_list("pk", flat=True):
            # NX: with several workers sweeping, one of them sends it.
            if client.set(_mark(kind, pk), "sweep", nx=True, ex=QUEUE_MARK_TTL_SECONDS):
                current_app.send_task(_TASKS[kind], (pk,), queue=settings.CC_RUN_QUEUE)
                requeued.append(f"{kind} {pk}")
    if requeued:
        logger.warning("queued again %d item(s) the broker had lost: %s", len(requeued), ", ".join(requeued))
    return requeued


@cache
def _embedded_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="cc-embedded-worker")


@cache
def _subagent_pool() -> ThreadPoolExecutor:
    # Own pool: the parent run holds a thread of the run pool while it waits for its children.
    return ThreadPoolExecutor(max_workers=4, thread_name_prefix="cc-embedded-subagent")


def _in_thread(execute: Callable[..., None], pk: int) -> None:
    close_old_connections()
    try:
        execute(pk, worker=f"embedded@{socket.gethostname()}")
    except Exception:
        logger.exception("embedded worker failed on %s %s", execute.__name__, pk)
    finally:
        close_old_connections()


def embedded_recover() -> None:
    """At start of an embedded server: the previous process's runs died with it."""
    runs_reap_orphans(live=(), grace_seconds=0)
    for run_id in Run.objects.filter(status=Run.Status.QUEUED).values_list("pk", flat=True):
        enqueue_run(run_id)


# --- claim and finish (the conditional UPDATEs) ----------------------------------------


def run_claim(*, run_id: int, worker: str) -> bool:
    """Exactly one worker moves a run from queued to running."""
    now = timezone.now()
    claimed = Run.objects.filter(pk=run_id, status=Run.Status.QUEUED).update(
        status=Run.Status.RUNNING, started_at=now, vouched_at=now, worker=worker
    )
    return claimed == 1


def subagent_claim(*, subagent_id: int, worker: str) -> bool:
    with db_turn():
        now = timezone.now()
        claimed = Subagent.objects.filter(pk=subagent_id, status=Run.Status.QUEUED).update(
            status=Run.Status.RUNNING, worker=worker, started_at=now, vouched_at=now
        )
    return claimed == 1


def _run_finished(run: Run, status: str, error: str) -> bool:
    # Conditional: a run the reaper already failed keeps the reaper's verdict (and its one run_finished).
    return (
        reconnecting(
            lambda: Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING).update(
                status=status, error=error, finished_at=timezone.now()
            )
        )
        == 1
    )


def run_finish(run: Run, status: str, error: str = "", publisher: RunEventPublisher | None = None) -> bool:
    """End a running run; the winner of the conditional UPDATE announces it, so there is one run_finished."""
    if not _run_finished(run, status, error):
        return False
    (publisher or RunEventPublisher(run)).publish("run_finished", {"status": status, "error": error})
    return True


def subagent_finish(
    child: Subagent, status: str, *, publisher: RunEventPublisher, answer: str = "", error: str = ""
) -> bool:
    with db_turn():
        # Conditional: a child cancelled meanwhile keeps that verdict.
        finished = (
            Subagent.objects.filter(pk=child.pk, status=Run.Status.RUNNING).update(
                status=status, answer=answer, error=error, pending_turn=None, finished_at=timezone.now()
            )
            == 1
        )
    if finished:  # announced once its answer is stored
        transaction.on_commit(
            lambda: subagents.subagent_status_event(publisher, child, status, answer=answer, error=error)
        )
    return finished


# The result that closes a call that was waiting for a person when its run was cancelled (OP-3).
CANCELLED_WAITING_CALL = {
    "ok": False,
    "cancelled": True,
    "error": "The run was cancelled while this call waited for approval; it did not run.",
}
# And one a person had approved, its run cancelled before it could run it.
CANCELLED_APPROVED_CALL = {
    "ok": False,
    "cancelled": True,
    "error": "The run was cancelled after this call was approved, before it ran; it did not run.",
}


def run_cancel_now(run: Run) -> bool:
    """A queued or waiting run is cancelled at once (a running one stops at its next check).

    A waiting run's partial turn goes into the transcript with every waiting call closed by a
    cancelled result (OP-3): the model sees on the next turn what it asked for and that it did not run."""
    with transaction.atomic():
        locked = (
            Run.objects.select_for_update(no_key=True)
            .filter(pk=run.pk, status__in=[Run.Status.QUEUED, Run.Status.WAITING])
            .select_related("trigger")
            .first()
        )
        if locked is None:
            return False
        paused = approvals.paused_turn_of(locked)
        Run.objects.filter(pk=run.pk).update(
            status=Run.Status.CANCELLED, cancel_requested=True, finished_at=timezone.now(), pending_turn=None
        )
        # Decided before the cancel took the run's lock (a decision and a cancel sent together: both
        # answered 200), a call says what was decided, not that it still waited (QA).
        decisions = approvals.decisions_for(locked)
        approvals.approvals_expire(run_id=run.pk)
        calls = tool_uses_of(paused.messages[-1]) if paused is not None and paused.messages else []
        closed = [(call, _closing_result(call, decisions.get(call["id"]))) for call in calls]
        kept = None
        if paused is not None and paused.messages:
            results = {"role": "user", "content": [tool_result(call["id"], output) for call, output in closed]}
            kept = _append_turn(locked, [*paused.messages, *([results] if closed else [])])
        else:
            tip_back_to_latest_answer(conversation_id=locked.conversation_id, prompt_id=locked.trigger_id)
    publisher = RunEventPublisher(run)
    step = paused.step if paused is not None else 0
    for call, output in closed:
        publisher.publish("tool_result", {"step": step, "id": call["id"], "name": call["name"], "output": output})
    publisher.publish("run_finished", _cancelled_payload(locked, kept))
    return True


def _closing_result(call: dict[str, Any], decision: str | None) -> dict[str, Any]:
    """The result of a call of a paused run that a cancel ended before it ran."""
    if decision == Approval.Status.DENIED:
        return denied_observation(call["name"])
    if decision == Approval.Status.APPROVED:
        return CANCELLED_APPROVED_CALL
    return CANCELLED_WAITING_CALL


def _cancelled_payload(run: Run, kept: Message | None) -> dict[str, Any]:
    payload: dict[str, Any] = {"status": Run.Status.CANCELLED, "error": ""}
    if kept is not None and kept.pk != run.trigger_id:
        payload["message_id"] = kept.pk  # the last message of the turn kept in the transcript
    return payload


def retry_trigger(run: Run) -> Message:
    """What a retry of `run` answers: its prompt, or the end of the cancelled turn it kept (OP-3),
    so the retry goes on from where it stopped and its reply lands on the conversation's path."""
    if run.status == Run.Status.CANCELLED:
        finished = RunEvent.objects.filter(run=run, type="run_finished").values_list("payload", flat=True).first()
        kept_id = (finished or {}).get("message_id")
        if kept_id is not None:
            kept = Message.objects.filter(pk=kept_id, conversation_id=run.conversation_id).first()
            if kept is not None:
                return kept
    return run.trigger


# --- execute ------------------------------------------------------------------------


def _drive(
    turn: Callable[[], TurnOutcome],
    *,
    pause: Callable[[ApprovalNeeded], list[Approval] | None],
    finish: Callable[[str, str], bool],
    failure: Callable[[Exception], str],
    cancelled_error: str = "",
    cancelled: Callable[[TurnCancelled], None] | None = None,
    handed_off: Callable[[TurnHandedOff], None] | None = None,
) -> TurnOutcome | None:
    """Run the turn; every way it can end without an outcome to store ends here, for runs and subagents alike."""
    try:
        return turn()
    except TurnHandedOff as stopping:
        # Only runs hand off (a subagent's turn is never given `hand_off`).
        assert handed_off is not None
        try:
            handed_off(stopping)
        except Exception as exc:
            logger.exception("could not hand the turn off")
            finish(Run.Status.FAILED, f"internal error while handing the turn off: {type(exc).__name__}: {exc}")
        return None
    except ApprovalNeeded as waiting_for:
        try:
            waiting = pause(waiting_for)
        except Exception as exc:
            logger.exception("could not pause for approval")
            finish(Run.Status.FAILED, f"internal error while pausing for approval: {type(exc).__name__}: {exc}")
            return None
        if waiting is None:  # cancelled meanwhile: nobody is asked
            finish(Run.Status.CANCELLED, cancelled_error)
        return None
    except TurnCancelled as stopped:
        if cancelled is not None:
            cancelled(stopped)
        else:
            finish(Run.Status.CANCELLED, cancelled_error)
        return None
    except Exception as exc:
        finish(Run.Status.FAILED, failure(exc))
        return None


def run_execute(run_id: int, *, worker: str) -> None:
    """Run (or resume) one agent turn for a queued run; persist it at the turn boundary (CH-5)."""
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

    started = {"provider": run.provider, "model": run.model, "mode": run.mode.name if run.mode else None}
    retry_of = _retry_of(run)
    try:
        emit("run_started", {**started, "worker": worker, **({"retry_of": retry_of} if retry_of else {})})
    except Exception as exc:
        # Claimed but not started: ended here, or it would stay "running" under a live worker.
        logger.exception("run %s could not start", run.pk)
        run_finish(run, Run.Status.FAILED, f"internal error while starting the run: {type(exc).__name__}: {exc}")
        return
    if run.compact_rungs is not None:
        _compaction_execute(run, emit, publisher)
        return
    history: list[dict[str, Any]] = []
    catalog: CatalogToolBox | None = None

    def turn() -> TurnOutcome:
        nonlocal history, catalog
        # Scratchpad (SP-10): collect expired entries at the start of every turn.
        scratchpad_services.gc()
        catalog, toolbox = turns.turn_toolboxes(
            run_id=run.pk,
            conversation_id=run.conversation_id,
            owner_id=run.conversation.owner_id,
            mode=run.mode,
            children=subagents.ChildDispatch(
                enqueue=enqueue_subagent,
                run_here=lambda child_id: subagent_execute(child_id, worker=worker),
                all_here=_draining.is_set,
            ),
        )
        system = turns.turn_system(catalog)

        def overhead() -> RequestCount:
            # Measured when the provider refuses: tools loaded during the turn count too.
            return overhead_count(system, toolbox.schemas(), tool_prompt=tool_prompt_tokens(run.provider, run.model))

        history = turns.turn_history(run, overhead=overhead(), emit=emit, is_cancelled=_run_cancel_checker(run.pk))
        with _tools_killed_on_cancel(turns.run_sandboxes(run.pk), lambda: _run_cancelled(run.pk)):
            return run_turn(
                provider=get_provider(run.provider),
                model=run.model,
                system=system,
                history=history,
                toolbox=toolbox,
                emit=emit,
                is_cancelled=_run_cancel_checker(run.pk),
                limits=ActionLimits(per_run=settings.CC_RUN_MAX_ACTIONS, per_tool=settings.CC_TOOL_ACTION_LIMITS),
                max_parallel_tools=settings.CC_MAX_PARALLEL_TOOLS,
                resume=approvals.paused_turn_of(run),
                decisions=approvals.decisions_for(run),
                on_prompt_too_long=turns.reactive_compaction_hook(run, emit, overhead=overhead),
                max_tokens=settings.CC_MAX_OUTPUT_TOKENS,  # scaled to the window (LM-2)
                make_room=turns.room_making_hook(run, emit, max_tokens=settings.CC_MAX_OUTPUT_TOKENS),
                hand_off=_draining.is_set,
                record_step=request_recorder(run),
            )

    def failure(exc: Exception) -> str:
        if isinstance(exc, PromptTooLong):
            # A pass whose retry was refused too must not become the view later turns send (CH-12).
            Compaction.objects.filter(run=run, trigger="reactive").delete()
            return _too_long_message(run, history, exc)
        if isinstance(exc, ProviderError):
            return f"{type(exc).__name__}: {exc}"
        logger.exception("run %s failed", run.pk)
        return f"internal error: {type(exc).__name__}: {exc}"

    outcome = _drive(
        turn,
        pause=lambda waiting_for: _recorded_pause(
            catalog, run.pk, lambda: approvals.approval_pause(run=run, pause=waiting_for, publisher=publisher)
        ),
        finish=lambda status, error: run_finish(run, status, error, publisher),
        failure=failure,
        cancelled=lambda stopped: _finish_cancelled(run, TurnOutcome(stopped.messages), catalog, publisher),
        handed_off=lambda stopping: _hand_off(run, stopping, catalog, publisher, worker=worker),
    )
    if outcome is None or catalog is None:
        return
    if reconnecting(lambda: Run.objects.filter(pk=run.pk, cancel_requested=True).exists()):
        # Asked to stop while the last step ran (the loop checks at most every 0.5 s): the run
        # ends cancelled, and what the turn did is kept as it is for a cancel mid-turn.
        _finish_cancelled(run, outcome, catalog, publisher)
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


def _recorded_pause(
    catalog: CatalogToolBox | None, run_id: int, pause: Callable[[], list[Approval] | None]
) -> list[Approval] | None:
    """Pause for approval; once paused, record what the turn loaded so far (TD-15, TS-3): the
    resumed turn offers those tools again from the transcript, and records only its own loads."""
    with transaction.atomic():
        waiting = pause()
        if waiting is not None and catalog is not None:
            activations_record(run_id=run_id, activations=catalog.activations, misses=catalog.misses)
    return waiting


def _hand_off(
    run: Run, stopping: TurnHandedOff, catalog: CatalogToolBox | None, publisher: RunEventPublisher, *, worker: str
) -> None:
    """The worker is stopping (OP-4): the run goes back to the queue with its turn so far, and the
    next worker to claim it resumes after the last step, as after an approval. Asked to stop
    meanwhile: it ends cancelled, its turn kept as for any cancel."""
    with transaction.atomic():
        queued = Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING, cancel_requested=False).update(
            status=Run.Status.QUEUED, pending_turn=asdict(stopping.paused), queued_at=timezone.now()
        )
        if queued:
            if catalog is not None:
                activations_record(run_id=run.pk, activations=catalog.activations, misses=catalog.misses)
            # Stored before the run is sent: the next worker's run_started comes after it in the log.
            publisher.publish("run_handed_off", {"step": stopping.paused.step, "worker": worker})
            transaction.on_commit(lambda: enqueue_run(run.pk))
    if not queued:
        if reconnecting(lambda: Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING).exists()):
            _finish_cancelled(run, TurnOutcome(stopping.paused.messages), catalog, publisher)
        return
    logger.info("run %s handed off after step %s: %s is stopping", run.pk, stopping.paused.step, worker)


def _finish_cancelled(
    run: Run, outcome: TurnOutcome, catalog: CatalogToolBox | None, publisher: RunEventPublisher
) -> None:
    """End a running run as cancelled, keeping its turn up to where it stopped (OP-3): each call
    answered, a killed one by its partial output marked cancelled, so the next turn sees it and
    the transcript stays valid for the provider."""
    kept = reconnecting(lambda: _persist_turn(run, outcome, catalog, status=Run.Status.CANCELLED))
    if kept is not None:  # None: failed meanwhile (reaped), and that verdict was announced
        if kept.pk == run.trigger_id:
            tip_back_to_latest_answer(conversation_id=run.conversation_id, prompt_id=run.trigger_id)
        publisher.publish("run_finished", _cancelled_payload(run, kept))


def _compaction_execute(run: Run, emit: Callable[[str, dict[str, Any]], None], publisher: RunEventPublisher) -> None:
    """A compaction run (CH-14): one pass over the path to the trigger, climbing the rungs asked for
    with the conversation's own model as the summarizer; the summary's request is recorded with
    the run, and the pass with it (`Compaction.run`). A failed or cancelled call records no pass."""
    try:
        done = turns.requested_compaction(run, is_cancelled=_run_cancel_checker(run.pk))
    except TurnCancelled:
        run_finish(run, Run.Status.CANCELLED, "", publisher)
        return
    except ProviderError as exc:
        run_finish(run, Run.Status.FAILED, f"{type(exc).__name__}: {exc}", publisher)
        return
    except Exception as exc:
        logger.exception("compaction run %s failed", run.pk)
        run_finish(run, Run.Status.FAILED, f"internal error: {type(exc).__name__}: {exc}", publisher)
        return
    if done.compaction is not None:
        emit("compaction", turns.compaction_event(done.compaction))
    else:
        # Too little freed (CH-11): nothing recorded but the call's cost, which was spent.
        emit("compaction", {"trigger": "command", "recorded": False, "detail": done.reason})
    run_finish(run, Run.Status.SUCCEEDED, "", publisher)


@transaction.atomic
def _persist_turn(
    run: Run, outcome: TurnOutcome, toolbox: CatalogToolBox | None, *, status: str = Run.Status.SUCCEEDED
) -> Message | None:
    # Only a run that is still running may store its turn, decided under the row lock.
    if not list(
        Run.objects.select_for_update(no_key=True).filter(pk=run.pk, status=Run.Status.RUNNING).values_list("pk")
    ):
        return None
    parent = _append_turn(run, outcome.messages)
    if toolbox is not None:
        activations_record(run_id=run.pk, activations=toolbox.activations, misses=toolbox.misses)
    Run.objects.filter(pk=run.pk).update(pending_turn=None)
    _run_finished(run, status, "")
    return parent


def _append_turn(run: Run, messages: list[dict[str, Any]]) -> Message:
    """Write the turn's messages under its trigger; the last one written (the trigger if none)."""
    parent = run.trigger
    for message in messages:
        parent = Message.objects.create(
            conversation_id=run.conversation_id, parent=parent, role=message["role"], content=message["content"]
        )
    if parent.pk != run.trigger_id:
        # Move the tip only if nobody branched away while the turn ran; otherwise the
        # reply stays reachable on its own branch (CH-7).
        Conversation.objects.filter(pk=run.conversation_id, tip_id=run.trigger_id).update(
            tip=parent, updated_at=timezone.now()
        )
    return parent


def _too_long_message(run: Run, history: list[dict[str, Any]], exc: PromptTooLong) -> str:
    measured = exc.tokens if exc.tokens is not None else estimate_json_tokens(history)
    limit = f" against a maximum of {exc.maximum}" if exc.maximum is not None else ""
    return (
        f"The prompt is too long for {run.model}: {measured} tokens{limit} "
        f"({len(history)} messages in the conversation path). Nothing of this turn was kept; "
        "shorten the conversation (branch from an earlier message) or start a new one."
    )


def _run_cancelled(run_id: int) -> bool:
    """Asked to stop, or no longer running: failed by a reaper while this worker was stopped or cut
    off (a retry may be running the turn again). Its tools are killed and no further request is
    paid for. (A run is not deleted while it runs: its conversation refuses deletion then.)"""
    return reconnecting(
        lambda: Run.objects.filter(pk=run_id).exclude(status=Run.Status.RUNNING, cancel_requested=False).exists()
    )


def _run_cancel_checker(run_id: int) -> Callable[[], bool]:
    return polled_at_most_every(CANCEL_POLL_SECONDS, lambda: _run_cancelled(run_id))


# How often a running turn's watcher asks whether it was cancelled: a cancel kills the tool's
# process group within this (OP-3); the loop then ends the run at its next check.
CANCEL_KILL_POLL_SECONDS = 0.25


@contextlib.contextmanager
def _tools_killed_on_cancel(sandboxes: Hashable, is_cancelled: Callable[[], bool]) -> Iterator[None]:
    """While the turn runs, a watcher kills its tools' process groups as soon as it is cancelled.

    The loop itself only checks between steps and stream chunks, so a tool that sleeps would
    otherwise hold the cancel until it ends by itself."""
    stop = threading.Event()

    def watch() -> None:
        try:
            while not stop.wait(CANCEL_KILL_POLL_SECONDS):
                try:
                    if is_cancelled():
                        sandbox.kill_running(sandboxes)
                except DatabaseError:
                    connection.close()  # dropped: the next poll reconnects
        finally:
            connection.close()  # this thread's own connection

    watcher = threading.Thread(target=watch, daemon=True, name="cc-cancel-watch")
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join(timeout=2)


def subagent_execute(subagent_id: int, *, worker: str) -> None:
    """Run (or resume) one child; the first child opens the gate on its first streamed event."""
    if not subagent_claim(subagent_id=subagent_id, worker=worker):
        logger.info("subagent %s is not queued any more; %s leaves it alone", subagent_id, worker)
        return
    child = Subagent.objects.select_related("parent", "parent__mode", "parent__conversation").get(pk=subagent_id)
    parent = child.parent
    resume = approvals.paused_turn_of(child)
    first = child.index == 0
    if not first and resume is None:
        subagents.wait_for_release(child.fanout_id, settings.CC_SUBAGENT_RELEASE_WAIT_SECONDS)
    opened = resume is not None  # a resumed child started streaming long ago

    def open_gate() -> None:
        nonlocal opened
        if first and not opened:
            opened = True
            subagents.release_siblings(child.fanout_id, child.count - 1)

    with db_turn():
        publisher = RunEventPublisher(parent)

    def emit(kind: str, payload: dict[str, Any]) -> None:
        if kind in ("text_delta", "tool_call", "usage"):
            open_gate()
        # Its calls show in the parent's card (UX-4), its text is its answer, shown when it ends;
        # its compactions (LM-2) are in the parent's log, and its usage, which the parent's usage
        # bar counts (its requests are the parent run's).
        if kind in ("tool_call", "tool_result", "compaction", "usage"):
            subagents.subagent_event(publisher, child, f"subagent_{kind}", payload)

    turn_id = f"subagent-{child.pk}"
    catalog: CatalogToolBox | None = None

    def turn() -> TurnOutcome:
        nonlocal catalog
        # Inside the turn: a claimed child whose first write fails ends failed, instead of staying
        # "running" (its worker alive, so no reaper) until its parent gives up on it.
        subagents.subagent_status_event(publisher, child, Run.Status.RUNNING)
        profile = subagents.subagent_profiles().get(child.profile)
        if profile is None:
            raise ValueError(f"profile {child.profile!r} is no longer configured")
        catalog, toolbox = turns.subagent_toolboxes(
            conversation_id=parent.conversation_id,
            owner_id=parent.conversation.owner_id,
            mode=parent.mode,
            parent_run_id=parent.pk,
            turn_id=turn_id,
        )
        with _tools_killed_on_cancel(turns.subagent_sandboxes(turn_id), lambda: _subagent_cancelled(child.pk)):
            return run_turn(
                provider=get_provider(parent.provider),
                model=parent.model,
                system=[*subagents.subagent_system(child.shape), *catalog.surface.system_blocks()],
                history=subagents.subagent_history(profile=profile, task=child.task),
                toolbox=toolbox,
                emit=emit,
                max_steps=profile.max_steps,
                is_cancelled=_subagent_cancel_checker(child.pk),
                limits=ActionLimits(per_run=profile.max_actions, per_tool=settings.CC_TOOL_ACTION_LIMITS),
                max_parallel_tools=settings.CC_MAX_PARALLEL_TOOLS,
                resume=resume,
                decisions=approvals.decisions_for(parent, subagent=child),
                # Scaled to the window as the parent's (LM-2); max_tokens is no part of any cached prefix.
                max_tokens=settings.CC_MAX_OUTPUT_TOKENS,
                make_room=turns.subagent_room_hook(parent, emit, max_tokens=settings.CC_MAX_OUTPUT_TOKENS),
                record_step=request_recorder(parent, label=child.label),
            )

    def pause(waiting_for: ApprovalNeeded) -> list[Approval] | None:
        with db_turn():
            return _recorded_pause(
                catalog, parent.pk, lambda: approvals.approval_pause(run=parent, pause=waiting_for, subagent=child)
            )

    def failure(exc: Exception) -> str:
        logger.exception("subagent %s failed", child)
        return f"{type(exc).__name__}: {exc}"

    try:
        outcome = _drive(
            turn,
            pause=pause,
            finish=lambda status, error: subagent_finish(child, status, error=error, publisher=publisher),
            failure=failure,
            cancelled_error=SUBAGENT_CANCELLED,
        )
    finally:
        open_gate()  # a failed or paused first child must not hold its siblings for the whole wait
    if outcome is None:
        return
    final = outcome.messages[-1]["content"] if outcome.messages else []
    answer = "".join(block.get("text", "") for block in final if block.get("type") == "text")
    with db_turn(), transaction.atomic():
        if catalog is not None:
            # A child's loads count as its parent run's (TS-3): the run is what a mode serves.
            activations_record(run_id=parent.pk, activations=catalog.activations, misses=catalog.misses)
        subagent_finish(child, Run.Status.SUCCEEDED, answer=answer, publisher=publisher)


def _subagent_cancelled(subagent_id: int) -> bool:
    """A child stops when it is cancelled, or when its parent is cancelled or no longer running.

    The parent's cancel is read directly: the child's commands die within a poll of it, not once
    the parent's own loop has noticed it and ended.
    """
    # Reconnecting, as a run's check does: a PostgreSQL drop mid-answer failed the child (QA).
    child = reconnecting(
        lambda: (
            Subagent.objects.filter(pk=subagent_id)
            .values("cancel_requested", "parent__cancel_requested", "parent__status")
            .first()
        )
    )
    return (
        child is None
        or child["cancel_requested"]
        or child["parent__cancel_requested"]
        or child["parent__status"] != Run.Status.RUNNING
    )


def _subagent_cancel_checker(subagent_id: int) -> Callable[[], bool]:
    return polled_at_most_every(CANCEL_POLL_SECONDS, lambda: _subagent_cancelled(subagent_id))


# --- waiting → queued: a person decided -------------------------------------------------


def approval_decide(*, approval_id: int, user: User, decision: str) -> Approval:
    """Record a person's decision; once no call of the run (or subagent) waits any more, queue it again."""
    with transaction.atomic():
        approval, ready = approvals.approval_record(approval_id=approval_id, user=user, decision=decision)
        if isinstance(ready, Subagent):
            subagent_id = ready.pk
            transaction.on_commit(lambda: enqueue_subagent(subagent_id))
        elif isinstance(ready, Run):
            run_id = ready.pk
            transaction.on_commit(lambda: enqueue_run(run_id))
    return approval


# --- the reaper ---------------------------------------------------------------------


def unvouched_since(settled: datetime) -> Q:
    """Not vouched for since `settled` (rows claimed before `vouched_at` existed: not started since)."""
    return Q(vouched_at__lt=settled) | Q(vouched_at__isnull=True, started_at__lt=settled)


def runs_vouch(worker: str) -> None:
    """The worker's own word, in PostgreSQL, that the runs and subagents it holds are still running."""
    now = timezone.now()
    Run.objects.filter(worker=worker, status=Run.Status.RUNNING).update(vouched_at=now)
    with db_turn():
        Subagent.objects.filter(worker=worker, status=Run.Status.RUNNING).update(vouched_at=now)


def runs_reap_orphans(*, live: Collection[str], grace_seconds: float | None = None) -> list[int]:
    """Fail, as retryable, the runs (and subagents) whose worker is gone; no turn was half-written (CH-5)."""
    grace = heartbeat.ttl_seconds() if grace_seconds is None else grace_seconds
    settled = timezone.now() - timedelta(seconds=grace)
    candidates = Run.objects.filter(unvouched_since(settled), status=Run.Status.RUNNING).exclude(worker__in=live)
    reaped = []
    for run in candidates.select_related("conversation"):
        lost = WORKER_LOST_COMPACTION if run.compact_rungs else WORKER_LOST
        error = lost.format(worker=run.worker or "unknown worker")
        interrupted = interrupted_calls(run.pk)
        if len(interrupted) == 1:
            error += WORKER_LOST_MID_TOOL.format(name=interrupted[0]["name"], tool_use_id=interrupted[0]["id"])
        elif interrupted:
            calls = ", ".join(f"{call['name']} ({call['id']})" for call in interrupted)
            error += WORKER_LOST_MID_STEP.format(count=len(interrupted), calls=calls)
        # A person asked to stop it while (or after) its worker died: that is what they see, not a failure.
        status = Run.Status.CANCELLED if run.cancel_requested else Run.Status.FAILED
        if run.cancel_requested:
            error = WORKER_LOST_CANCELLED.format(worker=run.worker or "unknown worker")
        # Conditional: another worker's reaper, or the run itself finishing, may win the race.
        if run_finish(run, status, error):
            subagents.subagents_cancel(parent_id=run.pk)
            reaped.append(run.pk)
    if reaped:
        logger.warning("failed %d run(s) whose worker stopped mid-turn: %s", len(reaped), reaped)
    _subagents_reap_orphans(live=live, settled=settled)
    return reaped


def interrupted_calls(run_id: int) -> list[dict[str, Any]]:
    """The run's tool calls that have no result in its event log, in call order: the calls of the
    step it stopped in. A step's results are logged when all its calls have ended, so with several
    calls any of them may be the one that was cut off (QA: blaming the last named a call that had
    ended, not the one still running)."""
    events = RunEvent.objects.filter(run_id=run_id, type__in=["tool_call", "tool_result"]).order_by("seq")
    open_calls: dict[str, dict[str, Any]] = {}
    for kind, payload in events.values_list("type", "payload"):
        if kind == "tool_call":
            open_calls[payload.get("id", "")] = payload
        else:
            open_calls.pop(payload.get("id", payload.get("tool_use_id", "")), None)
    return [
        {"id": call.get("id", ""), "name": call.get("name", ""), "input": call.get("input", {})}
        for call in open_calls.values()
    ]


def _retry_of(run: Run) -> dict[str, Any] | None:
    """What the earlier run answering the same message was doing when it stopped (OP-4), for run_started."""
    earlier = Run.objects.filter(trigger_id=run.trigger_id, pk__lt=run.pk).order_by("-pk").first()
    if earlier is None or not earlier.retryable:
        return None
    return {"run": earlier.pk, "status": earlier.status, "interrupted_calls": interrupted_calls(earlier.pk)}


def _subagents_reap_orphans(*, live: Collection[str], settled: datetime) -> int:
    """Fail the running children whose worker is gone, so their parent hears it now, not at its
    timeout, and so does a page watching the parent (a `subagent_status` event each)."""
    orphans = Subagent.objects.filter(unvouched_since(settled), status=Run.Status.RUNNING).exclude(worker__in=live)
    lost = subagents.subagents_end(orphans, Run.Status.FAILED, error=SUBAGENT_WORKER_LOST)
    if lost:
        logger.warning("failed %d subagent(s) whose worker stopped mid-turn", lost)
    return lost


# Outside a Celery worker (embedded mode, tests) one instance per process.
_PROCESS_INSTANCE = uuid.uuid4().hex[:12]


def worker_identity(hostname: str | None) -> str:
    """The name a worker claims runs and beats under: its --hostname plus its process instance
    (OP-2), so a worker restarted under the same name does not pass for the one that died."""
    return f"{hostname or 'celery'}#{os.environ.get('CC_WORKER_INSTANCE') or _PROCESS_INSTANCE}"


def _on_complete_live_set(live: list[str]) -> None:
    runs_reap_orphans(live=live)
    sweep_lost_work()


# Set once this worker process begins a warm shutdown (OP-4): its runs hand off at their next step.
_draining = threading.Event()


def worker_draining() -> None:
    """The worker was asked to stop: its running turns go back to the queue between two steps
    instead of holding the shutdown for the rest of the turn (Celery waits for running tasks)."""
    _draining.set()


def worker_started(hostname: str) -> threading.Event:
    """A Celery worker is up: beat for it; once the live set is complete, reap and sweep for everyone."""
    identity = worker_identity(hostname)
    return heartbeat.start_heartbeat(identity, on_complete=_on_complete_live_set, on_tick=lambda: runs_vouch(identity))
