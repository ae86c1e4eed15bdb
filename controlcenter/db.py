"""Survive a dropped database connection in long-running code (workers), outside any transaction."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

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
