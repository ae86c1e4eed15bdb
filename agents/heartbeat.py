"""Worker liveness: each Celery worker refreshes a short-lived Redis key, and vouches in the
database for the runs it holds (`agents.lifecycle.runs_vouch`)."""

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


def beat_forever(hostname: str, stop: threading.Event, reap_due: threading.Event) -> None:
    """Refresh this worker's key, and signal `reap_due` once the live set is complete (CH-5).

    This thread only talks to Redis. The reaper's database work runs on its own thread: a reap
    pass waiting on a slow or locked database once delayed the beat past the TTL under load, and
    other workers then took this live worker for dead and failed its running turn.
    """
    client = redis_client()
    while not stop.is_set():
        try:
            if beat(client, hostname):
                reap_due.set()
        except redis.RedisError:
            pass  # Redis being down is what /healthz reports; keep trying.
        stop.wait(interval_seconds())


def reap_when_due(
    stop: threading.Event,
    reap_due: threading.Event,
    on_complete: Callable[[list[str]], object],
    on_tick: Callable[[], object],
) -> None:
    """Each interval `on_tick` (the worker vouches for its runs in the database); and each time a
    beat says it is due, hand the live set to `on_complete` (the reaper and the sweep)."""
    while not stop.is_set():
        due = reap_due.wait(interval_seconds())
        try:
            on_tick()
            if not due:
                continue
            reap_due.clear()
            on_complete(live_workers())
        except redis.RedisError:
            pass
        except DatabaseError:
            # A dropped connection must not end the reaper; the next pass reconnects.
            logger.warning("reaper: database error; reconnecting on the next pass", exc_info=True)
            connection.close()


def beat(client: redis.Redis, hostname: str) -> bool:
    """Refresh this worker's key; True when the live set is complete enough to reap by."""
    client.set(KEY_PREFIX + hostname, "1", px=int(ttl_seconds() * 1000))
    now = float(client.time()[0])
    client.set(EPOCH_KEY, now, nx=True)
    return now - float(client.get(EPOCH_KEY) or now) >= ttl_seconds()


def start_heartbeat(
    hostname: str, on_complete: Callable[[list[str]], object], on_tick: Callable[[], object] = lambda: None
) -> threading.Event:
    stop, reap_due = threading.Event(), threading.Event()
    threading.Thread(target=beat_forever, args=(hostname, stop, reap_due), daemon=True, name="cc-heartbeat").start()
    threading.Thread(
        target=reap_when_due, args=(stop, reap_due, on_complete, on_tick), daemon=True, name="cc-reaper"
    ).start()
    return stop


def live_workers() -> list[str]:
    client = redis_client()
    return sorted(key.decode()[len(KEY_PREFIX) :] for key in client.scan_iter(match=KEY_PREFIX + "*"))
