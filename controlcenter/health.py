"""`/healthz`: database, Redis, worker liveness and the queue as JSON, 200 when all are well.

Anyone may ask whether the installation is up (SB-5), but an anonymous caller gets only the
`ok` flags and counts: worker names name machines. A signed-in caller (session or API token)
sees the rest, and only staff see the error texts, which name hosts, ports and database users.
"""

from __future__ import annotations

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import APIException
from rest_framework.request import Request

from agents.heartbeat import live_workers
from agents.lifecycle import stale_queued_counts
from controlcenter.lockout import ThrottledTokenAuthentication
from toolcatalog import cgroups, sandbox


def healthz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, dict[str, object]] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = {"ok": True, "vendor": connection.vendor}
    except Exception as exc:
        checks["database"] = {"ok": False, "error": str(exc)}
    if settings.REDIS_URL:
        try:
            workers = live_workers()
            checks["redis"] = {"ok": True}
            checks["workers"] = {"ok": bool(workers), "live": workers}
        except Exception as exc:
            checks["redis"] = {"ok": False, "error": str(exc)}
            checks["workers"] = {"ok": False, "error": "unknown while Redis is down"}
    else:
        checks["workers"] = {"ok": True, "live": ["embedded"]}
    if checks["database"]["ok"]:
        # Work queued longer than the sweep interval (OP-2): lost by the broker and not yet swept
        # again, or no worker to take it. Either way a user is waiting.
        try:
            stale = stale_queued_counts()
        except DatabaseError as exc:
            # The server answers but has no tables of ours: `migrate` has not run against it.
            checks["database"] = {"ok": False, "error": f"the database answers but cannot be read: {exc}"}
        else:
            checks["queue"] = {
                "ok": not any(stale.values()),
                "queued_longer_than_seconds": settings.CC_QUEUE_SWEEP_SECONDS,
                **stale,
            }
    # This process runs /mcp tool calls in the sandbox: without bwrap they refuse to run. Which
    # limits apply (per call in cgroups, or per process) is said here and logged once.
    checks["sandbox"] = {"ok": sandbox.bwrap_path() is not None, "limits": cgroups.describe(paths=False)}
    healthy = all(check["ok"] for check in checks.values())
    checks = _visible_to(_caller(request), checks)
    return JsonResponse(
        {"status": "ok" if healthy else "degraded", "mode": settings.CC_MODE, "checks": checks},
        status=200 if healthy else 503,
    )


def _caller(request: HttpRequest) -> object | None:
    try:
        user = Request(request, authenticators=[ThrottledTokenAuthentication(), SessionAuthentication()]).user
    except APIException:  # a wrong token: answered as to anyone
        return None
    return user if user.is_authenticated else None


def _visible_to(user: object | None, checks: dict[str, dict[str, object]]) -> dict[str, dict[str, object]]:
    if user is None:
        return {
            name: {key: value for key, value in check.items() if key == "ok" or type(value) is int}
            for name, check in checks.items()
        }
    if not getattr(user, "is_staff", False):
        return {name: {key: value for key, value in check.items() if key != "error"} for name, check in checks.items()}
    return checks
