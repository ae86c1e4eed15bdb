"""A private Control Center stack of real processes for fault tests and load benchmarks.

Its own `redis-server` on a free loopback port (so restarting it never touches the
machine's shared Redis), web servers (uvicorn) and Celery workers pointed at it, all
sharing one PostgreSQL database. Every process gets its own `PGAPPNAME`, so a test can
find exactly that process's database backends in `pg_stat_activity`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

import httpx

from controlcenter.processes import ROOT, ProcessGroup, WorkerProcess, services_env, stop_together

# Ports for the servers this module starts come from below the kernel's ephemeral range
# (32768-60999 on Linux). A port taken with bind(0) and released is free for seconds before the
# server binds it, and bind(0) anywhere, or any outgoing connection, can take it meanwhile: a
# test's health check then reached another test's server, on another database. Below the range
# nothing takes a port by chance; a lock file per port, held by the process that chose it, keeps
# concurrent processes (pytest-xdist workers, benchmarks) from choosing the same one.
PORT_RANGE = range(20000, 32000)
# One folder per user: another user's lock files are not writable.
PORT_LOCKS = Path(tempfile.gettempdir()) / f"controlcenter-ports-{os.getuid()}"
# A port stays claimed while its server may restart on it (a Redis brought back after a
# fault); the oldest claims are let go, their servers long gone or still bound.
CLAIMS_KEPT = 256
_claims: dict[int, IO[str]] = {}
_claims_lock = threading.Lock()


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port no other process of this machine is using or about to use."""
    PORT_LOCKS.mkdir(exist_ok=True)
    start = random.randrange(len(PORT_RANGE))
    with _claims_lock:
        for step in range(len(PORT_RANGE)):
            port = PORT_RANGE[(start + step) % len(PORT_RANGE)]
            if port in _claims:
                continue
            claim = (PORT_LOCKS / str(port)).open("a")
            try:
                fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                claim.close()
                continue
            if not _bindable(port):
                claim.close()
                continue
            _claims[port] = claim
            while len(_claims) > CLAIMS_KEPT:
                _claims.pop(next(iter(_claims))).close()
            return port
    raise RuntimeError(f"no free port in {PORT_RANGE.start}-{PORT_RANGE.stop - 1}")


def group_cpu_seconds(pgid: int) -> float:
    """CPU time (user + system) used so far by the live processes of one process group.

    The server's own cost, whatever else the shared host is doing: on a busy machine a
    throughput figure measures the neighbours, CPU seconds per request measure the code.
    """
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


class RedisServer:
    """A throwaway redis-server with no persistence: a restart loses everything, as a crash would."""

    def __init__(self, log_dir: Path, port: int | None = None, password: str | None = None) -> None:
        self.port = port or free_port()
        self.log_dir = log_dir
        self.password = password
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.log_dir), *(["--requirepass", self.password] if self.password else [])],
            stdout=(self.log_dir / f"redis-{self.port}.log").open("ab"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn:
                auth = f"AUTH {self.password}\r\n".encode() if self.password else b""
                conn.sendall(auth + b"PING\r\n")
                if b"+PONG" in conn.recv(64):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self, down_seconds: float = 0.0) -> None:
        self.kill()
        time.sleep(down_seconds)
        self.start()


class WebProcess(ProcessGroup):
    """`controlcenter serve` (uvicorn, HTTP + websockets) on a fixed port, restartable on the same port."""

    def __init__(self, env: dict[str, str], log_path: Path, port: int | None = None, workers: int = 1) -> None:
        self.env = env
        self.log_path = log_path
        self.port = port or free_port()
        self.workers = workers
        self.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        """CPU used so far by the server and its worker processes (one process group)."""
        return group_cpu_seconds(self.process.pid)

    def start(self, timeout: float = 90) -> None:
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "controlcenter.cli", "serve", "--port", str(self.port),
             "--workers", str(self.workers)],
            cwd=ROOT,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"web server exited early:\n{self.log_path.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{self.base_url}/healthz", timeout=1)
                return
            time.sleep(0.1)
        self.kill()  # nobody else holds it yet: Stack.stop() only knows the web servers that came up
        raise RuntimeError(f"web server not up after {timeout}s:\n{self.log_path.read_text()}")


class Stack:
    """Private Redis + web servers + workers on one database; `stop()` ends every process it started."""

    def __init__(
        self,
        database_name: str,
        workdir: Path,
        extra_env: dict[str, str] | None = None,
        *,
        redis_password: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.redis = RedisServer(workdir, password=redis_password)
        self.env = services_env(database_name)
        self.env.update(
            REDIS_URL=self.redis.url,
            SECRET_KEY="stack-secret-key-for-tests-only-0123456789abcdef",
            CC_VAR_DIR=str(workdir / "var"),
            CC_WORKSPACE_ROOT=str(workdir / "workspaces"),
            CC_TOOL_AUTO_APPROVE="bash",
            CC_WORKER_HEARTBEAT_SECONDS="1",
            LOG_LEVEL="INFO",
        )
        self.env.update(extra_env or {})
        self.webs: list[WebProcess] = []
        self.workers: list[WorkerProcess] = []

    def app_name(self, role: str, index: int) -> str:
        return f"ccstack-{self.redis.port}-{role}-{index}"

    def start_web(self, workers: int = 1) -> WebProcess:
        env = {**self.env, "PGAPPNAME": self.app_name("web", len(self.webs))}
        web = WebProcess(env, self.workdir / f"web-{len(self.webs)}.log", workers=workers)
        self.webs.append(web)
        return web

    def start_worker(self, concurrency: int = 2) -> WorkerProcess:
        index = len(self.workers)
        env = {**self.env, "PGAPPNAME": self.app_name("worker", index)}
        worker = WorkerProcess(
            env, f"stack{index}-{self.redis.port}@%h", self.workdir / f"worker-{index}.log", concurrency
        )
        self.workers.append(worker)  # stop() ends it, even if it never gets ready
        worker.wait_ready()
        return worker

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            stop_together([*self.webs, *self.workers])
        self.redis.kill()
