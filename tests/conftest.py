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
