"""A decision and a child writing to the same run's event log never deadlock (RN-4, TD-14)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from agents.lifecycle import approval_decide
from agents.models import Approval, Run, RunEvent, Subagent
from tests.support.factories import RunFactory


def _in_thread(work, outcome: dict, key: str) -> threading.Thread:
    def body() -> None:
        try:
            outcome[key] = work()
        except Exception as exc:  # the assertion below names it
            outcome[key] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("RN-4", "TD-14")
def test_a_decision_while_a_child_stores_an_event_of_the_same_number_both_succeed(alice):
    run = RunFactory(conversation__owner=alice, status=Run.Status.RUNNING)
    RunEvent.objects.create(run=run, seq=1, type="run_started", payload={})
    child = Subagent.objects.create(
        parent=run, fanout_id="f", index=0, count=2, shape="s", profile="worker", task="t", status=Run.Status.WAITING
    )
    approval = Approval.objects.create(run=run, subagent=child, tool_use_id="toolu_1", tool_name="bash", input={})
    stored, go = threading.Event(), threading.Event()
    outcome: dict = {}

    def child_event() -> int:
        # A sibling's event, in a transaction still open when the person decides: the foreign key
        # to the run is checked only at its commit (Django's constraints are deferred).
        with transaction.atomic():
            event = RunEvent.objects.create(run_id=run.pk, seq=2, type="subagent_status", payload={})
            stored.set()
            go.wait(10)
        return event.seq

    writer = _in_thread(child_event, outcome, "child")
    assert stored.wait(10)
    # The decision locks the run and numbers its own event 2 too: it waits for the child's commit.
    decider = _in_thread(
        lambda: approval_decide(approval_id=approval.pk, user=alice, decision="denied"), outcome, "decision"
    )
    time.sleep(1.5)
    go.set()  # the child commits: its key check on the run must not wait for the decision's lock
    writer.join(30)
    decider.join(30)

    assert outcome["child"] == 2, outcome["child"]
    assert isinstance(outcome["decision"], Approval), outcome["decision"]
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.DENIED
    assert list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "type")) == [
        (1, "run_started"),
        (2, "subagent_status"),
        (3, "approval_decided"),
    ]
    assert Subagent.objects.get(pk=child.pk).status == Run.Status.QUEUED
