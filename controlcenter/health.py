"""`/healthz`: database, Redis, worker liveness and the queue as JSON, 200 when all are well."""

from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse

from agents.heartbeat import live_workers
from agents.lifecycle import stale_queued_counts


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
        stale = stale_queued_counts()
        checks["queue"] = {
            "ok": not any(stale.values()),
            "queued_longer_than_seconds": settings.CC_QUEUE_SWEEP_SECONDS,
            **stale,
        }
    healthy = all(check["ok"] for check in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "degraded", "mode": settings.CC_MODE, "checks": checks},
        status=200 if healthy else 503,
    )
