"""Fixtures shared by the agents tests."""

from __future__ import annotations

import threading
import uuid

import pytest


@pytest.fixture
def parent_worker(settings):
    """A worker name for parent runs executed in this process, kept alive in the heartbeat registry.

    A parent waits for its children; a real worker's reaper would otherwise take a run of
    an unknown worker for dead once it has run longer than the heartbeat TTL (15 s).
    """
    import redis

    from agents import heartbeat

    name = f"test-parent-{uuid.uuid4().hex[:6]}@host"
    client = redis.Redis.from_url(settings.REDIS_URL)
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            heartbeat.beat(client, name)
            stop.wait(heartbeat.interval_seconds())

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    yield name
    stop.set()
    thread.join()
    client.delete(heartbeat.KEY_PREFIX + name)
