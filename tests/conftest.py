"""Shared fixtures: named users (alice, bob) and API clients authenticated as them; a session's
Celery worker and embedded servers; and what each pytest-xdist worker gets for itself."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Generator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from _pytest.nodes import coerce_node_id
from rest_framework.test import APIClient

from controlcenter.processes import WorkerProcess, services_env
from tests.support.embedded import start_embedded_server, stop_embedded_server
from tests.support.factories import UserFactory
from tests.support.timing import scaled, slowness

# --- pytest-xdist: every worker its own Redis database and var folder -----------------
# Django reads its settings before this file is loaded in a worker, so the controller sets them in
# each worker's environment when it starts it. PostgreSQL needs nothing: pytest-django names each
# worker's test database after it (test_<name>_gw0, ...).


def pytest_configure(config) -> None:
    # Measured once, by the controller before any xdist worker starts: every worker inherits the
    # figure from the environment and measures nothing (tests/support/timing.py).
    slowness()


def pytest_terminal_summary(terminalreporter) -> None:
    # At the end, where `-q` (make test) still prints: a limit that ran out is read against it.
    terminalreporter.write_line(f"time limits scaled by {slowness()} (tests/support/timing.py)")


def pytest_xdist_setupnodes(config, specs) -> None:
    redis_url, var_dir = os.environ.get("REDIS_URL"), os.environ.get("CC_VAR_DIR")
    for index, spec in enumerate(specs):
        if redis_url:
            spec.env["REDIS_URL"] = _worker_redis_url(redis_url, index)
        if var_dir:
            spec.env["CC_VAR_DIR"] = str(Path(var_dir) / f"gw{index}")
            # Each session's test database numbers conversations from 1 again: a workspace an
            # earlier session left under the same id handed its files (an MCP server's call log)
            # to the new conversation. These folders are the suite's own.
            shutil.rmtree(Path(var_dir) / f"gw{index}" / "workspaces", ignore_errors=True)


def _worker_redis_url(url: str, index: int) -> str:
    """The database after the controller's for worker `index` (db 1 gives workers 2, 3, ...): the
    Celery broker, channel layer and cache of one worker never see another's keys."""
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0) + 1 + index
    if db > 15:
        raise pytest.UsageError(
            f"REDIS_URL names db {parts.path.strip('/')}: worker {index} would need db {db} of 0-15"
        )
    return urlunsplit(parts._replace(path=f"/{db}"))


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items) -> Generator[None, None, None]:
    """Keep the users of one costly shared fixture on one xdist worker, so that it starts once.

    A module-scoped fixture (a browser, an embedded server, a private Celery worker) groups its
    module; a session-scoped one defined in a test module (the llama.cpp server) groups its users.
    The session fixtures of this file (the Celery worker) start once per worker, as they must.

    `--dist loadgroup` schedules by the `@group` suffix of a node id. pytest-xdist 3.8 writes that
    suffix to `item._nodeid`, which pytest 9 no longer reads (the id is `item._id`), so every test
    was its own unit: a module's tests spread over all workers, and each worker started the
    module's browser and server again. The suffix is written here, where pytest reads it (under
    `--dist loadgroup` only, so that a plain run keeps plain ids).

    Schemathesis gives every API operation's item the same node id (its name carries the
    operation), which the scheduler would take for one test; each item gets its name as its id.
    """
    for item in items:
        module, _, name = item.nodeid.rpartition("::")
        groups: set[str] = set()
        for definitions in item._fixtureinfo.name2fixturedefs.values():
            fixture = definitions[-1]
            if fixture.scope == "module":
                groups.add(item.module.__name__)
            elif fixture.scope in ("package", "session") and fixture.baseid not in ("", "tests"):
                groups.add(f"{fixture.baseid}::{fixture.argname}")
        suffix = f"@{'_'.join(sorted(groups))}" if groups and getattr(config.option, "loadgroup", False) else ""
        if name != item.name or suffix:
            item._id = coerce_node_id(f"{module}::{item.name}{suffix}")
    yield
    # pytest-xdist hands out the groups first, most tests first (its default --loadscope-reorder),
    # then single tests in collection order (after pytest-django has put transactional tests last).
    # The longest units (a 2-minute soak that mostly waits, the local model's group, a 30 s backoff
    # test) went out late and ended the run alone: marked, a single test leads the single tests and
    # a group's long test leads its group, so their time overlaps the rest of the suite.
    items.sort(key=lambda item: item.get_closest_marker("starts_first") is None)
    # pytest-timeout's caps follow the machine like every other limit (tests/support/timing.py).
    option = config.getoption("timeout", None)
    default = float(option if option is not None else config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        written = (marker.args[0] if marker.args else marker.kwargs.get("timeout")) if marker else None
        limit = float(written) if written is not None else default
        if limit:
            item.add_marker(pytest.mark.timeout(scaled(limit)), append=False)


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings):
    """A real hash costs 0.4 s a user and hundreds of tests create one; no test is about the hash itself.

    Servers started as subprocesses keep the real hashers and still verify these hashes.
    """
    settings.PASSWORD_HASHERS = ["tests.support.hashers.OneIterationPBKDF2PasswordHasher"]


