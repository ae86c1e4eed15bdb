"""Tool approvals (RN-4): pausing a run for a person, recording the decision, resuming.

The loop raises `ApprovalNeeded` before any call of the step runs; `approval_pause`
stores the partial turn on the run (`Run.pending_turn`, never the transcript: CH-5)
with one `Approval` per waiting call. Everything lives in the database, so any worker
(a new one after a restart, too) resumes the run once every call is decided.
"""

from __future__ import annotations

import threading
from dataclasses import asdict
from typing import Any, cast

from django.contrib.auth.models import User
from django.db import connections, transaction
from django.utils import timezone

from agents.events import RunEventPublisher
from agents.models import Approval, Run, Subagent
from controlcenter.db import usable_connection
from controlcenter.errors import Conflict, NotFound
from engine.actions import ApprovalNeeded, Decision
from engine.loop import PausedTurn
from engine.toolbox import ToolBox, ToolBoxLayer


class GatedToolBox(ToolBoxLayer):
    """The run's toolbox as the loop sees it: says which calls need a person.

    The loop only executes an approval-requiring call once a person approved it, so
    the inner toolbox is built to run what it is given. Calls may run on the loop's
    tool threads: each closes its own database connection when done.
    """

    def __init__(self, inner: ToolBox) -> None:
        super().__init__(inner)
        self._thread = threading.current_thread()

    def execute(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.execute_step(0, name, arguments)

    def execute_step(self, step: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        # The connection may have been dropped while the model or an earlier tool ran (CH-5).
        usable_connection()
        try:
            return self.inner.execute_step(step, name, arguments) if step else self.inner.execute(name, arguments)
        finally:
            if threading.current_thread() is not self._thread:
                connections.close_all()


def paused_turn_of(holder: Run | Subagent) -> PausedTurn | None:
    return PausedTurn(**holder.pending_turn) if holder.pending_turn else None


def decisions_for(run: Run, *, subagent: Subagent | None = None) -> dict[str, Decision]:
    """The decided calls of the run itself, or of one of its subagents."""
    decided = Approval.objects.filter(run=run, subagent=subagent).exclude(status=Approval.Status.PENDING)
    # Approved or denied: only a cancelled run or child has expired approvals, and it never resumes.
    return cast(dict[str, Decision], dict(decided.values_list("tool_use_id", "status")))


def subagent_payload(subagent: Subagent) -> dict[str, Any]:
    return {"id": subagent.pk, "index": subagent.index, "profile": subagent.profile, "task": subagent.task[:200]}


def approval_pause(
    *,
    run: Run,
    pause: ApprovalNeeded,
    publisher: RunEventPublisher | None = None,
    subagent: Subagent | None = None,
) -> list[Approval] | None:
    """Store the partial turn and one pending approval per waiting call; the run (or its subagent) waits.

    None when it must not wait: it was cancelled (or a cancel was asked for) meanwhile, and the
    caller ends it as cancelled instead of asking anyone.

    A subagent's approvals belong to its parent run and are announced in the parent's event
    log, with the child named: the parent's conversation is where its owner sees and decides them.
    """
    paused = PausedTurn(messages=pause.messages, step=pause.step, previous_end=pause.previous_end, counts=pause.counts)
    holder = Subagent.objects.filter(pk=subagent.pk) if subagent is not None else Run.objects.filter(pk=run.pk)
    with transaction.atomic():
        waits = holder.filter(status=Run.Status.RUNNING, cancel_requested=False).update(
            status=Run.Status.WAITING, pending_turn=asdict(paused)
        )
        if not waits:
            return None
        approvals = []
        for block in pause.pending:
            approval, _ = Approval.objects.update_or_create(
                run=run,
                subagent=subagent,
                tool_use_id=block["id"],
                # What the tool will receive, references resolved: what the person approves (SB-5).
                defaults={"tool_name": block["name"], "input": block.get("resolved_input", block.get("input") or {})},
            )
            approvals.append(approval)
    publisher = publisher or RunEventPublisher(run)
    for approval in approvals:
        payload = {
            "approval_id": approval.pk,
            "tool_use_id": approval.tool_use_id,
            "name": approval.tool_name,
            "input": approval.input,
        }
        requested = next((b.get("input") for b in pause.pending if b["id"] == approval.tool_use_id), None)
        if requested is not None and requested != approval.input:
            payload["requested_input"] = requested  # as the model wrote it, with its {{stepN}} references
        if subagent is not None:
            payload["subagent"] = subagent_payload(subagent)
        publisher.publish("approval_requested", payload)
    return approvals


def approval_record(*, approval_id: int, user: User, decision: str) -> tuple[Approval, Run | Subagent | None]:
    """Record a person's decision, in the caller's transaction. When no call of the run (or
    subagent) waits any more it is moved back to queued and returned, for the caller to enqueue."""
    if decision not in (Approval.Status.APPROVED, Approval.Status.DENIED):
        raise ValueError(f"decision must be approved or denied, not {decision!r}")
    approval = Approval.objects.filter(pk=approval_id, run__conversation__owner=user).first()
    if approval is None:
        raise NotFound(f"Approval {approval_id} does not exist.")
    # The run row is the lock: two decisions on one run serialize, so exactly one re-queues it.
    # NO KEY UPDATE: rows that only reference the run (a child's events, stored meanwhile) must not
    # wait for it. Django's foreign keys are checked at commit with FOR KEY SHARE; under FOR UPDATE
    # a child's event insert, numbered like the decision's own event, deadlocked with the decision.
    run = Run.objects.select_for_update(no_key=True).get(pk=approval.run_id)
    approval = Approval.objects.select_for_update().get(pk=approval.pk)
    if approval.status != Approval.Status.PENDING:
        raise Conflict(f"Approval {approval.pk} was already decided ({approval.status}).")
    # The one that waits: the run, or the subagent whose call it is (its parent keeps running).
    subagent = Subagent.objects.get(pk=approval.subagent_id) if approval.subagent_id else None
    if subagent is not None and subagent.status != Run.Status.WAITING:
        raise Conflict(f"Subagent {subagent.index} of run {run.pk} is not waiting for approval ({subagent.status}).")
    if subagent is None and run.status != Run.Status.WAITING:
        raise Conflict(f"Run {run.pk} is not waiting for approval ({run.status}).")
    approval.status, approval.decided_by, approval.decided_at = decision, user, timezone.now()
    approval.save(update_fields=["status", "decided_by", "decided_at"])
    RunEventPublisher(run).publish("approval_decided", {"approval_id": approval.pk, "decision": decision})
    if Approval.objects.filter(run=run, subagent=subagent, status=Approval.Status.PENDING).exists():
        return approval, None
    if subagent is not None:
        requeued = Subagent.objects.filter(pk=subagent.pk, status=Run.Status.WAITING).update(
            status=Run.Status.QUEUED, queued_at=timezone.now()
        )
        return approval, subagent if requeued else None
    requeued = Run.objects.filter(pk=run.pk, status=Run.Status.WAITING).update(
        status=Run.Status.QUEUED, queued_at=timezone.now()
    )
    return approval, run if requeued else None


def approvals_expire(*, run_id: int, subagents_only: bool = False) -> int:
    """Close the pending approvals of a run (or only its subagents') that stopped waiting for them."""
    pending = Approval.objects.filter(run_id=run_id, status=Approval.Status.PENDING)
    if subagents_only:
        pending = pending.filter(subagent__isnull=False).exclude(subagent__status=Run.Status.WAITING)
    return pending.update(status=Approval.Status.EXPIRED, decided_at=timezone.now())
