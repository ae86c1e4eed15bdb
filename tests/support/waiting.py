"""The one way tests wait for something another process does: poll a predicate until it holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from tests.support.timing import scaled

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 30,
    what: str = "the condition",
    interval: float = 0.05,
    sleep: Callable[[float], object] = time.sleep,
) -> T:
    """The predicate's first truthy value; AssertionError naming `what` when `timeout` seconds pass without one.

    `sleep` is how to pass the time between tries: Playwright's sync API hands a page's events (a held
    request, say) to the test only while it is inside a Playwright call, so a browser test passes
    `lambda seconds: page.wait_for_timeout(seconds * 1000)`.

    `timeout` is a cap on the reference machine, scaled to this one (tests/support/timing.py)."""
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        sleep(interval)


def run_finished(run_id: int, timeout: float = 30):
    """The run once it has finished (succeeded, failed or cancelled)."""
    from agents.models import Run

    return wait_until(
        lambda: Run.objects.filter(pk=run_id).exclude(status__in=("queued", "running", "waiting")).first(),
        timeout,
        f"run {run_id} to finish",
    )


def run_in(run, statuses: set[str], timeout: float = 30):
    """`run`, refreshed, once its status is one of `statuses`."""

    def reached():
        run.refresh_from_db()
        return run if run.status in statuses else None

    return wait_until(reached, timeout, f"run {run.pk} to reach one of {sorted(statuses)} (it is {run.status})")
