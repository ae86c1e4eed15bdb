"""Calls of imported MCP tools, forwarded to their servers (MC-2).

One `McpConnections` per process (the worker's, the web server's for /mcp) keeps one
live connection per configured server on a private event loop thread:

- a stdio server runs in the tool sandbox (`toolcatalog.mcp_stdio`), one process per server
  and workspace: it sees the calling conversation's workspace (or the /mcp user's), never
  another one. It is started on first use, reused across calls and runs, restarted after it
  died, and stopped when idle (CC_MCP_IDLE_SECONDS) and at process exit;
- an HTTP session is reused, and opened again when the server forgot it (a restart);
- every call is bounded by CC_MCP_CALL_TIMEOUT_SECONDS; whatever goes wrong comes back as a
  tool error naming the server, with the server's secrets hidden (MC-3).

`mcp_executor()` is the catalog Executor for imported tools; results are mapped to
observations here (`observation_of`), images as image blocks the model can see.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
from django.conf import settings
from django.db import close_old_connections
from django.db import connections as databases
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from controlcenter.redact import register_secrets
from engine.actions import ATTACHED_IMAGES
from engine.catalog.schemas import NAMESPACE_SEPARATOR
from engine.catalog.toolbox import UNAVAILABLE, Executor, Observation
from engine.images import image_block
from toolcatalog import mcp_stdio
from toolcatalog.mcp_config import McpConfigError
from toolcatalog.mcp_import import HttpAnswers, describe, ending_note, http_client, secrets_of
from toolcatalog.mcp_spec import McpServerSpec
from toolcatalog.mcp_stdio import STOP_GRACE_SECONDS, ServerProcess
from toolcatalog.models import McpServer, Tool
from toolcatalog.services import McpServerImportFailed, mcp_server_import, mcp_server_spec

logger = logging.getLogger(__name__)


class McpCallError(Exception):
    """The call did not reach the tool or got no usable answer; the message is safe to show.

    `unavailable`: the server could not be started or reached at all, so the tool cannot run.
    """

    def __init__(self, message: str, *, unavailable: bool = False) -> None:
        super().__init__(message)
        self.unavailable = unavailable


# --- one live connection ----------------------------------------------------------------------


def _fingerprint(spec: McpServerSpec) -> str:
    raw = json.dumps(
        [spec.transport, spec.command, spec.args, spec.env, spec.cwd, spec.url, spec.headers, spec.network]
    )
    return hashlib.sha256(raw.encode()).hexdigest()


class _Connection:
    """A server's client session, held open by one task on the connections' loop."""

    def __init__(
        self,
        spec: McpServerSpec,
        workspace: Path,
        on_tools_changed: Callable[[str], None] | None,
    ) -> None:
        self.spec = spec
        self.workspace = workspace
        self.fingerprint = _fingerprint(spec)
        self.client: Client | None = None
        self.failure: BaseException | None = None
        self.ready = asyncio.Event()
        self.closed = asyncio.Event()
        self._stop = asyncio.Event()
        self._stdio: list[ServerProcess] = []
        self._on_tools_changed = on_tools_changed
        self._task: asyncio.Task | None = None
        self.in_flight = 0
        self.last_used = time.monotonic()
        self.broken = False
        self.http_answers = HttpAnswers()

    @property
    def alive(self) -> bool:
        if self.broken or self.closed.is_set():
            return False
        return not self._stdio or self._stdio[-1].returncode is None

    @property
    def pid(self) -> int | None:
        return self._stdio[-1].pid if self._stdio else None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._hold())

    async def _notified(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification) and self._on_tools_changed is not None:
            # The catalog is written with the ORM, and relisting takes seconds: not on this loop.
            threading.Thread(target=self._on_tools_changed, args=(self.spec.name,), daemon=True).start()

    def _client(self) -> tuple[Client, httpx2.AsyncClient | None]:
        if self.spec.transport == "stdio":
            stdio = mcp_stdio.transport(self.spec, self.workspace, self._stdio)
            return Client(stdio, mode="legacy", message_handler=self._notified), None
        http = http_client(self.spec, self.http_answers)
        transport = streamable_http_client(self.spec.url, http_client=http)
        return Client(transport, mode="legacy", message_handler=self._notified), http

    async def _hold(self) -> None:
        http = None
        try:
            client, http = self._client()
            async with client:
                self.client = client
                self.ready.set()
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to the callers waiting on it
            self.failure = exc
        finally:
            self.client = None
            if http is not None:
                with suppress(Exception):
                    await http.aclose()
            self.closed.set()
            self.ready.set()

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None and not self.ready.is_set():
            self._task.cancel()  # still starting: nothing to say goodbye to
        if self._task is not None:
            with suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(self._task), STOP_GRACE_SECONDS * 4)

    def stderr_count(self) -> int:
        return self._stdio[-1].stderr_count if self._stdio else 0

    async def ending_note(self, since: int = 0) -> str:
        """How the server's process ended (waiting a moment for it) and its stderr after line `since`."""
        if self._stdio:
            await self._stdio[-1].settle()
        return ending_note(self._stdio, self.spec, since=since)


