"""Weak passwords are refused where a password is set: the admin's add-user form (SB-5)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.mark.req("SB-5")
@pytest.mark.parametrize("weak", ["password", "12345678", "carol-the-user"])
def test_the_admin_refuses_a_weak_password_and_creates_no_user(weak):
    admin = User.objects.create_superuser("root-admin", password="a-Long-unusual-passphrase-9")
    client = Client()
    client.force_login(admin)
    response = client.post(
        "/admin/auth/user/add/", {"username": "carol-the-user", "password1": weak, "password2": weak}
    )
    assert response.status_code == 200  # the form again, with its errors
    errors = " ".join(str(e) for e in response.context["adminform"].form.errors.values())
    assert "too common" in errors or "entirely numeric" in errors or "too similar" in errors, errors
    assert not User.objects.filter(username="carol-the-user").exists()


@pytest.mark.req("SB-5")
def test_the_admin_accepts_a_strong_password():
    admin = User.objects.create_superuser("root-admin", password="a-Long-unusual-passphrase-9")
    client = Client()
    client.force_login(admin)
    strong = "vivid-Otter-walks-42-miles"
    response = client.post("/admin/auth/user/add/", {"username": "carol", "password1": strong, "password2": strong})
    assert response.status_code == 302
    assert User.objects.get(username="carol").check_password(strong)
