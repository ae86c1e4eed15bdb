"""Tool approvals (RN-4): pausing a run for a person, recording the decision, resuming.

The loop raises `ApprovalNeeded` before any call of the step runs; `approval_pause`
stores the partial turn on the run (`Run.pending_turn`, never the transcript: CH-5)
with one `Approval` per waiting call. Everything lives in the database, so any worker
(a new one after a restart, too) resumes the run once every call is decided.
"""

from __future__ import annotations

import threading
from dataclasses import asdict
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import connections, transaction
from django.utils import timezone

from agents.events import RunEventPublisher
from agents.models import Approval, ModelRequest, Run
from agents.runtime.actions import ApprovalNeeded
from agents.runtime.loop import PausedTurn, StepRecord
from controlcenter.db import usable_connection
from controlcenter.errors import Conflict, NotFound
from toolcatalog.builtins import BUILTINS


class GatedToolBox:
    """The run's toolbox as the loop sees it: says which calls need a person.

    The loop only executes an approval-requiring call once a person approved it, so
    the inner toolbox is built to run what it is given. Calls may run on the loop's
    tool threads: each closes its own database connection when done.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._thread = threading.current_thread()

    def requires_approval(self, name: str) -> bool:
        if name in settings.CC_TOOL_AUTO_APPROVE:
            return False
        # A catalog toolbox knows its own tools' flags; otherwise the built-in registry does.
        inner = getattr(self.inner, "requires_approval", None)
        if callable(inner):
            return bool(inner(name))
        tool = BUILTINS.get(name)
        return bool(tool is not None and tool.requires_approval)

    def schemas(self) -> list[dict[str, Any]]:
        return self.inner.schemas()

    def execute(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.execute_step(0, name, arguments)

    def execute_step(self, step: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        # The connection may have been dropped while the model or an earlier tool ran (CH-5).
        usable_connection()
        try:
            numbered = getattr(self.inner, "execute_step", None)
            return numbered(step, name, arguments) if step and numbered else self.inner.execute(name, arguments)
        finally:
            if threading.current_thread() is not self._thread:
                connections.close_all()

    def __getattr__(self, attribute: str) -> Any:
        # Whatever else the inner toolbox offers (resident_count, activation) passes through.
        return getattr(self.inner, attribute)


def paused_turn_of(run: Run) -> PausedTurn | None:
    return PausedTurn(**run.pending_turn) if run.pending_turn else None


def decisions_for(run: Run) -> dict[str, str]:
    return dict(
        Approval.objects.filter(run=run).exclude(status=Approval.Status.PENDING).values_list("tool_use_id", "status")
    )


def model_request_rows(run: Run, steps: list[StepRecord]) -> list[ModelRequest]:
    return [
        ModelRequest(
            run=run,
            step=step.step,
            model=run.model,
            input_tokens=step.usage.input_tokens,
            cache_creation_input_tokens=step.usage.cache_creation_input_tokens,
            cache_read_input_tokens=step.usage.cache_read_input_tokens,
            cache_creation_5m_input_tokens=step.usage.cache_creation_5m_input_tokens,
            cache_creation_1h_input_tokens=step.usage.cache_creation_1h_input_tokens,
            output_tokens=step.usage.output_tokens,
            request_id=step.request_id,
            breakpoints=step.breakpoints,
            tools_loaded=step.tools_loaded,
            cache_miss=step.cache_miss,
            stop_reason=step.stop_reason,
            duration_ms=step.duration_ms,
        )
        for step in steps
    ]


def approval_pause(*, run: Run, pause: ApprovalNeeded, publisher: RunEventPublisher) -> list[Approval]:
    """Store the partial turn and one pending approval per waiting call; the run waits."""
    paused = PausedTurn(messages=pause.messages, step=pause.step, previous_end=pause.previous_end, counts=pause.counts)
    with transaction.atomic():
        ModelRequest.objects.bulk_create(model_request_rows(run, pause.steps))
        approvals = []
        for block in pause.pending:
            approval, _ = Approval.objects.update_or_create(
                run=run,
                tool_use_id=block["id"],
                defaults={"tool_name": block["name"], "input": block.get("input") or {}},
            )
            approvals.append(approval)
        Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING).update(
            status=Run.Status.WAITING, pending_turn=asdict(paused)
        )
    for approval in approvals:
        publisher.publish(
            "approval_requested",
            {
                "approval_id": approval.pk,
                "tool_use_id": approval.tool_use_id,
                "name": approval.tool_name,
                "input": approval.input,
            },
        )
    return approvals


def approval_decide(*, approval_id: int, user: AbstractBaseUser, decision: str) -> Approval:
    """Record a person's decision; once no call of the run waits any more, queue the run again."""
    from agents.dispatch import enqueue_run

    if decision not in (Approval.Status.APPROVED, Approval.Status.DENIED):
        raise ValueError(f"decision must be approved or denied, not {decision!r}")
    with transaction.atomic():
        approval = Approval.objects.filter(pk=approval_id, run__conversation__owner=user).first()
        if approval is None:
            raise NotFound(f"Approval {approval_id} does not exist.")
        # The run row is the lock: two decisions on one run serialize, so exactly one re-queues it.
        run = Run.objects.select_for_update().get(pk=approval.run_id)
        approval = Approval.objects.select_for_update().get(pk=approval.pk)
        if approval.status != Approval.Status.PENDING:
            raise Conflict(f"Approval {approval.pk} was already decided ({approval.status}).")
        if run.status != Run.Status.WAITING:
            raise Conflict(f"Run {run.pk} is not waiting for approval ({run.status}).")
        approval.status, approval.decided_by, approval.decided_at = decision, user, timezone.now()
        approval.save(update_fields=["status", "decided_by", "decided_at"])
        RunEventPublisher(run).publish("approval_decided", {"approval_id": approval.pk, "decision": decision})
        if not Approval.objects.filter(run=run, status=Approval.Status.PENDING).exists():
            Run.objects.filter(pk=run.pk, status=Run.Status.WAITING).update(status=Run.Status.QUEUED)
            transaction.on_commit(lambda: enqueue_run(run.pk))
    return approval
