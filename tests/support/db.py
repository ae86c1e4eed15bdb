"""Faults an operator causes in PostgreSQL: its backends killed under a running process."""

from __future__ import annotations

from django.db import connection


def terminate_backends(app_name_prefix: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name LIKE %s AND pid <> pg_backend_pid()",
            [app_name_prefix + "%"],
        )
        return cursor.fetchone()[0]
