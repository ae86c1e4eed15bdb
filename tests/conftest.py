"""Shared fixtures: named users (alice, bob) and API clients authenticated as them."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient


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

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def services_env(database_name: str) -> dict[str, str]:
    """The environment a child process needs to share this test run's database and Redis."""
    from django.conf import settings

    env = dict(os.environ)
    db = settings.DATABASES["default"]
    env["DATABASE_URL"] = (
        f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{database_name}"
    )
    env["REDIS_URL"] = settings.REDIS_URL
    env["PYTHONPATH"] = str(ROOT)
    return env


class WorkerProcess:
    """A real Celery worker (not eager) on the test database and the real Redis."""

    def __init__(self, env: dict[str, str], hostname: str, log_path: Path) -> None:
        self.hostname = hostname
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "controlcenter",
                "worker",
                "--loglevel=INFO",
                "--concurrency=2",
                "--pool=threads",
                f"--hostname={hostname}",
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited early:\n{self.log_path.read_text()}")
            if b"ready." in self.log_path.read_bytes():
                return
            time.sleep(0.1)
        raise RuntimeError(f"worker not ready after {timeout}s:\n{self.log_path.read_text()}")

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


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
