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

import uuid  # noqa: E402

from controlcenter.processes import WorkerProcess, services_env  # noqa: E402


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
