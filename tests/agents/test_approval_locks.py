"""A decision on an approval and the run's event log: a child writing to the same log never deadlocks
it (RN-4, TD-14), and a page told of the decision finds it in the log (UX-4)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection, transaction

from agents.events import run_group
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


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("UX-4", "RN-4")
def test_a_page_told_of_a_decision_finds_it_in_the_log_even_while_the_deciding_transaction_runs_on(alice):
    """A page that redraws replays the run's log and drops what it was told before. The decision's
    event went out before its transaction committed, so a page redrawn in between replayed a log
    without it: the prompt stayed undecided, with live buttons, until the run ended."""
    run = RunFactory(conversation__owner=alice, status=Run.Status.WAITING)
    RunEvent.objects.create(run=run, seq=1, type="run_started", payload={})
    approval = Approval.objects.create(run=run, tool_use_id="toolu_1", tool_name="bash", input={})
    subscribed, told = threading.Event(), threading.Event()
    outcome: dict = {}

    def page() -> tuple[str, bool]:
        layer = get_channel_layer()

        async def watch() -> dict:
            channel = await layer.new_channel()
            await layer.group_add(run_group(run.pk), channel)
            subscribed.set()
            return json.loads((await asyncio.wait_for(layer.receive(channel), 20))["text"])

        event = async_to_sync(watch)()
        # What a redrawn page does at once: read the log after what it has replayed (none of it).
        found = RunEvent.objects.filter(run=run, seq=event["seq"]).exists()
        told.set()
        return event["type"], found

    watcher = _in_thread(page, outcome, "page")
    assert subscribed.wait(10)
    with transaction.atomic():
        approval_decide(approval_id=approval.pk, user=alice, decision="denied")
        told.wait(2)  # the rest of a busy request's transaction
    watcher.join(30)

    assert outcome["page"] == ("approval_decided", True), outcome["page"]
