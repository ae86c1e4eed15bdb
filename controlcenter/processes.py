"""Start real Control Center processes (a Celery worker) for tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

ROOT = Path(__file__).resolve().parent.parent


def services_env(database_name: str) -> dict[str, str]:
    """The environment a child process needs to share this process's database and Redis."""
    env = dict(os.environ)
    db = settings.DATABASES["default"]
    host = db["HOST"] or "127.0.0.1"
    env["DATABASE_URL"] = f"postgres://{db['USER']}:{db['PASSWORD']}@{host}:{db['PORT'] or 5432}/{database_name}"
    if settings.REDIS_URL is None:
        raise ImproperlyConfigured("A worker shares this process's Redis, and REDIS_URL is not set.")
    env["REDIS_URL"] = settings.REDIS_URL
    # This checkout first; entries the caller already had stay after it.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


class ProcessGroup:
    """A child started in its own process group (`start_new_session`), so it can be killed whole."""

    process: subprocess.Popen[bytes]
    _log: Any

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self._log.close()

    def stop(self) -> None:
        stop_together([self])

    def _ask_to_stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it ended since poll()
                os.killpg(self.process.pid, signal.SIGTERM)

    def _wait_stopped(self, deadline: float) -> None:
        try:
            self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            return
        self._log.close()


def stop_together(processes: list[ProcessGroup], grace_seconds: float = 15) -> None:
    """SIGTERM every process first, then wait for all within one grace period (then SIGKILL):
    a web server and two workers each take a second or more to shut down, and they can do it at once."""
    for process in processes:
        process._ask_to_stop()
    deadline = time.monotonic() + grace_seconds
    for process in processes:
        process._wait_stopped(deadline)


class WorkerProcess(ProcessGroup):
    """A real Celery worker (not eager), started as `controlcenter worker`."""

    def __init__(self, env: dict[str, str], hostname: str, log_path: Path, concurrency: int = 2) -> None:
        self.env = env
        self.hostname = hostname
        self.log_path = log_path
        self.concurrency = concurrency
        self.start()

    def start(self) -> None:
        """Start (or start again, after stop or kill) with the same settings; the log starts afresh."""
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            # The command an operator runs: it consumes the env's CC_RUN_QUEUE.
            [
                sys.executable, "-m", "controlcenter.cli", "worker",
                f"--concurrency={self.concurrency}", f"--hostname={self.hostname}",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def wait_ready(self, timeout: float = 90) -> None:
        """Return once the worker is ready; else kill it (no caller's teardown would) and raise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.kill()
                raise RuntimeError(f"worker exited early:\n{self.log_path.read_text()}")
            if b"ready." in self.log_path.read_bytes():
                return
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"worker not ready after {timeout}s:\n{self.log_path.read_text()}")
