"""`/healthz`: database, Redis and worker liveness as JSON, 200 when all are up."""

from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse

from agents.heartbeat import live_workers


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
    healthy = all(check["ok"] for check in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "degraded", "mode": settings.CC_MODE, "checks": checks},
        status=200 if healthy else 503,
    )
