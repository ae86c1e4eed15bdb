"""The MCP endpoint: Streamable HTTP at /mcp, DRF token auth, built-in tools for external clients.

- `tools/list` returns the whole surface, untouched by deferral (TD-9): `mcp_tool_list()`.
- `search_tool_bm25` ranks that surface and only describes matches (TD-7); it never
  loads or activates anything: `rank_tools()`.
- `tools/call` runs a built-in in the caller's own MCP workspace under the same
  approval rule as a run (a tool that requires approval is refused unless approved).

Transport: the official `mcp` SDK's low-level `Server` behind its
`StreamableHTTPSessionManager` in stateless JSON mode, so any web process can answer
any request (no session affinity between ASGI workers).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, connections
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from rank_bm25 import BM25Okapi

from toolcatalog.builtins import BUILTINS, WorkspaceToolBox
from toolcatalog.workspace import mcp_workspace_root

logger = logging.getLogger(__name__)

MCP_PATH = "/mcp"
SEARCH_TOOL = "search_tool_bm25"
USER_SCOPE_KEY = "controlcenter.user_id"
_META_PREFIX = "controlcenter/"

SEARCH_TOOL_RECORD: dict[str, Any] = {
    "name": SEARCH_TOOL,
    "group": "Discovery",
    "description": (
        "Rank this server's tools against a natural-language description of what you need (BM25 over "
        "tool names, groups and descriptions). Returns the best matches with a one-line description and "
        "their parameter names; call a match by name with tools/call."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What the tool should do, in a few words."},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50, "description": "Matches to return. Default 5."},
        },
        "required": ["query"],
    },
    "resident": True,
    "requires_approval": False,
    "side_effects": "none",
}


# --- the surface ------------------------------------------------------------------


def mcp_tool_list() -> list[dict[str, Any]]:
    """Every tool an MCP client sees, in catalog-record form, in a stable order.

    The one place to swap in the catalog: when the catalog lands, return its
    enabled tools here (all of them: the MCP surface is not deferred, TD-9).
    """
    records = [BUILTINS[name].catalog_record() for name in sorted(BUILTINS)]
    return [*records, SEARCH_TOOL_RECORD]


def _words(text: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text)
    return [word.lower() for word in re.findall(r"[A-Za-z0-9]+", spaced.replace("_", " "))]


def rank_tools(query: str, tools: list[dict[str, Any]], limit: int = 5) -> list[dict[str, Any]]:
    """BM25 over name words, group and description; matches described, never loaded (TD-7).

    The catalog branch's search index replaces this function.
    """
    documents = [
        _words(tool["name"]) * 2 + _words(tool.get("group", "")) + _words(tool.get("description", "")) for tool in tools
    ]
    terms = _words(query)
    if not terms or not tools:
        return []
    scores = BM25Okapi(documents).get_scores(terms)
    ranked = sorted(range(len(tools)), key=lambda index: (-scores[index], tools[index]["name"]))
    matches = []
    for index in ranked[:limit]:
        if scores[index] <= 0 or not set(terms) & set(documents[index]):
            continue
        tool = tools[index]
        properties = tool.get("input_schema", {}).get("properties", {})
        matches.append(
            {
                "name": tool["name"],
                "group": tool.get("group", ""),
                "description": tool.get("description", ""),
                "parameters": sorted(properties),
                "required": tool.get("input_schema", {}).get("required", []),
                "score": round(float(scores[index]), 4),
            }
        )
    return matches


def search_observation(arguments: dict[str, Any]) -> dict[str, Any]:
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        return {"ok": False, "error": "query must be a non-empty string describing the tool you need."}
    limit = arguments.get("limit", 5)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 50:
        return {"ok": False, "error": "limit must be an integer from 1 to 50."}
    matches = rank_tools(query, [t for t in mcp_tool_list() if t["name"] != SEARCH_TOOL], limit)
    observation: dict[str, Any] = {"ok": True, "query": query, "matches": matches}
    if not matches:
        observation["_note"] = "No tool matches this query; rephrase it or describe the task more broadly."
    return observation


def mcp_execute(*, user_id: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Run one tool for an MCP caller in the caller's MCP workspace; always an observation."""
    if name == SEARCH_TOOL:
        return search_observation(arguments)
    if name not in {tool["name"] for tool in mcp_tool_list()}:
        return {"ok": False, "error": f"There is no tool named {name!r} on this MCP server; tools/list shows them."}
    toolbox = WorkspaceToolBox(mcp_workspace_root(user_id), user_id=user_id)
    return toolbox.execute(name, arguments)


def _to_mcp_tool(record: dict[str, Any]) -> types.Tool:
    return types.Tool(
        name=record["name"],
        description=record["description"],
        input_schema=record["input_schema"],
        annotations=types.ToolAnnotations(read_only_hint=record.get("side_effects", "none") == "none"),
        _meta={
            f"{_META_PREFIX}group": record.get("group", ""),
            f"{_META_PREFIX}requires_approval": bool(record.get("requires_approval", False)),
        },
    )


# --- the MCP server ----------------------------------------------------------------


