"""Worker liveness: each Celery worker refreshes a short-lived Redis key."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connection

logger = logging.getLogger(__name__)

KEY_PREFIX = "cc:worker:"
# When the registry of live workers began (Redis server time). A Redis restart loses every
# worker's key at once; until each live worker has had a full TTL to beat again, "no key"
# does not mean "dead", so nobody reaps before this is one TTL old.
EPOCH_KEY = "cc:workers:epoch"


def interval_seconds() -> float:
    return settings.CC_WORKER_HEARTBEAT_SECONDS


def ttl_seconds() -> float:
    # Three missed beats before a worker counts as gone: one slow beat is not a death.
    return 3 * settings.CC_WORKER_HEARTBEAT_SECONDS


def redis_client() -> redis.Redis:
    """A short-timeout client of the broker's Redis: liveness, queue marks, reachability."""
    if settings.REDIS_URL is None:
        raise ImproperlyConfigured("Redis is used in services mode only, and REDIS_URL is not set.")
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def beat_forever(hostname: str, stop: threading.Event, on_complete: Callable[[list[str]], object]) -> None:
    """Refresh this worker's key; hand the live set to `on_complete` (the reaper, CH-5) once it is complete."""
    client = redis_client()
    while not stop.is_set():
        try:
            if beat(client, hostname):
                on_complete(live_workers())
        except redis.RedisError:
            pass  # Redis being down is what /healthz reports; keep trying.
        except DatabaseError:
            # A dropped connection must not end the heartbeat (the worker would look dead).
            logger.warning("heartbeat: database error; reconnecting on the next beat", exc_info=True)
            connection.close()
        stop.wait(interval_seconds())


def beat(client: redis.Redis, hostname: str) -> bool:
    """Refresh this worker's key; True when the live set is complete enough to reap by."""
    client.set(KEY_PREFIX + hostname, "1", px=int(ttl_seconds() * 1000))
    now = float(client.time()[0])
    client.set(EPOCH_KEY, now, nx=True)
    return now - float(client.get(EPOCH_KEY) or now) >= ttl_seconds()


def start_heartbeat(hostname: str, on_complete: Callable[[list[str]], object]) -> threading.Event:
    stop = threading.Event()
    threading.Thread(target=beat_forever, args=(hostname, stop, on_complete), daemon=True, name="cc-heartbeat").start()
    return stop


def live_workers() -> list[str]:
    client = redis_client()
    return sorted(key.decode()[len(KEY_PREFIX) :] for key in client.scan_iter(match=KEY_PREFIX + "*"))
