"""The load benchmark at a reduced size, run by the normal test command (bench/load.py for the full size).

8 concurrent runs on 2 workers, 10 API clients for 5 s, 10 websocket clients watching one run, served by
two web processes (CC_WEB_WORKERS=2): all runs complete with one intact reply each, no API request fails,
every watcher receives every event (RN-1). Half the size it had: the suite shares two
cores, and this test alone took 34 s of CPU; `bench load` runs the full size.
"""

from __future__ import annotations

import pytest
from django.db import connection

from bench.load import measure
from tests.support.timing import slowness

pytestmark = [
    pytest.mark.load,
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
]


@pytest.mark.req("RN-1")
@pytest.mark.req("RN-3")
def test_reduced_load_completes_every_run_fails_no_request_and_reaches_every_watcher(tmp_path):
    figures = measure(
        database_name=connection.settings_dict["NAME"],
        workdir=tmp_path,
        runs=8,
        workers=2,
        worker_concurrency=4,
        clients=10,
        duration=5,
        watchers=10,
        first_token_ms=100,
        delta_ms=5,
        web_workers=2,
    )
    runs, api, watch = figures["runs"], figures["api"], figures["watch"]
    assert runs["succeeded"] == runs["intact_conversations"] == 8 and runs["lost"] == 0, runs
    # Throughput is the machine's: 100 requests in 5 s on the reference machine (tests/support/timing.py).
    assert api["errors"] == 0 and api["requests"] > 100 / slowness(), (api["error_statuses"], api)
    assert api["runs_posted"] >= 10 and api["runs_lost"] == 0, api
    assert watch["clients_with_every_event"] == 10 and watch["events_missing"] == 0, watch
    # The reply reached the watchers as a stream: deltas are coalesced by time (0.1 s), so how many
    # depends on the machine's load, but never one block.
    assert watch["text_deltas_in_run"] >= 2, watch
