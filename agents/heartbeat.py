"""Worker liveness: each Celery worker refreshes a short-lived Redis key."""

from __future__ import annotations

import contextlib
import threading

import redis
from django.conf import settings

KEY_PREFIX = "cc:worker:"


def interval_seconds() -> float:
    return settings.CC_WORKER_HEARTBEAT_SECONDS


def ttl_seconds() -> float:
    # Three missed beats before a worker counts as gone: one slow beat is not a death.
    return 3 * settings.CC_WORKER_HEARTBEAT_SECONDS


def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def beat_forever(hostname: str, stop: threading.Event) -> None:
    """Refresh this worker's key, and fail the runs of workers whose keys expired (CH-5)."""
    from agents.services import runs_reap_orphans

    client = _client()
    while not stop.is_set():
        # Redis being down is what /healthz reports; keep trying.
        with contextlib.suppress(redis.RedisError):
            client.set(KEY_PREFIX + hostname, "1", px=int(ttl_seconds() * 1000))
            runs_reap_orphans(live=live_workers())
        stop.wait(interval_seconds())


def start_heartbeat(hostname: str) -> threading.Event:
    stop = threading.Event()
    threading.Thread(target=beat_forever, args=(hostname, stop), daemon=True, name="cc-heartbeat").start()
    return stop


def live_workers() -> list[str]:
    client = _client()
    return sorted(key.decode()[len(KEY_PREFIX) :] for key in client.scan_iter(match=KEY_PREFIX + "*"))
