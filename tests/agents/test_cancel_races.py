"""Cancels sent at once, as two tabs or a double click send them: each answer follows the run's state
when the cancel lands, never the state its request loaded."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection

from agents.models import Run, RunEvent
from agents.services import run_cancel
from controlcenter.errors import Conflict
from tests.support.scratchpad import make_run

pytestmark = pytest.mark.django_db(transaction=True)


def _cancel_at_once(run_id: int, times: int, between: Callable[[], None] = lambda: None) -> list[str]:
    """`times` cancels that each load the run, then (after `between`) all cancel together."""
    # Bounded waits: a thread that fails before a barrier breaks it for all, instead of hanging them.
    loaded = threading.Barrier(times + 1, timeout=30)
    go = threading.Barrier(times + 1, timeout=30)
    answers: list[str] = []

    def cancel() -> None:
        try:
            run = Run.objects.get(pk=run_id)
            loaded.wait()
            go.wait()
            try:
                answers.append(run_cancel(run=run).status)
            except Conflict:
                answers.append("409")
        except BaseException as exc:
            answers.append(f"raised {exc!r}")
            loaded.abort()
            go.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=cancel) for _ in range(times)]
    for thread in threads:
        thread.start()
    loaded.wait()
    between()
    go.wait()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads), "a cancel never returned"
    return sorted(answers)


@pytest.mark.req("OP-3")
def test_of_four_cancels_of_a_queued_run_one_cancels_it_and_the_others_find_it_finished(alice):
    run = make_run(alice, status=Run.Status.QUEUED)

    answers = _cancel_at_once(run.pk, 4)

    assert answers == ["409", "409", "409", "cancelled"]
    assert Run.objects.get(pk=run.pk).status == Run.Status.CANCELLED
    assert RunEvent.objects.filter(run=run, type="run_finished").count() == 1


@pytest.mark.req("OP-3")
def test_cancels_that_land_after_a_running_run_finished_are_409_though_they_loaded_it_running(alice):
    run = make_run(alice, status=Run.Status.RUNNING)

    def finishes() -> None:
        Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)

    assert _cancel_at_once(run.pk, 3, between=finishes) == ["409", "409", "409"]
    finished = Run.objects.get(pk=run.pk)
    assert finished.status == Run.Status.SUCCEEDED and not finished.cancel_requested


@pytest.mark.req("OP-3")
def test_cancels_of_a_running_run_all_ask_it_to_stop(alice):
    run = make_run(alice, status=Run.Status.RUNNING)

    assert _cancel_at_once(run.pk, 3) == ["running", "running", "running"]
    assert Run.objects.get(pk=run.pk).cancel_requested
