"""`manage.py check --deploy` is clean with the production environment docker-compose.yml and the
README document, and the HTTPS settings behave as they say (RN-3)."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from django.db import connection

from controlcenter.processes import services_env

ROOT = Path(__file__).resolve().parents[2]
OURS = ("CC_", "DATABASE_", "REDIS_", "SECRET_", "DEBUG", "ALLOWED_", "CSRF_", "ANTHROPIC_", "OPENAI_", "DJANGO_")


def _production_env(tmp_path: Path, dotenv: dict[str, str]) -> dict[str, str]:
    """The web container's environment: compose's `x-app` block with `.env` substituted as compose does."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    block = compose["x-app"]["environment"]

    def substitute(value: str) -> str:
        def one(match: re.Match) -> str:
            name, op, default = match.group(1), match.group(2), match.group(3) or ""
            if name in dotenv and (dotenv[name] or op != ":-"):
                return dotenv[name]
            assert op != ":?", f"compose needs {name} in .env"
            return default

        return re.sub(r"\$\{(\w+)(:-|:\?)?([^}]*)\}", one, str(value))

    env = {key: value for key, value in os.environ.items() if not key.startswith(OURS)}
    env.update({name: substitute(value) for name, value in block.items()})
    env.update({name: value for name, value in dotenv.items() if name not in block})
    env["CC_VAR_DIR"] = str(tmp_path / "var")
    return {name: value for name, value in env.items() if value != ""}


def _readme_production(secret_key: str) -> dict[str, str]:
    """What the README's production paragraph tells to put in `.env`."""
    readme = (ROOT / "README.md").read_text()
    for name in ("SECRET_KEY", "ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS", "CC_HTTPS=on", "CC_TRUST_X_FORWARDED_PROTO=on"):
        assert f"`{name}" in readme, name
    return {
        "SECRET_KEY": secret_key,
        "ALLOWED_HOSTS": "cc.example.com",
        "CSRF_TRUSTED_ORIGINS": "https://cc.example.com",
        "CC_HTTPS": "on",
        "CC_TRUST_X_FORWARDED_PROTO": "on",
    }


def _check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.req("RN-3")
def test_check_deploy_is_clean_with_the_documented_production_environment(tmp_path):
    env = _production_env(tmp_path, _readme_production(secrets.token_urlsafe(50)))
    assert env["DEBUG"] == "off" and env["DATABASE_URL"].startswith("postgres://")
    result = _check_deploy(env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout


@pytest.mark.req("RN-3")
def test_check_deploy_is_clean_with_the_secret_key_read_from_a_file(tmp_path):
    key_file = tmp_path / "secret_key"
    key_file.write_text(secrets.token_urlsafe(50) + "\n")
    dotenv = _readme_production("")
    dotenv.pop("SECRET_KEY")
    env = _production_env(tmp_path, {**dotenv, "SECRET_KEY": "unused"})
    del env["SECRET_KEY"]
    env["SECRET_KEY_FILE"] = str(key_file)
    result = _check_deploy(env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (tmp_path / "var" / "secret_key").exists()  # the file's key was used, none generated


@pytest.mark.req("RN-3")
def test_check_deploy_names_what_is_missing_without_https_debug_off_or_a_strong_key(tmp_path):
    dotenv = {**_readme_production("short"), "CC_HTTPS": "off"}
    env = _production_env(tmp_path, dotenv)
    env["DEBUG"] = "on"
    result = _check_deploy(env)
    assert result.returncode != 0
    for check in ("W004", "W008", "W009", "W012", "W016", "W018"):
        assert f"security.{check}" in result.stderr + result.stdout, check


@pytest.mark.req("RN-3")
def test_with_https_on_plain_http_is_redirected_cookies_are_secure_and_the_health_check_is_not(
    tmp_path, django_db_setup, django_db_blocker
):
    env = _production_env(tmp_path, _readme_production(secrets.token_urlsafe(50)))
    # Real services for the health check instead of compose's host names: this worker's migrated
    # test database (DATABASE_URL names the base database, which the suite never migrates) and its Redis.
    with django_db_blocker.unblock():
        services = services_env(connection.settings_dict["NAME"])
    env["DATABASE_URL"], env["REDIS_URL"] = services["DATABASE_URL"], services["REDIS_URL"]
    probe = """
import json
from django.conf import settings
from django.test import Client
client = Client(HTTP_HOST="cc.example.com")
plain = client.get("/login/")
proxied = client.get("/login/", HTTP_X_FORWARDED_PROTO="https")
health = client.get("/healthz")
print(json.dumps({
    "plain": [plain.status_code, plain.get("Location")],
    "proxied": [proxied.status_code, proxied.get("Strict-Transport-Security")],
    "csrf_cookie_secure": proxied.cookies["csrftoken"]["secure"] if "csrftoken" in proxied.cookies else None,
    "health": [health.status_code, health.json()["mode"]],
    "session_cookie_secure": settings.SESSION_COOKIE_SECURE,
}))
"""
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["plain"] == [301, "https://cc.example.com/login/"]
    assert seen["proxied"] == [200, "max-age=31536000; includeSubDomains; preload"]
    assert seen["csrf_cookie_secure"] is True and seen["session_cookie_secure"] is True
    # Answered over plain HTTP, not redirected (503 here only because no worker is running).
    assert seen["health"] in ([200, "services"], [503, "services"])
