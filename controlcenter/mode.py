"""Which mode the process runs in, said once at start in one line."""

from __future__ import annotations

import logging

from django.conf import settings

logger = logging.getLogger("controlcenter")


def describe_mode() -> str:
    if settings.CC_MODE == "embedded":
        return (
            f"Control Center: embedded mode (SQLite at {settings.DATABASES['default']['NAME']}, "
            f"in-memory channel layer, in-process worker thread, provider {settings.CC_PROVIDER})"
        )
    db = settings.DATABASES["default"]
    return (
        f"Control Center: services mode (PostgreSQL {db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}, "
        f"Redis broker and channel layer, Celery workers, provider {settings.CC_PROVIDER})"
    )


def log_mode() -> None:
    logger.info(describe_mode())
