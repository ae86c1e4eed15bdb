"""Survive a dropped database connection in long-running code (workers), outside any transaction;
and take turns at an embedded (SQLite) database from several threads."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

logger = logging.getLogger(__name__)
T = TypeVar("T")


def reconnecting(action: Callable[[], T]) -> T:
    """Run `action`; if it failed because the connection is gone, reconnect once and run it again.

    Django reconnects only between requests, and a Celery task is one long "request": once
    PostgreSQL drops the connection (restart, failover, `pg_terminate_backend`, an idle
    timeout) every later query of the turn fails with "the connection is closed". Inside a
    transaction nothing can be replayed safely, and an error on a live connection (a
    constraint, a lock timeout) is not ours to hide: both are raised as they are.
    """
    try:
        return action()
    except (OperationalError, InterfaceError):
        if connection.in_atomic_block or (connection.connection is not None and connection.is_usable()):
            raise
        logger.warning("the database connection was lost; reconnecting")
        connection.close()
        return action()


def usable_connection() -> None:
    """Before a step that touches the database: let go of a connection PostgreSQL has closed.

    The step then opens a new one instead of failing on the dead one. Unlike `reconnecting`
    nothing is replayed, since the step has not started, so this is safe before any step,
    writes included: a tool call (memory, todo, approvals, scratchpad). The check is one
    `SELECT 1` round trip, the one CONN_HEALTH_CHECKS makes at the start of every request and
    (through Celery's Django fixup) every task, which is what keeps the run's claim safe.
    """
    if connection.connection is None or connection.in_atomic_block or connection.is_usable():
        return
    logger.warning("the database connection was lost; reconnecting")
    connection.close()


# SQLite has one writer; embedded children take turns at the database instead of failing with "locked".
_embedded_db_lock = threading.RLock()


def db_turn() -> contextlib.AbstractContextManager:
    return contextlib.nullcontext() if settings.CC_MODE == "services" else _embedded_db_lock
