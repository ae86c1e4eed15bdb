"""Read the tool list of an external MCP server (stdio or Streamable HTTP) as plain records.

This module only connects and lists; persisting the records (a group named after the
server, names namespaced on collision) belongs to the catalog's import service.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx2
from django.conf import settings
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from controlcenter.redact import redact_text
from toolcatalog import mcp_stdio
from toolcatalog.mcp_spec import ImportedTool, McpImportError, McpServerSpec
from toolcatalog.sandbox import SandboxUnavailable

_MAX_PAGES = 100


@dataclass
class HttpAnswers:
    """The HTTP error statuses an MCP server answered on one connection. The SDK passes on the
    JSON-RPC error a server puts in the body ("Session not found" from a restarted server) without
    its status, so a forgotten session looked like a refused call, and a 401 like any error."""

    errors: list[tuple[int, bool]] = field(default_factory=list)  # (status, the request had a session)

    async def seen(self, response: httpx2.Response) -> None:
        if response.status_code >= 400:
            self.errors.append((response.status_code, "mcp-session-id" in response.request.headers))

    def session_forgotten(self, since: int) -> bool:
        """A 404 to a request in a session (MCP's word for "no such session") after answer `since`."""
        return any(status == 404 and in_session for status, in_session in self.errors[since:])

    def note(self, since: int = 0) -> str:
        if len(self.errors) <= since:
            return ""
        status = self.errors[-1][0]
        if status in (401, 403):
            return f" It answered HTTP {status}: it refused our credentials; check the server's headers (its token)."
        return f" It answered HTTP {status}."


def http_client(spec: McpServerSpec, answers: HttpAnswers) -> httpx2.AsyncClient:
    """The HTTP client of one connection to `spec`: its headers, its timeout, no proxy from the
    environment, and every error status noted in `answers`."""
    return httpx2.AsyncClient(
        headers=spec.headers,
        timeout=spec.timeout_seconds,
        trust_env=False,
        event_hooks={"response": [answers.seen]},
    )


def _client(
    spec: McpServerSpec, workspace: Path, started: list[mcp_stdio.ServerProcess], answers: HttpAnswers
) -> tuple[Client, httpx2.AsyncClient | None]:
    if spec.transport == "stdio":
        if not spec.command:
            raise McpImportError(f"MCP server {spec.name!r}: a stdio server needs a command.")
        # Listing runs the server too: in the sandbox, on an empty workspace of its own.
        stdio = mcp_stdio.transport(spec, workspace, started)
        return Client(stdio, read_timeout_seconds=spec.timeout_seconds), None
    if spec.transport == "http":
        if not spec.url.startswith(("http://", "https://")):
            raise McpImportError(f"MCP server {spec.name!r}: an http server needs an http(s) URL, got {spec.url!r}.")
        http = http_client(spec, answers)
        transport = streamable_http_client(spec.url, http_client=http)
        return Client(transport, read_timeout_seconds=spec.timeout_seconds), http
    raise McpImportError(f"MCP server {spec.name!r}: unknown transport {spec.transport!r} (use stdio or http).")


async def list_tools_of(client: Client, server: str) -> list[ImportedTool]:
    """Every tool a connected client's server lists, all pages. A server whose pages never end (a
    cursor it sent before, or more than `_MAX_PAGES`) is refused: its list was cut short silently,
    and a refresh then took the tools past the cut for removed."""
    tools: list[ImportedTool] = []
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(
            ImportedTool(
                name=tool.name,
                description=tool.description or "",
                input_schema=dict(tool.input_schema or {"type": "object"}),
                server=server,
            )
            for tool in page.tools
        )
        cursor = page.next_cursor
        if not cursor:
            return tools
        if cursor in seen:
            raise McpImportError(
                f"MCP server {server!r}: its tool list never ends (it sent the page cursor {cursor[:40]!r} twice)."
            )
        seen.add(cursor)
    raise McpImportError(f"MCP server {server!r}: its tool list has more than {_MAX_PAGES} pages.")


async def list_server_tools_async(spec: McpServerSpec) -> list[ImportedTool]:
    if spec.transport != "stdio":
        return await _list_in(spec, Path())
    Path(settings.CC_WORKSPACE_ROOT).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"mcp-import-{spec.name}-", dir=settings.CC_WORKSPACE_ROOT) as workspace:
        return await _list_in(spec, Path(workspace))


async def _list_in(spec: McpServerSpec, workspace: Path) -> list[ImportedTool]:
    started: list[mcp_stdio.ServerProcess] = []
    answers = HttpAnswers()
    client, http = _client(spec, workspace, started, answers)
    try:
        with anyio.fail_after(spec.timeout_seconds * 2):
            async with client:
                tools = await list_tools_of(client, spec.name)
    except McpImportError:
        raise
    except TimeoutError as exc:
        raise McpImportError(
            f"MCP server {spec.name!r} did not answer tools/list in time." + ending_note(started, spec)
        ) from exc
    except Exception as exc:
        if isinstance(innermost(exc), McpImportError):
            raise innermost(exc) from None  # our own verdict on the listing, through the SDK's task group
        raise McpImportError(
            f"MCP server {spec.name!r}: {describe(exc, spec)}." + answers.note() + ending_note(started, spec)
        ) from exc
    finally:
        if http is not None:
            await http.aclose()
    return tools


def list_server_tools(spec: McpServerSpec) -> list[ImportedTool]:
    """Connect to `spec`, list every tool (all pages), and disconnect. Raises McpImportError."""
    return anyio.run(list_server_tools_async, spec)


def secrets_of(spec: McpServerSpec) -> list[str]:
    """The resolved env and header values of a server: never shown, whatever message carries them."""
    return sorted(
        {value for value in [*spec.env.values(), *spec.headers.values()] if value and len(value) >= 4},
        key=len,
        reverse=True,
    )


def innermost(exc: BaseException) -> BaseException:
    """The real failure inside the exception groups a task group wraps it in."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException | None, spec: McpServerSpec) -> str:
    """A failure to reach or use `spec`'s server, for a message a user sees: its secrets hidden."""
    if exc is None:
        return "no reason given"
    exc = innermost(exc)
    if isinstance(exc, FileNotFoundError | PermissionError):
        return f"cannot start the server command: {exc.strerror or exc}"
    if isinstance(exc, mcp_stdio.ServerMountRefused | SandboxUnavailable):
        # These name the server themselves; the caller's prefix would say it twice.
        return str(exc).removeprefix(f"MCP server {spec.name!r}: ")
    # Bearer tokens sent as headers may come back inside an error's text, and so may env values;
    # httpx puts the whole URL in its errors, and an MCP server's URL may carry a token.
    bare = [secret.split(" ", 1)[-1] for secret in secrets_of(spec)]
    text = redact_text(str(exc), [*secrets_of(spec), *bare])
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def ending_note(started: list[mcp_stdio.ServerProcess], spec: McpServerSpec, *, since: int = 0) -> str:
    """How a stdio server's latest process ended and what it wrote on stderr (after line `since`),
    secrets hidden; "" for an HTTP server or a server that said nothing: "Connection closed" alone
    left a user whose server crashed at start with nothing to go on."""
    if not started:
        return ""
    return redact_text(started[-1].ending(since), secrets_of(spec))[:600]
