"""The embedded server (SQLite, in-process worker) as a subprocess, for tests that drive it from outside."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from controlcenter.stack import free_port

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_ADMIN_PASSWORD = "embedded-pass-1"


def embedded_env(var: Path) -> dict[str, str]:
    """This environment without the services' variables, with its own var folder and this tree first on
    PYTHONPATH (any PYTHONPATH the caller set stays after it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    pythonpath = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(CC_VAR_DIR=str(var), PYTHONPATH=pythonpath)
    return env


_template: Path | None = None


def _bootstrapped_var(env: dict[str, str]) -> Path:
    """A var folder `manage bootstrap` made, once per test process; each server gets a copy.

    Bootstrap (migrating a new SQLite database, the admin's password hash) costs seconds of CPU,
    and two dozen tests start an embedded server. What it makes is the same for each of them.
    """
    global _template
    if _template is None:
        folder = Path(tempfile.mkdtemp(prefix="cc-embedded-template-"))
        atexit.register(shutil.rmtree, folder, True)
        template = folder / "var"
        command = [sys.executable, "-m", "controlcenter.cli", "manage", "bootstrap"]
        setup = subprocess.run(
            command, env=env | {"CC_VAR_DIR": str(template)}, cwd=ROOT, capture_output=True, text=True
        )
        assert setup.returncode == 0, setup.stderr
        _template = template
    return _template


def start_embedded_server(folder: Path) -> tuple[subprocess.Popen, str, Path]:
    """A bootstrapped `folder / "var"`, served on a free port: (process, base URL, log path)."""
    # Its own temporary folder, so a test can see what the server spools to disk (SB-5).
    (folder / "tmp").mkdir(exist_ok=True)
    env = embedded_env(folder / "var") | {"CC_ADMIN_PASSWORD": EMBEDDED_ADMIN_PASSWORD, "TMPDIR": str(folder / "tmp")}
    controlcenter = [sys.executable, "-m", "controlcenter.cli"]
    shutil.copytree(_bootstrapped_var(env), folder / "var")
    port = free_port()
    log_path = folder / "server.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [*controlcenter, "serve", "--port", str(port)], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # a cap, not a wait: a loaded CI host can take a minute to import and bind
    try:
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    return server, base, log_path
            except httpx.HTTPError:
                time.sleep(0.1)
    except BaseException:
        # pytest-timeout interrupting the wait: the server must not outlive the test (three were found
        # still serving an hour after a loaded run).
        server.kill()
        raise
    server.kill()
    pytest.fail(log_path.read_text())


def stop_embedded_server(server: subprocess.Popen) -> None:
    server.terminate()
    server.wait(timeout=10)