async def _list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    records = await sync_to_async(mcp_tool_list, thread_sensitive=False)()
    return types.ListToolsResult(tools=[_to_mcp_tool(record) for record in records])


def _call_in_thread(user_id: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    close_old_connections()
    try:
        return mcp_execute(user_id=user_id, name=name, arguments=arguments)
    finally:
        # Worker threads come and go: never leave a database connection behind.
        connections.close_all()


async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    scope = getattr(ctx.request, "scope", None) or {}
    user_id = scope.get(USER_SCOPE_KEY)
    if user_id is None:
        observation = {"ok": False, "error": "This call carries no authenticated user."}
    else:
        observation = await sync_to_async(_call_in_thread, thread_sensitive=False)(
            user_id, params.name, dict(params.arguments or {})
        )
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(observation, sort_keys=True, ensure_ascii=False))],
        structured_content=observation,
        is_error=observation.get("ok") is False,
    )


def build_server() -> Server:
    return Server(
        "controlcenter",
        version="0.1.0",
        instructions=(
            "Control Center's built-in tools. Call search_tool_bm25 to find a tool by what it does; "
            "file tools work in your own MCP workspace."
        ),
        on_list_tools=_list_tools,
        on_call_tool=_call_tool,
    )


def _security_settings() -> TransportSecuritySettings:
    hosts = [host for host in settings.ALLOWED_HOSTS if host]
    if "*" in hosts:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    allowed_hosts = [pattern for host in hosts for pattern in (host, f"{host}:*")]
    origins = [f"{scheme}://{pattern}" for scheme in ("http", "https") for pattern in allowed_hosts]
    return TransportSecuritySettings(
        allowed_hosts=allowed_hosts, allowed_origins=[*origins, *settings.CSRF_TRUSTED_ORIGINS]
    )


# --- the ASGI endpoint -------------------------------------------------------------


@dataclass
class _Running:
    manager: StreamableHTTPSessionManager
    stop: asyncio.Event
    task: asyncio.Task


@dataclass
class McpEndpoint:
    """ASGI app for /mcp: authenticate, then hand the request to the SDK's session manager.

    The manager needs a long-lived task group; it is started on the first request of
    each event loop (and stopped at lifespan shutdown), so the endpoint works under
    servers with or without the lifespan protocol.
    """

    _running: dict[int, _Running] = field(default_factory=dict)
    _locks: dict[int, asyncio.Lock] = field(default_factory=dict)

    @staticmethod
    def handles(path: str) -> bool:
        return path == MCP_PATH or path.startswith(MCP_PATH + "/")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        user_id, problem = await authenticate(scope)
        if problem:
            await _unauthorized(send, problem)
            return
        scope[USER_SCOPE_KEY] = user_id
        running = await self._ensure_started()
        await running.manager.handle_request(scope, receive, send)

    async def _ensure_started(self) -> _Running:
        loop_id = id(asyncio.get_running_loop())
        running = self._running.get(loop_id)
        if running is not None and not running.task.done():
            return running
        lock = self._locks.setdefault(loop_id, asyncio.Lock())
        async with lock:
            running = self._running.get(loop_id)
            if running is not None and not running.task.done():
                return running
            manager = StreamableHTTPSessionManager(
                app=build_server(), stateless=True, json_response=True, security_settings=_security_settings()
            )
            started, stop = asyncio.Event(), asyncio.Event()

            async def hold() -> None:
                async with manager.run():
                    started.set()
                    await stop.wait()

            task = asyncio.get_running_loop().create_task(hold())
            waiter = asyncio.ensure_future(started.wait())
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                waiter.cancel()
                task.result()  # re-raise why the manager could not start
            running = _Running(manager, stop, task)
            self._running[loop_id] = running
            return running

    async def shutdown(self) -> None:
        running = self._running.pop(id(asyncio.get_running_loop()), None)
        if running is not None:
            running.stop.set()
            await running.task


def _token_key(scope: dict) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, key = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() in ("bearer", "token") and key.strip():
                return key.strip()
            return ""
    return None


def _user_for_token(key: str) -> int | None:
    from rest_framework.authtoken.models import Token

    close_old_connections()
    try:
        token = Token.objects.select_related("user").filter(key=key).first()
        return token.user_id if token is not None and token.user.is_active else None
    finally:
        connections.close_all()


async def authenticate(scope: dict) -> tuple[int | None, str]:
    """The user id for the request's DRF token, or a reason to refuse it."""
    key = _token_key(scope)
    if key is None:
        return None, "Authentication required: send 'Authorization: Bearer <token>' with your API token."
    if key == "" or len(key) > 128:
        return None, "Malformed Authorization header: use 'Bearer <token>' or 'Token <token>'."
    user_id = await sync_to_async(_user_for_token, thread_sensitive=False)(key)
    if user_id is None:
        return None, "Invalid or inactive API token."
    return user_id, ""


async def _unauthorized(send: Any, message: str) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b'Bearer realm="controlcenter-mcp"'),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


mcp_endpoint = McpEndpoint()
