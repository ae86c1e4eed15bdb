"""The installed product, not the checkout (OP-6): the wheel in a fresh venv serves every page and runs.

The wheel is built from this checkout, installed with the locked dependencies (uv.lock) into a
new venv outside it, and started from an empty folder without PYTHONPATH, in services mode
(a private redis-server, the test database): `controlcenter serve` and `controlcenter worker`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

from controlcenter.processes import ROOT, services_env
from controlcenter.stack import RedisServer, free_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

UV = Path(sys.executable).with_name("uv")


def _run(*args: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture
def installed(tmp_path) -> Path:
    """A fresh venv holding the locked dependencies and the wheel; returns its bin/ folder."""
    # The sdist, then the wheel from it (as a release is built): MANIFEST.in must carry the assets.
    _run(UV, "build", "--quiet", "-o", tmp_path / "dist", ROOT)
    (wheel,) = (tmp_path / "dist").glob("controlcenter-*.whl")
    requirements = tmp_path / "requirements.txt"
    _run(UV, "export", "--frozen", "--no-emit-project", "--quiet", "-o", requirements, cwd=ROOT)
    _run(UV, "venv", "--quiet", "--python", sys.executable, tmp_path / "venv")
    _run(UV, "pip", "install", "--quiet", "--python", tmp_path / "venv/bin/python", "-r", requirements, wheel)
    return tmp_path / "venv/bin"


@pytest.mark.req("OP-6")
def test_the_wheel_in_a_fresh_venv_serves_every_page_and_runs_a_turn(installed, tmp_path, alice):
    redis = RedisServer(tmp_path)
    here = tmp_path / "site"  # an empty folder outside the checkout, as the image's WORKDIR
    here.mkdir()
    env = services_env(connection.settings_dict["NAME"])
    env.pop("PYTHONPATH")  # the checkout must not be importable: only the wheel runs
    env.update(
        REDIS_URL=redis.url,
        SECRET_KEY="wheel-test-secret-key-0123456789abcdef0123456789",
        CC_VAR_DIR=str(tmp_path / "var"),
        CC_WORKSPACE_ROOT=str(tmp_path / "workspaces"),
        CC_TOOL_AUTO_APPROVE="bash",
    )
    where = _run(installed / "python", "-c", "import controlcenter; print(controlcenter.__file__)", cwd=here)
    assert where.startswith(str(installed.parent)), where
    port = free_port()
    processes = []
    try:
        for args, log in (
            (["worker", "--hostname", f"wheel-{port}@%h"], "worker.log"),
            (["serve", "--port", str(port)], "web.log"),
        ):
            processes.append(
                subprocess.Popen(
                    [installed / "controlcenter", *args],
                    cwd=here,
                    env=env,
                    stdout=(tmp_path / log).open("wb"),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/healthz", timeout=2).json()["checks"]["workers"]["ok"]:
                    break
            time.sleep(0.5)
        else:
            raise AssertionError((tmp_path / "web.log").read_text() + (tmp_path / "worker.log").read_text())

        browser = httpx.Client(base_url=base, timeout=15)
        login = browser.get("/login/")
        assert login.status_code == 200 and "csrfmiddlewaretoken" in login.text, login.text[:500]
        signed_in = browser.post(
            "/login/",
            data={
                "username": "alice",
                "password": "alice-password-1",
                "csrfmiddlewaretoken": browser.cookies["csrftoken"],
            },
        )
        assert signed_in.status_code == 302, signed_in.text[:500]

        token = Token.objects.get_or_create(user=alice)[0].key
        api = httpx.Client(base_url=base, headers={"Authorization": f"Token {token}"}, timeout=15)
        conversation = api.post("/api/conversations/", json={"title": "from the wheel"}).json()
        sent = api.post(
            f"/api/conversations/{conversation['id']}/messages/", json={"text": "please run `echo wheel-ok`"}
        )
        assert sent.status_code == 201, sent.text
        run_id = sent.json()["run"]["id"]
        deadline = time.monotonic() + 60
        while (run := api.get(f"/api/runs/{run_id}/").json())["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.3)
        assert run["status"] == "succeeded", run
        events = api.get(f"/api/runs/{run_id}/events/").json()
        assert any(e["type"] == "tool_result" and "wheel-ok" in str(e["payload"]) for e in events)

        for page in (
            "/",
            f"/conversations/{conversation['id']}/",
            f"/conversations/{conversation['id']}/tree/",
            f"/conversations/{conversation['id']}/context/",
            f"/runs/{run_id}/",
            "/dashboard/",
            "/api/docs/",
            "/static/cc/app.css",
            "/static/cc/conversation.js",
        ):
            response = browser.get(page)
            assert response.status_code == 200, (page, response.status_code, response.text[:300])
        assert "conversation.js" in browser.get(f"/conversations/{conversation['id']}/").text
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        redis.kill()
