"""The heartbeat says "alive" on time even while this worker's reaper waits on the database (CH-5)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis

from agents import heartbeat
from tests.support.waiting import wait_until


@pytest.mark.req("CH-5")
def test_a_reap_pass_stuck_on_the_database_never_delays_the_beat(settings):
    settings.CC_WORKER_HEARTBEAT_SECONDS = 1  # TTL 3 s
    client = redis.Redis.from_url(settings.REDIS_URL)
    name = f"beat-{uuid.uuid4().hex[:8]}@host"
    released, passes = threading.Event(), []

    def stuck_reaper(live: list[str]) -> None:
        passes.append(live)
        released.wait(10)  # a pass waiting on a locked row, far longer than the TTL

    stop = heartbeat.start_heartbeat(name, on_complete=stuck_reaper)
    try:
        wait_until(lambda: client.exists(heartbeat.KEY_PREFIX + name), 5, "the first beat")
        # The first pass comes once the registry is a TTL old (at most 3 s here); then it hangs.
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            assert client.exists(heartbeat.KEY_PREFIX + name), "the worker looked dead while its reaper waited"
            time.sleep(0.2)
        assert passes and name in passes[0]  # the reaper ran, and is still stuck in its first pass
        assert len(passes) == 1
    finally:
        released.set()
        stop.set()
        client.delete(heartbeat.KEY_PREFIX + name)
