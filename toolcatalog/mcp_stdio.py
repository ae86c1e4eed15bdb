"""A stdio MCP server in the tool sandbox, and the MCP stdio transport over its pipes (MC-2, SB-1).

`spawn()` is the one place a stdio server's process is created, for calls and for imports
alike. The server runs under `toolcatalog.sandbox` like a `bash` call, with the same limits
(CPU, memory, processes, file size; no wall-clock limit, the idle stop ends it instead):

- it sees one workspace read-write at `/workspace` (also `HOME` and its starting directory),
  the system directories, and read-only what it needs to start: the installation of its
  command (a venv and the Python it was made from, a Node prefix, ...), the directories of
  absolute paths among its arguments, and its configured `cwd`; nothing of `var/`, other
  workspaces or the project;
- its environment is the sandbox's allow-list plus the config's `env` (bwrap and the sandbox's
  PID 1 hold only the allow-list, so `/proc/$PPID/environ` shows nothing of the worker's);
- no network unless its config says `network: true` (then outbound only, as CC_SANDBOX_NETWORK=on);
- it dies with the worker (`--die-with-parent`), and stopping it ends every process it started.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from django.conf import settings
from mcp.shared.message import SessionMessage

from toolcatalog import sandbox

if TYPE_CHECKING:
    from toolcatalog.mcp_spec import McpServerSpec

STDERR_LINES = 20
STOP_GRACE_SECONDS = 2.0
_READ_CHUNK = 65536
# Already in every sandbox (read-only): nothing under them needs its own mount.
_SYSTEM = tuple(Path("/") / name for name in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc"))


class ServerMountRefused(ValueError):
    """The server's command, arguments or cwd would expose what the sandbox hides; the message says which."""


