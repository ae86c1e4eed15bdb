"""The heartbeat says "alive" on time even while this worker's reaper waits on the database (CH-5)."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
import redis
from django.utils import timezone

from agents import heartbeat
from agents.lifecycle import interrupted_calls, runs_reap_orphans
from agents.models import Run, RunEvent
from agents.services import run_cancel
from tests.support.factories import RunFactory
from tests.support.waiting import wait_until


@pytest.mark.req("CH-5")
def test_a_reap_pass_stuck_on_the_database_never_delays_the_beat(settings):
    settings.CC_WORKER_HEARTBEAT_SECONDS = 1  # TTL 3 s
    client = redis.Redis.from_url(settings.REDIS_URL)
    name = f"beat-{uuid.uuid4().hex[:8]}@host"
    released, passes = threading.Event(), []

    def stuck_reaper(live: list[str]) -> None:
        passes.append(live)
        released.wait(10)  # a pass waiting on a locked row, far longer than the TTL

    stop = heartbeat.start_heartbeat(name, on_complete=stuck_reaper)
    try:
        wait_until(lambda: client.exists(heartbeat.KEY_PREFIX + name), 5, "the first beat")
        # The first pass comes once the registry is a TTL old (at most 3 s here); then it hangs.
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            assert client.exists(heartbeat.KEY_PREFIX + name), "the worker looked dead while its reaper waited"
            time.sleep(0.2)
        assert passes and name in passes[0]  # the reaper ran, and is still stuck in its first pass
        assert len(passes) == 1
    finally:
        released.set()
        stop.set()
        client.delete(heartbeat.KEY_PREFIX + name)


@pytest.mark.django_db
@pytest.mark.req("OP-2", "OP-3")
def test_a_run_cancelled_while_its_worker_was_dead_ends_cancelled_not_failed():
    # QA: Stop pressed after the worker was killed answered 200, then the reaper failed the run as
    # "worker stopped … Retry", and the person's cancel was recorded nowhere.
    started = timezone.now() - timedelta(minutes=5)
    cancelled = RunFactory(status=Run.Status.RUNNING, worker="gone@host", started_at=started)
    run_cancel(run=cancelled)
    crashed = RunFactory(status=Run.Status.RUNNING, worker="gone@host", started_at=started)
    assert sorted(runs_reap_orphans(live=[], grace_seconds=0)) == sorted([cancelled.pk, crashed.pk])
    cancelled.refresh_from_db()
    crashed.refresh_from_db()
    assert cancelled.status == Run.Status.CANCELLED and "Cancelled. Its worker (gone@host)" in cancelled.error
    assert crashed.status == Run.Status.FAILED and crashed.retryable


@pytest.mark.django_db
@pytest.mark.req("CH-5")
def test_a_run_its_worker_vouched_for_within_the_ttl_is_not_reaped_whatever_the_live_set_says():
    from agents.lifecycle import runs_vouch

    long_ago = timezone.now() - timedelta(minutes=5)
    vouched = RunFactory(status=Run.Status.RUNNING, worker="cut-off@host", started_at=long_ago)
    silent = RunFactory(status=Run.Status.RUNNING, worker="gone@host", started_at=long_ago)
    before_vouching = RunFactory(status=Run.Status.RUNNING, worker="gone@host", started_at=long_ago)
    Run.objects.filter(pk=before_vouching.pk).update(vouched_at=None)  # claimed by a release without it
    Run.objects.filter(pk__in=[vouched.pk, silent.pk]).update(vouched_at=long_ago)
    runs_vouch("cut-off@host")  # its Redis key is missing, its database word is fresh
    assert sorted(runs_reap_orphans(live=[], grace_seconds=60)) == sorted([silent.pk, before_vouching.pk])
    vouched.refresh_from_db()
    assert vouched.status == Run.Status.RUNNING


@pytest.mark.django_db
@pytest.mark.req("OP-4")
def test_a_run_reaped_in_a_step_of_several_calls_names_every_call_without_a_result():
    # QA: a step's results are logged when all its calls have ended; the reaper blamed the last call
    # listed (a time lookup that had ended in milliseconds), not the git log still running.
    run = RunFactory(status=Run.Status.RUNNING, worker="gone@host", started_at=timezone.now() - timedelta(minutes=5))
    calls = [("toolu_a", "list_dir"), ("toolu_b", "git__git_log"), ("toolu_c", "time__get_current_time")]
    for seq, (tool_use_id, name) in enumerate(calls, start=1):
        RunEvent.objects.create(run=run, seq=seq, type="tool_call", payload={"id": tool_use_id, "name": name})
    RunEvent.objects.create(run=run, seq=4, type="tool_result", payload={"id": "toolu_a", "name": "list_dir"})
    assert [call["name"] for call in interrupted_calls(run.pk)] == ["git__git_log", "time__get_current_time"]
    assert runs_reap_orphans(live=[], grace_seconds=0) == [run.pk]
    run.refresh_from_db()
    assert "a step of 2 tool calls run together: git__git_log (toolu_b), time__get_current_time (toolu_c)" in (
        run.error
    )
    assert "any of them may have been cut off" in run.error


@pytest.mark.django_db
@pytest.mark.req("OP-4", "CH-14")
def test_a_reaped_compaction_run_says_no_compaction_was_recorded_not_that_a_turn_stopped():
    """QA: a /compact summary run killed with its worker said "The worker running this turn…"."""
    run = RunFactory(
        status=Run.Status.RUNNING, worker="gone@host", started_at=timezone.now() - timedelta(minutes=5),
        compact_rungs=["summary"],
    )  # fmt: skip
    assert runs_reap_orphans(live=[], grace_seconds=0) == [run.pk]
    run.refresh_from_db()
    assert run.error.startswith("The worker running this compaction stopped before it ended (gone@host); no ")
    assert "turn" not in run.error