@pytest.fixture(autouse=True)
def _no_receive_left_on_a_closed_loop():
    """A test's websocket consumers run on that test's own event loop (async_to_sync).

    channels_redis keeps one cleanup lock per process-wide channel. A receive cancelled while it
    waits for that lock (the test's loop closing under it) never gives its place back, so the lock
    outlives the loop, bound to it, and the next test's consumer fails on it ("is bound to a
    different event loop"). A server has one loop for its life, so this is a test-only hazard:
    a layer left in that state is dropped, and the next test gets a fresh one.
    """
    yield
    from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers

    layer = channel_layers.backends.get(DEFAULT_CHANNEL_LAYER)
    locks = getattr(layer, "receive_clean_locks", None)
    if getattr(layer, "receive_count", 0) or getattr(layer, "receive_cleaners", None) or (locks and locks.wait_counts):
        del channel_layers.backends[DEFAULT_CHANNEL_LAYER]


@pytest.fixture
def alice(db):
    return UserFactory(username="alice", password="alice-password-1")


@pytest.fixture
def bob(db):
    return UserFactory(username="bob", password="bob-password-1")


@pytest.fixture
def alice_api(alice) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


@pytest.fixture
def bob_api(bob) -> APIClient:
    client = APIClient()
    client.force_authenticate(bob)
    return client


# --- real processes --------------------------------------------------------------


@pytest.fixture(scope="session")
def celery_worker_process(django_db_setup, django_db_blocker, tmp_path_factory):
    from django.conf import settings
    from django.db import connection

    if settings.CC_MODE != "services":
        pytest.fail("integration tests need DATABASE_URL and REDIS_URL (the README's test command sets them)")
    import redis

    # Stale tasks from an earlier, interrupted run would be claimed by this worker.
    redis.Redis.from_url(settings.REDIS_URL).flushdb()
    with django_db_blocker.unblock():
        name = connection.settings_dict["NAME"]
    worker = WorkerProcess(
        services_env(name), f"test-{uuid.uuid4().hex[:8]}@%h", tmp_path_factory.mktemp("worker") / "worker.log"
    )
    worker.wait_ready(timeout=60)  # a cap, not a wait: a busy shared machine can take half a minute
    yield worker
    worker.stop()


@pytest.fixture
def inprocess_runs(settings):
    """Runs this test executes itself (`run_execute` in the test process): what a send enqueues
    goes to a queue no worker consumes, so a session worker started by an earlier test on this
    xdist process cannot claim the run first (seen under load: the test's own call then found the
    run taken and returned with it still running)."""
    settings.CC_RUN_QUEUE = f"in-process-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def live_worker_name():
    """A worker name with a heartbeat: turns this test runs in-process are seen alive by the
    session's real worker, which would otherwise reap them."""
    from agents import heartbeat

    name = f"test-inprocess-{uuid.uuid4().hex[:8]}"
    stop = heartbeat.start_heartbeat(name, on_complete=lambda live: None)
    yield name
    stop.set()


# --- the embedded server ----------------------------------------------------------


@pytest.fixture
def embedded_server(tmp_path):
    """A fresh embedded server (SQLite, in-process worker) for one test; tests seed its database
    through `tmp_path / "var"`."""
    server, base, log_path = start_embedded_server(tmp_path)
    yield base, log_path
    stop_embedded_server(server)


@pytest.fixture(scope="module")
def embedded_server_module(tmp_path_factory):
    """One embedded server for a module's browser journeys, each in its own conversation; seed it
    through the log's folder (`log.parent / "var"`)."""
    server, base, log_path = start_embedded_server(tmp_path_factory.mktemp("embedded"))
    yield base, log_path
    stop_embedded_server(server)