# --- the process's connections ----------------------------------------------------------------


class McpConnections:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()
        # One connection per server and workspace: a stdio server sees the workspace it was started in.
        self._connections: dict[tuple[str, Path], _Connection] = {}
        self._opening: dict[tuple[str, Path], asyncio.Lock] = {}
        self.on_tools_changed: Callable[[str], None] | None = None

    # The loop thread is started lazily, so importing this module costs nothing.
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._guard:
            if self._loop is None or not self._thread or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="cc-mcp-client", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
                asyncio.run_coroutine_threadsafe(self._reap_idle(), loop)
            return self._loop

    def call_tool(
        self, spec: McpServerSpec, tool: str, arguments: dict[str, Any], *, workspace: Path
    ) -> types.CallToolResult:
        """Call `tool` on `spec`'s server, starting or reopening its connection as needed. Raises McpCallError.

        A stdio server runs with `workspace` as its own (HTTP servers ignore it).
        """
        loop = self._ensure_loop()
        # An HTTP session is the same whoever calls: one per server.
        where = workspace.resolve() if spec.transport == "stdio" else Path()
        future = asyncio.run_coroutine_threadsafe(self._call(spec, tool, arguments, where), loop)
        try:
            # The call bounds itself; this only guards against a wedged loop.
            return future.result(timeout=spec.timeout_seconds * 3 + settings.CC_MCP_START_TIMEOUT_SECONDS + 10)
        except TimeoutError as exc:
            future.cancel()
            raise McpCallError(f"MCP server {spec.name!r} did not answer in time.") from exc

    def running(self) -> dict[str, list[int | None]]:
        """Server name -> the (bwrap) pids of its live stdio processes (None for HTTP): for tests and the operator."""
        found: dict[str, list[int | None]] = {}
        for (name, _), conn in list(self._connections.items()):
            if conn.alive:
                found.setdefault(name, []).append(conn.pid)
        return found

    def close(self, name: str | None = None) -> None:
        """Stop one server's connection (or all): its process ends, the next call starts it again."""
        if self._loop is None or not self._loop.is_running():
            return
        future = asyncio.run_coroutine_threadsafe(self._close(name), self._loop)
        with suppress(Exception):
            future.result(timeout=STOP_GRACE_SECONDS * 8)

    async def _close(self, name: str | None) -> None:
        keys = [key for key in self._connections if name is None or key[0] == name]
        closing = [self._connections.pop(key) for key in keys]
        await asyncio.gather(*(conn.close() for conn in closing), return_exceptions=True)

    async def _connection(self, spec: McpServerSpec, workspace: Path) -> _Connection:
        key = (spec.name, workspace)
        lock = self._opening.setdefault(key, asyncio.Lock())
        async with lock:  # parallel first calls start one process, not several
            conn = self._connections.get(key)
            if conn is not None and (conn.fingerprint != _fingerprint(spec) or not conn.alive):
                self._connections.pop(key, None)
                await conn.close()
                conn = None
            if conn is None:
                conn = _Connection(spec, workspace, self.on_tools_changed)
                self._connections[key] = conn
                conn.start()
            start_timeout = max(spec.timeout_seconds, settings.CC_MCP_START_TIMEOUT_SECONDS)
            try:
                await asyncio.wait_for(conn.ready.wait(), start_timeout)
            except TimeoutError:
                self._connections.pop(key, None)
                await conn.close()
                raise McpCallError(
                    f"MCP server {spec.name!r} did not start within {start_timeout:g} s "
                    "(CC_MCP_START_TIMEOUT_SECONDS)." + await conn.ending_note(),
                    unavailable=True,
                ) from None
            if conn.client is None:
                self._connections.pop(key, None)
                raise McpCallError(
                    f"MCP server {spec.name!r} could not be started or reached: {describe(conn.failure, spec)}."
                    + await conn.ending_note(),
                    unavailable=True,
                )
            return conn

    async def _call(
        self, spec: McpServerSpec, tool: str, arguments: dict[str, Any], workspace: Path
    ) -> types.CallToolResult:
        for attempt in (1, 2):
            conn = await self._connection(spec, workspace)
            # A failure quotes only what the server wrote during this call: an earlier call's
            # error on stderr would point at the wrong cause.
            stderr_before = conn.stderr_count()
            answers_before = len(conn.http_answers.errors)
            conn.in_flight += 1
            try:
                assert conn.client is not None
                with anyio.fail_after(spec.timeout_seconds):
                    return await conn.client.call_tool(tool, arguments, read_timeout_seconds=spec.timeout_seconds)
            except TimeoutError:
                raise McpCallError(
                    f"{spec.name}{NAMESPACE_SEPARATOR}{tool} did not answer within {spec.timeout_seconds:g} s "
                    f"(CC_MCP_CALL_TIMEOUT_SECONDS); the call was abandoned."
                ) from None
            except MCPError as exc:
                if exc.code == types.REQUEST_TIMEOUT:
                    raise McpCallError(
                        f"{spec.name}{NAMESPACE_SEPARATOR}{tool} did not answer within {spec.timeout_seconds:g} s "
                        "(CC_MCP_CALL_TIMEOUT_SECONDS); the call was abandoned."
                    ) from None
                forgotten = spec.transport == "http" and (
                    exc.message == "Session terminated" or conn.http_answers.session_forgotten(answers_before)
                )
                if exc.code != types.CONNECTION_CLOSED and conn.alive and not forgotten:
                    # The server answered with a JSON-RPC error: it is up, the call was refused.
                    raise McpCallError(
                        f"MCP server {spec.name!r} refused the call of {tool!r}: {describe(exc, spec)}."
                        + conn.http_answers.note(answers_before)
                    ) from None
                conn.broken = True
                failure: BaseException = exc
            except Exception as exc:  # noqa: BLE001 - transport failures of every kind become tool errors
                conn.broken, forgotten = True, False
                failure = exc
            finally:
                conn.in_flight -= 1
                conn.last_used = time.monotonic()
            # An HTTP server that restarted answers 404 for our old session before running
            # anything, so that call is sent once more on a new session. Any other broken
            # connection may have died in the middle of the call: reported, never re-sent;
            # the next call starts (stdio) or opens (HTTP) a new one.
            if forgotten and attempt == 1:
                continue
            raise McpCallError(
                f"MCP server {spec.name!r} stopped during the call of {tool!r}: {describe(failure, spec)}. "
                "It will be started again on the next call." + await conn.ending_note(stderr_before)
            )
        raise AssertionError("unreachable")

    async def _reap_idle(self) -> None:
        while True:
            idle = settings.CC_MCP_IDLE_SECONDS
            await asyncio.sleep(max(0.2, min(idle / 4, 5)))
            cutoff = time.monotonic() - idle
            for key, conn in list(self._connections.items()):
                if conn.in_flight == 0 and (conn.last_used < cutoff or not conn.alive):
                    if self._connections.get(key) is conn:
                        del self._connections[key]
                    lock = self._opening.get(key)
                    if lock is not None and not lock.locked():
                        del self._opening[key]
                    await conn.close()