def _inside(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def _guarded() -> list[Path]:
    return [Path(p).resolve() for p in (settings.VAR_DIR, settings.CC_WORKSPACE_ROOT, settings.BASE_DIR)]


def _check_mount(server: str, directory: Path) -> None:
    # A mount may hold the project's code (a server script in it) but never contain var/, the
    # workspaces, the project root or the worker's home, nor be inside var/ or the workspaces.
    home = Path.home().resolve()
    for guarded in [*_guarded(), home]:
        if _inside(guarded, directory):
            raise ServerMountRefused(
                f"MCP server {server!r}: {directory} would show the sandboxed server {guarded}; "
                "point command, args and cwd at the server's own directories."
            )
    for guarded in _guarded()[:2]:
        if _inside(directory, guarded):
            raise ServerMountRefused(
                f"MCP server {server!r}: {directory} is inside {guarded}, which servers never see."
            )


def _installation(path: Path, depth: int = 0) -> list[Path]:
    """The directories a program at `path` needs to run: its prefix, a venv's base Python, a script's interpreter."""
    found: list[Path] = []
    for candidate in dict.fromkeys([path, path.resolve()]):
        bin_dir = candidate.parent
        prefix = bin_dir.parent if bin_dir.name in ("bin", "sbin") else bin_dir
        found.append(prefix)
        venv = prefix / "pyvenv.cfg"
        if venv.is_file():
            for line in venv.read_text(encoding="utf-8", errors="replace").splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    home = Path(value.strip()).resolve()
                    found.append(home.parent if home.name == "bin" else home)
    first = b""
    if depth == 0:
        with contextlib.suppress(OSError), path.open("rb") as program:
            first = program.readline(512)
        if first.startswith(b"#!"):
            words = first[2:].decode(errors="replace").split()
            if words and words[0] == "/usr/bin/env" and len(words) > 1:
                words = [shutil.which(words[1]) or words[1]]
            if words and Path(words[0]).is_absolute() and Path(words[0]).exists():
                found += _installation(Path(words[0]), depth + 1)
    return found


def resolve_command(spec: McpServerSpec) -> Path:
    """The server's executable, looked up like a shell would in the PATH of the process starting it,
    then beside this Python: `.venv/bin/controlcenter worker` run without activating its venv did
    not find `mcp-server-time` installed in that same venv."""
    search = os.pathsep.join(part for part in (os.environ.get("PATH", ""), str(Path(sys.executable).parent)) if part)
    found = shutil.which(spec.command, path=search) if "/" not in spec.command else spec.command
    if not found or not Path(found).exists():
        raise FileNotFoundError(
            2,
            f"{spec.command!r} is not installed (not found in the PATH of the process starting it: "
            "a worker for runs, the web process for /mcp and imports; nor beside its Python)",
        )
    # Its directory resolved (a symlinked venv), the file itself not: a venv's `python` link must
    # stay a link for Python to find its pyvenv.cfg.
    return Path(found).absolute().parent.resolve() / Path(found).name


def server_mounts(spec: McpServerSpec, command: Path) -> list[Path]:
    """The host directories a sandboxed server sees read-only, at their own paths."""
    wanted = _installation(command)
    for argument in spec.args:
        if argument.startswith("/") and Path(argument).exists():
            target = Path(argument).resolve()
            wanted.append(target if target.is_dir() else target.parent)
    if spec.cwd:
        wanted.append(Path(spec.cwd).resolve())
    chosen: list[Path] = []
    for directory in sorted({path.resolve() for path in wanted if path.is_dir()}, key=lambda p: len(p.parts)):
        if any(_inside(directory, system) for system in _SYSTEM) or any(_inside(directory, c) for c in chosen):
            continue
        _check_mount(spec.name, directory)
        chosen.append(directory)
    return chosen


# --- the process and its pipes ----------------------------------------------------------------


class _ReadPipe:
    """A pipe from the server as an async iterator of chunks."""

    def __init__(self, reader: asyncio.StreamReader, transport: asyncio.BaseTransport) -> None:
        self._reader, self._transport = reader, transport

    def __aiter__(self) -> _ReadPipe:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._reader.read(_READ_CHUNK)
        if not chunk:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        self._transport.close()


class _WritePipe:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def send(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def aclose(self) -> None:
        self._writer.close()


@dataclass(eq=False)
class ServerProcess:
    """A running sandboxed server: `pid` is bwrap's (the group to signal), `returncode` None while it runs."""

    sandboxed: sandbox.Sandboxed
    stdin: _WritePipe
    stdout: _ReadPipe
    stderr: _ReadPipe
    stderr_lines: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=STDERR_LINES))
    # Lines written so far, those no longer kept included: what a call's failure may quote begins here.
    stderr_count: int = 0
    stdout_closed: bool = False  # by the server: it is ending (or broken), not stopped by us
    stderr_closed: bool = False
    # How the server ended on its own (`settle()`): None while it runs, or when we stopped it.
    exit_status: int | None = None

    @property
    def pid(self) -> int:
        return self.sandboxed.process.pid

    @property
    def returncode(self) -> int | None:
        return self.sandboxed.process.poll()

    async def settle(self, seconds: float = 1.0) -> None:
        """Give a server that closed its stdout a moment to exit and its stderr to drain, so that an
        error can say how it ended: its last words arrive on stderr just after its stdout closes."""
        if not self.stdout_closed:
            return
        with anyio.move_on_after(seconds):
            while self.returncode is None or not self.stderr_closed:
                await anyio.sleep(0.02)
        if self.exit_status is None:
            self.exit_status = self.returncode

    def stderr_tail(self, since: int = 0) -> str:
        """The last lines of stderr written after the first `since` lines."""
        kept = list(self.stderr_lines)
        fresh = kept[len(kept) - min(len(kept), self.stderr_count - since) :]
        return " | ".join(fresh[-3:])

    def ending(self, since: int = 0) -> str:
        """How the server ended (if it did, `settle()`) and its stderr since line `since`, for an error
        message; unredacted: the caller knows the server's secrets."""
        note = f" {_exit_text(self.exit_status)}" if self.exit_status is not None else ""
        tail = self.stderr_tail(since)
        return note + (f" Its stderr: {tail}" if tail else "")


