"""The Celery app. Workers run agent turns (RN-1); see agents/tasks.py."""

from __future__ import annotations

import os
import uuid

from celery import Celery
from celery.signals import worker_init, worker_ready, worker_shutting_down

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlcenter.settings")

app = Celery("controlcenter")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def _new_instance(**kwargs) -> None:  # noqa: ANN003
    # A worker is its process instance, not its name (OP-2): a worker restarted under the same
    # --hostname is a new worker, and the runs of the one that died are reaped. Set before the
    # pool starts, so pool processes (forked or spawned) inherit it.
    os.environ["CC_WORKER_INSTANCE"] = uuid.uuid4().hex[:12]


@worker_ready.connect
def _announce_worker(sender, **kwargs) -> None:  # noqa: ANN001
    # Deferred: this module is imported before Django is set up, and agents.lifecycle imports this app.
    from agents.lifecycle import worker_started
    from controlcenter.mode import log_mode

    log_mode()
    worker_started(sender.hostname)


@worker_shutting_down.connect
def _hand_off_running_turns(sig, how, exitcode, **kwargs) -> None:  # noqa: ANN001, ANN003
    # A warm shutdown (SIGTERM) waits for running tasks: without this, for the rest of each turn.
    # Deferred as above.
    from agents.lifecycle import worker_draining

    worker_draining()
