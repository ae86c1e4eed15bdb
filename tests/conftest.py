"""Shared fixtures: named users (alice, bob) and API clients authenticated as them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from rest_framework.test import APIClient

from controlcenter.processes import WorkerProcess, services_env
from tests.support.factories import UserFactory


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings):
    """A real hash costs 0.4 s a user and hundreds of tests create one; no test is about the hash itself.

    Servers started as subprocesses keep the real hashers and still verify these hashes.
    """
    settings.PASSWORD_HASHERS = ["tests.support.hashers.OneIterationPBKDF2PasswordHasher"]


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
    worker.wait_ready()
    yield worker
    worker.stop()


# --- the embedded server ----------------------------------------------------------


ROOT = Path(__file__).resolve().parent.parent
EMBEDDED_ADMIN_PASSWORD = "embedded-pass-1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_embedded_server(var: Path) -> tuple[subprocess.Popen, str, Path]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    # Keep any PYTHONPATH the caller set (after this tree, which must win).
    pythonpath = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    # Its own temporary folder, so a test can see what the server spools to disk (SB-5).
    (var / "tmp").mkdir(exist_ok=True)
    env.update(
        CC_VAR_DIR=str(var / "var"),
        CC_ADMIN_PASSWORD=EMBEDDED_ADMIN_PASSWORD,
        PYTHONPATH=pythonpath,
        TMPDIR=str(var / "tmp"),
    )
    controlcenter = [sys.executable, "-m", "controlcenter.cli"]
    setup = subprocess.run([*controlcenter, "manage", "bootstrap"], env=env, cwd=ROOT, capture_output=True, text=True)
    assert setup.returncode == 0, setup.stderr
    port = _free_port()
    log_path = var / "server.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [*controlcenter, "serve", "--port", str(port)], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # a loaded CI host can take a minute to import and bind
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return server, base, log_path
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    pytest.fail(log_path.read_text())


def _stop(server: subprocess.Popen) -> None:
    server.terminate()
    server.wait(timeout=10)


@pytest.fixture
def embedded_server(tmp_path):
    """A fresh embedded server (SQLite, in-process worker) for one test; tests seed its database
    through `tmp_path / "var"`."""
    server, base, log_path = _start_embedded_server(tmp_path)
    yield base, log_path
    _stop(server)


@pytest.fixture(scope="module")
def embedded_server_module(tmp_path_factory):
    """One embedded server for a module's browser journeys, each in its own conversation; seed it
    through the log's folder (`log.parent / "var"`)."""
    server, base, log_path = _start_embedded_server(tmp_path_factory.mktemp("embedded"))
    yield base, log_path
    _stop(server)
