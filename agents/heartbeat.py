"""Worker liveness: each Celery worker refreshes a short-lived Redis key."""

from __future__ import annotations

import contextlib
import threading

import redis
from django.conf import settings

KEY_PREFIX = "cc:worker:"
TTL_SECONDS = 15
INTERVAL_SECONDS = 5


def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def beat_forever(hostname: str, stop: threading.Event) -> None:
    client = _client()
    while not stop.is_set():
        # Redis being down is what /healthz reports; keep trying.
        with contextlib.suppress(redis.RedisError):
            client.set(KEY_PREFIX + hostname, "1", ex=TTL_SECONDS)
        stop.wait(INTERVAL_SECONDS)


def start_heartbeat(hostname: str) -> threading.Event:
    stop = threading.Event()
    threading.Thread(target=beat_forever, args=(hostname, stop), daemon=True, name="cc-heartbeat").start()
    return stop


def live_workers() -> list[str]:
    client = _client()
    return sorted(key.decode()[len(KEY_PREFIX) :] for key in client.scan_iter(match=KEY_PREFIX + "*"))