# Servers being refreshed after a notification -> whether another came meanwhile: a server that
# announces changes in a loop costs one listing at a time, and the last announcement is never lost.
_refreshing: dict[str, bool] = {}
_refreshing_lock = threading.Lock()


def _refresh_catalog(name: str) -> None:
    """The server said its tool list changed (MC-4): the catalog is refreshed, as `catalog refresh`
    does, from a listing of its own (a new process on an empty workspace, a new HTTP session). Not
    the list of the process that spoke: a stdio server runs once per workspace, and one user's
    process (its tools grown or dropped by that user's calls) rewrote the catalog of everyone."""
    with _refreshing_lock:
        if name in _refreshing:
            _refreshing[name] = True
            return
        _refreshing[name] = False
    try:
        while True:
            _refresh_once(name)
            with _refreshing_lock:
                if not _refreshing[name]:
                    return
                _refreshing[name] = False
    finally:
        with _refreshing_lock:
            _refreshing.pop(name, None)


def _refresh_once(name: str) -> None:
    close_old_connections()
    try:
        server = McpServer.objects.filter(name=name, enabled=True).first()
        if server is not None:
            result = mcp_server_import(server=server)
            logger.info("MCP server %s changed its tools: %s", name, result.summary())
    except McpServerImportFailed as exc:  # a failed refresh leaves the catalog as it was
        logger.warning("MCP server %s changed its tools; listing them failed: %s", name, exc.message)
    finally:
        databases.close_all()