def _exit_text(status: int) -> str:
    # bwrap (the process we hold) passes a signal that killed the server on as 128 + its number.
    if status < 0:
        return f"It was killed by {_signal_name(-status)}."
    if status > 128 and _signal_name(status - 128).startswith("SIG"):
        return f"It exited with status {status} (killed by {_signal_name(status - 128)})."
    return f"It exited with status {status}."


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


async def _read_pipe(loop: asyncio.AbstractEventLoop, stream: Any) -> _ReadPipe:
    reader = asyncio.StreamReader(limit=2**24)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stream)
    return _ReadPipe(reader, transport)


async def spawn(spec: McpServerSpec, workspace: Path) -> ServerProcess:
    """Start `spec`'s server in the sandbox of `workspace`, on this (long-lived) thread.

    Started from the caller's thread on purpose: bwrap's `--die-with-parent` fires when the
    thread that started it ends, so a short-lived pool thread would take the server with it.
    """
    command = resolve_command(spec)
    mounts = server_mounts(spec, command)
    path = sandbox.PATH
    if not any(_inside(command.parent, system) for system in _SYSTEM):
        path = f"{command.parent}:{path}"  # `python` and siblings resolve to the server's own installation
    sandboxed = sandbox.start(
        workspace,
        [str(command), *spec.args],
        limits=sandbox.Limits.from_settings(),
        key=("mcp", spec.name),
        stdin=subprocess.PIPE,
        env={"PATH": path, **spec.env},
        read_only=mounts,
        network=spec.network,
        chdir=str(Path(spec.cwd).resolve()) if spec.cwd else None,
    )
    popen = sandboxed.process
    assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
    loop = asyncio.get_running_loop()
    try:
        pipes = [await _read_pipe(loop, stream) for stream in (popen.stdout, popen.stderr)]
        write_transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, popen.stdin)
        writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
    except BaseException:
        sandbox.finish(sandboxed)
        raise
    return ServerProcess(sandboxed, _WritePipe(writer), pipes[0], pipes[1])


async def stop(process: ServerProcess) -> None:
    """The MCP shutdown sequence: close stdin, give it a moment, then end the sandbox."""
    with suppress(Exception):
        await process.stdin.aclose()
    for sig in (None, signal.SIGTERM):
        if sig is not None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
        with anyio.move_on_after(STOP_GRACE_SECONDS):
            while process.returncode is None:
                await anyio.sleep(0.02)
        if process.returncode is not None:
            break
    sandbox.finish(process.sandboxed)  # SIGKILLs what is left: every process of the sandbox ends with it
    for stream in (process.stdout, process.stderr):
        with suppress(Exception):
            await stream.aclose()


@asynccontextmanager
async def transport(spec: McpServerSpec, workspace: Path, started: list[ServerProcess]) -> AsyncIterator[Any]:
    """Newline-delimited JSON-RPC over the sandboxed server's stdin/stdout (the MCP stdio transport).

    The process is appended to `started` so its owner can watch it (alive, pid, stderr).
    """
    process = await spawn(spec, workspace)
    started.append(process)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](16)

    async def read_stdout() -> None:
        buffer = b""
        async with read_writer:
            with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for chunk in process.stdout:
                    *lines, buffer = (buffer + chunk).split(b"\n")
                    for line in lines:
                        if not line.strip():
                            continue
                        try:
                            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                        except ValueError as exc:
                            await read_writer.send(exc)
                            continue
                        await read_writer.send(SessionMessage(message))
                process.stdout_closed = True

    async def read_stderr() -> None:
        buffer = b""
        with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async for chunk in process.stderr:
                *lines, buffer = (buffer + chunk).split(b"\n")
                written = [line.decode("utf-8", "replace") for line in lines if line.strip()]
                process.stderr_lines.extend(written)
                process.stderr_count += len(written)
            process.stderr_closed = True

    async def write_stdin() -> None:
        async with write_reader:
            with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError, ConnectionError):
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(read_stdout)
            group.start_soon(read_stderr)
            group.start_soon(write_stdin)
            try:
                yield read_stream, write_stream
            finally:
                with anyio.CancelScope(shield=True):
                    await process.settle()  # before its stderr reader is cancelled
                group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await stop(process)
