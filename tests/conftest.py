"""Shared fixtures: named users (alice, bob) and API clients authenticated as them."""

from __future__ import annotations

import contextlib
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


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user(username="alice", password="alice-password-1")


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user(username="bob", password="bob-password-1")


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


@contextlib.contextmanager
def _embedded(directory: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    # Keep any PYTHONPATH the caller set (after this tree, which must win).
    pythonpath = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(CC_VAR_DIR=str(directory / "var"), CC_ADMIN_PASSWORD=EMBEDDED_ADMIN_PASSWORD, PYTHONPATH=pythonpath)
    controlcenter = [sys.executable, "-m", "controlcenter.cli"]
    setup = subprocess.run([*controlcenter, "manage", "bootstrap"], env=env, cwd=ROOT, capture_output=True, text=True)
    assert setup.returncode == 0, setup.stderr
    port = _free_port()
    log = (directory / "server.log").open("wb")
    server = subprocess.Popen(
        [*controlcenter, "serve", "--port", str(port)], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        server.kill()
        pytest.fail((directory / "server.log").read_text())
    try:
        yield base, directory / "server.log"
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


@pytest.fixture
def embedded_server(tmp_path):
    with _embedded(tmp_path) as started:
        yield started


@pytest.fixture(scope="module")
def embedded_server_module(tmp_path_factory):
    """One embedded server for a module's browser journeys (each works in its own conversation)."""
    with _embedded(tmp_path_factory.mktemp("embedded")) as started:
        yield started