connections = McpConnections()
connections.on_tools_changed = _refresh_catalog
atexit.register(connections.close)


# --- results -> observations ------------------------------------------------------------------


def observation_of(server: str, tool: str, result: types.CallToolResult) -> Observation:
    """An MCP tool result as the model sees it: text, structured content, resources, images, isError."""
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    resources: list[dict[str, Any]] = []
    other: list[str] = []
    left_out: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            texts.append(block.text)
        elif isinstance(block, types.ImageContent):
            image, why = image_block(block.data, block.mime_type)
            if image is not None:
                images.append(image)
            else:
                left_out.append(f"an image was left out: {why}")
        elif isinstance(block, types.EmbeddedResource):
            item: dict[str, Any] = {"uri": str(block.resource.uri)}
            if block.resource.mime_type:
                item["mime_type"] = block.resource.mime_type
            if isinstance(block.resource, types.TextResourceContents):
                item["text"] = block.resource.text
            else:
                item["blob_base64_chars"] = len(getattr(block.resource, "blob", ""))
            resources.append(item)
        elif isinstance(block, types.ResourceLink):
            resources.append({"uri": str(block.uri), "name": block.name, "link": True})
        else:
            other.append(getattr(block, "type", type(block).__name__))
    observation: Observation = {"ok": not result.is_error, "server": server, "tool": tool}
    text = "\n".join(texts)
    if result.is_error:
        observation["error"] = f"{server}{NAMESPACE_SEPARATOR}{tool} reported an error: {text or 'no details given'}"
    elif texts:
        observation["text"] = text
    if result.structured_content is not None:
        observation["structured_content"] = result.structured_content
    if resources:
        observation["resources"] = resources
    if images:
        observation["images"] = [{"media_type": image["source"]["media_type"]} for image in images]
        observation[ATTACHED_IMAGES] = images
    if left_out:
        observation["images_left_out"] = left_out
    if other:
        observation["unsupported_content"] = other
    return observation


# --- the catalog executor ---------------------------------------------------------------------


def _unavailable(message: str) -> Observation:
    return {"ok": False, "error": message, UNAVAILABLE: True}


def forward(name: str, arguments: dict[str, Any], workspace: Path) -> Observation | None:
    """Run an imported tool `SERVER__tool` on its server; None when `name` belongs to no configured server."""
    server_name, separator, tool_name = name.partition(NAMESPACE_SEPARATOR)
    if not separator:
        return None
    server = McpServer.objects.filter(name=server_name).first()
    if server is None:
        if Tool.objects.filter(name=name, server=None).exists():
            return None  # a catalog tool of that name, no MCP server's
        # Deleting a server deletes its tools; a conversation that pinned one still offers it.
        return _unavailable(f"{name}: its MCP server {server_name} was removed; this tool cannot be called any more.")
    tool = Tool.objects.filter(server=server, name=tool_name).first()
    if tool is None or tool.server_missing:
        return _unavailable(f"{name}: this tool was removed from server {server_name}; it cannot be called any more.")
    if not server.enabled or not tool.enabled:
        return _unavailable(f"{name}: the MCP server {server_name} or this tool is disabled by an operator.")
    try:
        spec = mcp_server_spec(server, timeout_seconds=settings.CC_MCP_CALL_TIMEOUT_SECONDS)
    except McpConfigError as exc:
        return _unavailable(str(exc))
    register_secrets(secrets_of(spec))
    try:
        result = connections.call_tool(spec, tool_name, arguments, workspace=workspace)
    except McpCallError as exc:
        logger.warning("MCP call failed: %s", exc)
        failed: Observation = {"ok": False, "error": str(exc), "server": server_name, "tool": tool_name}
        return {**failed, UNAVAILABLE: True} if exc.unavailable else failed
    return observation_of(server_name, tool_name, result)


def mcp_executor(workspace: Path) -> Executor:
    """The Executor for imported MCP tools (None for any other name); stdio servers run on `workspace`."""
    return lambda name, arguments: forward(name, arguments, workspace)
