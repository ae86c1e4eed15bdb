"""Faults an operator causes in PostgreSQL: its backends killed under a running process."""

from __future__ import annotations

from django.db import connection, connections


def terminate_backends(app_name_prefix: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name LIKE %s AND pid <> pg_backend_pid()",
            [app_name_prefix + "%"],
        )
        return cursor.fetchone()[0]


def drop_this_connection() -> None:
    """PostgreSQL ends this thread's connection (a restart, an idle timeout); Django does not know yet."""
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    admin = connections.create_connection("default")
    try:
        with admin.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            assert cursor.fetchone() == (True,)
    finally:
        admin.close()
