"""Hand a queued run to whatever executes runs in this mode.

Services mode: a Celery task on Redis. Embedded mode: a worker thread in this
process calling the very service the task calls, so both modes run the same code.
"""

from __future__ import annotations

import logging
import socket
from concurrent.futures import ThreadPoolExecutor
from functools import cache

from django.conf import settings
from django.db import close_old_connections

logger = logging.getLogger(__name__)


@cache
def _embedded_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="cc-embedded-worker")


def _execute_in_thread(run_id: int) -> None:
    from agents.services import run_execute

    close_old_connections()
    try:
        run_execute(run_id=run_id, worker=f"embedded@{socket.gethostname()}")
    except Exception:
        logger.exception("embedded worker failed on run %s", run_id)
    finally:
        close_old_connections()


def enqueue_run(run_id: int) -> None:
    if settings.CC_MODE == "services":
        from agents.tasks import run_turn

        run_turn.apply_async((run_id,), queue=settings.CC_RUN_QUEUE)
    else:
        _embedded_pool().submit(_execute_in_thread, run_id)


def embedded_recover() -> None:
    """At start of an embedded server: the previous process's runs died with it."""
    from agents.models import Run
    from agents.services import runs_reap_orphans

    runs_reap_orphans(live=(), grace_seconds=0)
    for run_id in Run.objects.filter(status=Run.Status.QUEUED).values_list("pk", flat=True):
        enqueue_run(run_id)


def _subagent_in_thread(subagent_id: int) -> None:
    from agents.subagents import subagent_execute

    close_old_connections()
    try:
        subagent_execute(subagent_id, worker=f"embedded@{socket.gethostname()}")
    except Exception:
        logger.exception("embedded worker failed on subagent %s", subagent_id)
    finally:
        close_old_connections()


def enqueue_subagent(subagent_id: int) -> None:
    """One child of a fan-out (TD-14), where runs run: at its start, or again once its approvals are decided."""
    if settings.CC_MODE == "services":
        from agents.tasks import run_subagent

        run_subagent.apply_async((subagent_id,), queue=settings.CC_RUN_QUEUE)
    else:
        _subagent_pool().submit(_subagent_in_thread, subagent_id)


@cache
def _subagent_pool() -> ThreadPoolExecutor:
    # Own pool: the parent run holds a thread of the run pool while it waits for its children.
    return ThreadPoolExecutor(max_workers=4, thread_name_prefix="cc-embedded-subagent")
