"""A turn handed off by a stopping worker, as stored (OP-4, OP-2); the real worker's SIGTERM is in
tests/controlcenter/test_services_reliability.py."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from agents import heartbeat, lifecycle
from agents.models import ModelRequest, Run, RunEvent
from conversations.models import Conversation, Message


def _queued_run(owner, text: str, *, created_ago: dt.timedelta) -> Run:
    conversation = Conversation.objects.create(owner=owner, title="hand-off")
    trigger = Message.objects.create(conversation=conversation, role="user", content=[{"type": "text", "text": text}])
    conversation.tip = trigger
    conversation.save()
    run = Run.objects.create(conversation=conversation, trigger=trigger, provider="offline", model="offline-1")
    created = timezone.now() - created_ago
    Run.objects.filter(pk=run.pk).update(created_at=created, queued_at=created)
    # Sent to a broker nobody took it from, as `enqueue_run` leaves it: marked held. Unmarked,
    # the session's real worker (same database) sweeps it as lost and runs it mid-test.
    heartbeat.redis_client().set(lifecycle._mark("run", run.pk), "sent", ex=lifecycle.QUEUE_MARK_TTL_SECONDS)
    return run


@pytest.fixture
def draining(monkeypatch):
    """This process's worker was asked to stop; `enqueue_run` records what it would send."""
    sent: list[int] = []
    monkeypatch.setattr(lifecycle, "enqueue_run", sent.append)
    lifecycle.worker_draining()
    yield sent
    lifecycle._draining.clear()


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("OP-4")
def test_a_handed_off_run_is_queued_from_the_hand_off_not_from_its_creation(alice, settings, tmp_path, draining):
    settings.CC_WORKSPACE_ROOT, settings.CC_TOOL_AUTO_APPROVE = tmp_path, ["bash"]
    run = _queued_run(alice, "please run `echo handed`", created_ago=dt.timedelta(minutes=10))
    _queued_run(alice, "hello", created_ago=dt.timedelta(minutes=10))  # no worker took it for 10 minutes
    assert lifecycle.stale_queued_counts(older_than=60)["runs"] == 2

    lifecycle.run_execute(run_id=run.pk, worker="stopping@host")

    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED and run.pending_turn["step"] == 1
    assert draining == [run.pk]  # sent again once, after the commit
    assert RunEvent.objects.filter(run=run, type="run_handed_off").count() == 1
    assert list(ModelRequest.objects.filter(run=run).values_list("step", flat=True)) == [1]
    # Queued a moment ago, not 10 minutes ago: the sweep and /healthz leave it alone (a worker
    # restarting under load is not "work lost by the broker"); the run nobody took is flagged.
    assert timezone.now() - run.queued_at < dt.timedelta(seconds=30)
    assert lifecycle.stale_queued_counts(older_than=60)["runs"] == 1
