"""The MCP endpoint: Streamable HTTP at /mcp, DRF token auth, the tool catalog for external clients.

- `tools/list` returns the whole enabled catalog, untouched by deferral (TD-9): `mcp_tool_list()`.
- `search_tool_bm25` ranks it with the catalog's own BM25 index and only describes
  matches (TD-7); it never loads or activates anything: `rank_tools()`.
- `tools/call` runs a tool in the caller's own MCP workspace through the run's
  CatalogToolBox: same validation, approval rule and action limits (per MCP session);
  imported MCP tools are forwarded to their servers (MC-2); an unknown name is a
  JSON-RPC error (MC-5).

Transport: the official `mcp` SDK's low-level `Server` behind its
`StreamableHTTPSessionManager` in stateless JSON mode, so any web process can answer
any request (no session affinity between ASGI workers). That side lives in
`toolcatalog.mcp_protocol`, loaded by a process's first /mcp request.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, connections
from rest_framework.authtoken.models import Token

from controlcenter.lockout import lockout_message, record_token_failure, request_for_scope, token_locked_out
from engine.catalog.ranking import ToolIndex, index_for, query_too_long
from engine.catalog.surface import ModeSpec, ToolRecord, build_surface
from engine.catalog.toolbox import CallLimiter, CatalogToolBox, Observation, search_tool_bm25
from toolcatalog.selectors import catalog_records, mcp_catalog_records
from toolcatalog.services import mcp_session_end, mcp_session_take_call
from toolcatalog.toolbox import builtin_executor, search_index
from toolcatalog.workspace import mcp_workspace_root

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

logger = logging.getLogger(__name__)

MCP_PATH = "/mcp"
SEARCH_TOOL = "search_tool_bm25"
USER_SCOPE_KEY = "controlcenter.user_id"
SESSION_SCOPE_KEY = "controlcenter.mcp_session"
SESSION_HEADER = b"mcp-session-id"
IMPLICIT_SESSION = "~"  # never a valid header value, so no client can name it
_SESSION_ID = re.compile(r"^[0-9A-Za-z_-]{1,64}$")

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
        "additionalProperties": False,
    },
    "resident": True,
    "requires_approval": False,
    "side_effects": "none",
}


# --- the surface ------------------------------------------------------------------


def _record_dict(record: ToolRecord) -> dict[str, Any]:
    return {
        "name": record.name,
        "group": record.group,
        "description": record.description,
        "input_schema": record.input_schema,
        "resident": record.resident,
        "requires_approval": record.requires_approval,
        "side_effects": record.side_effects,
        "source": record.source,
    }


def mcp_tool_list() -> list[dict[str, Any]]:
    """Every tool an MCP client sees, in catalog-record form, by name, then search_tool_bm25.

    The whole enabled catalog (the built-ins when the catalog is empty), untouched
    by deferral and modes (TD-9).
    """
    return [*(_record_dict(record) for record in mcp_catalog_records()), SEARCH_TOOL_RECORD]


def _records_from_dicts(tools: list[dict[str, Any]]) -> list[ToolRecord]:
    return [
        ToolRecord(
            name=tool["name"],
            group=tool.get("group", ""),
            description=tool.get("description", ""),
            input_schema=tool.get("input_schema", {}),
        )
        for tool in tools
        if tool["name"] != SEARCH_TOOL
    ]


def rank_tools(query: str, tools: list[dict[str, Any]] | None = None, limit: int = 5) -> list[dict[str, Any]]:
    """The catalog's BM25 ranking (engine/catalog/ranking.py), matches described only (TD-7).

    Without `tools` it ranks the MCP surface with the very index a run uses,
    built once per catalog version; `tools` (catalog-record dicts) ranks those
    instead, as the benchmark does.
    """
    if tools is None:
        index, allowed = _catalog_index()
    else:
        index, allowed = index_for(_records_from_dicts(tools)), None
    return search_tool_bm25(index, query, allowed=allowed, limit=limit)["matches"]


def _catalog_index() -> tuple[ToolIndex, frozenset[str]]:
    # The runtime indexes catalog_records(); sharing that index (and its cache entry)
    # keeps search_tools and search_tool_bm25 ranking alike (TD-7).
    records = catalog_records()
    return search_index(records), frozenset(record.name for record in mcp_catalog_records(records))


def search_observation(arguments: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(arguments) - {"query", "limit"})
    if unknown:
        # A misspelt option (`limt`) was dropped and the search answered as if it were not sent (QA).
        return {"ok": False, "error": f"Unknown argument {', '.join(unknown)}: {SEARCH_TOOL} takes query and limit."}
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        return {"ok": False, "error": "query must be a non-empty string describing the tool you need."}
    too_long = query_too_long(query)
    if too_long:
        return {"ok": False, "error": too_long}
    limit = arguments.get("limit", 5)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 50:
        return {"ok": False, "error": "limit must be an integer from 1 to 50."}
    index, allowed = _catalog_index()
    observation = search_tool_bm25(index, query, allowed=allowed, limit=limit)
    if not observation["matches"]:
        observation["message"] = (
            f"No tool on this server matches {query!r}. Rephrase it with other words for the action or the "
            "object, or describe the task more broadly; tools/list shows every tool."
        )
    return observation


def mcp_approval(tool: ToolRecord, arguments: dict[str, Any]) -> Observation | None:
    """The run's approval rule without a person to ask: only operator-approved tools run."""
    if tool.name in settings.CC_TOOL_AUTO_APPROVE:
        return None
    return {
        "ok": False,
        "approval_required": True,
        "error": (
            f"{tool.name} requires a person's approval, and MCP calls have no approval prompt yet: over MCP "
            "it runs only if an operator lists it in CC_TOOL_AUTO_APPROVE. It did not run."
        ),
    }


def _session_limiter(user_id: int, session_key: str | None) -> CallLimiter:
    # Without a session id (the sessionless 2026 protocol, or a client that drops it) the
    # caller's calls form one implicit session per user that ends after an idle period.
    key = session_key or IMPLICIT_SESSION

    def take(name: str, limit: int) -> str | None:
        if mcp_session_take_call(user_id=user_id, session_key=key, tool_name=name, limit=limit):
            return None
        refused = f"{name} may be called at most {limit} times in one session."
        if session_key:
            return refused
        # QA: a new client was refused at its first call, with no word of what it shared.
        minutes = max(1, settings.CC_MCP_SESSION_IDLE_SECONDS // 60)
        return (
            f"{refused} Calls without an Mcp-Session-Id header share one session per user, from every client, "
            f"which ends once none has come for {minutes} minutes."
        )

    return take


class UnknownMcpTool(LookupError):
    """The name is not on the MCP surface: the protocol answers a JSON-RPC error, not a tool result (MC-5)."""


def mcp_execute(
    *, user_id: int, name: str, arguments: dict[str, Any], session_key: str | None = None
) -> dict[str, Any]:
    """Run one tool for an MCP caller as a run would: same validation, approval and limits.

    Action limits (`max_calls_per_run`) count per MCP session (the Mcp-Session-Id of a
    handshake-era client; otherwise one implicit session per user that ends when idle).
    Imported MCP tools are forwarded to their servers like in a run (MC-2). An observation,
    or UnknownMcpTool for a name that is not listed.
    """
    if name == SEARCH_TOOL:
        return search_observation(arguments)
    records = mcp_catalog_records()
    if not any(record.name == name for record in records):
        raise UnknownMcpTool(f"Unknown tool: {name!r}; tools/list shows the tools of this server.")
    toolbox = CatalogToolBox(
        surface=build_surface(records, ModeSpec(), deferral=False),
        index=lambda: index_for(records),
        executor=builtin_executor(mcp_workspace_root(user_id), user_id=user_id),
        approve=mcp_approval,
        limiter=_session_limiter(user_id, session_key),
    )
    return toolbox.execute(name, arguments)


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
        if user_id is None:
            await _unauthorized(send, problem)
            return
        scope[USER_SCOPE_KEY] = user_id
        session_key, problem = _session_header(scope)
        if problem:
            await _plain_response(send, 400, problem)
            return
        method = scope.get("method", "")
        if method == "GET":
            # Stateless: there is no server-to-client stream to hold open.
            await _plain_response(send, 405, "This MCP server sends no server-initiated messages; use POST.")
            return
        if method == "DELETE" and session_key is not None:
            await sync_to_async(_end_session, thread_sensitive=False)(user_id, session_key)
            await _plain_response(send, 204, "")
            return
        if method == "POST":
            if _media_type(scope) != "application/json":
                # The SDK answered this with a plain-text 400 that a JSON-RPC client cannot parse (QA).
                await _plain_response(send, 415, "Send the JSON-RPC message with Content-Type: application/json.")
                return
            body = await _read_body(receive)
            if body is None:
                return  # the client left
            message = _parsed(body)
            problem = _not_one_request(message)
            if problem:
                await _plain_response(send, 400, problem)
                return
            request_id, problem = _bad_tool_call(message)
            if problem:
                await _invalid_params(send, request_id, problem)
                return
            receive = _replaying(body, receive)
        scope[SESSION_SCOPE_KEY] = session_key
        if session_key is None:
            send = _offering_session(send)
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
            # The SDK takes over a CPU second to import: the first /mcp request of a process loads
            # it, not the start of every web process, and in a thread, so that the event loop goes on
            # answering meanwhile (on the loop it held /healthz for 2.7 s).
            protocol = await asyncio.to_thread(importlib.import_module, "toolcatalog.mcp_protocol")
            manager = protocol.session_manager()
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


# --- MCP sessions: only what per-session action limits need ---------------------------
#
# The SDK runs stateless here (any process answers any request), so it issues no
# session ids. We offer one on each response to a request that has none; a
# handshake-era client keeps the one from its initialize response and sends it
# back. Calls of limited tools are counted per (user, session) in the database.
# The 2026 protocol has no sessions at all: its calls share one implicit session
# per user (see `_session_limiter`).


def _session_header(scope: dict) -> tuple[str | None, str]:
    for name, value in scope.get("headers", []):
        if name == SESSION_HEADER:
            key = value.decode("latin-1").strip()
            if not _SESSION_ID.fullmatch(key):
                return None, "Malformed Mcp-Session-Id header: 1-64 letters, digits, '-' or '_'."
            return key, ""
    return None, ""


def _offering_session(send: Any) -> Any:
    offered = uuid.uuid4().hex.encode()

    async def send_with_session(message: dict) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != SESSION_HEADER]
            message = {**message, "headers": [*headers, (SESSION_HEADER, offered)]}
        await send(message)

    return send_with_session


def _end_session(user_id: int, session_key: str) -> None:
    close_old_connections()
    try:
        mcp_session_end(user_id=user_id, session_key=session_key)
    finally:
        connections.close_all()


async def _read_body(receive: Any) -> bytes | None:
    """The whole body (BodySizeLimit has bounded it), or None when the client disconnects."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


_UNPARSED = object()


def _parsed(body: bytes) -> Any:
    """The body as JSON, or _UNPARSED: what does not parse is left to the SDK's -32700."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return _UNPARSED


def _not_one_request(message: Any) -> str:
    """Why the parsed body is not one JSON-RPC message, or "" when the SDK should have it.

    The SDK answers these with -32602 and a kilobyte of pydantic's validation text; JSON-RPC
    calls them an Invalid Request (-32600).
    """
    if message is _UNPARSED:
        return ""
    if isinstance(message, list):
        return "Batches are not supported: send one JSON-RPC message per request."
    if not isinstance(message, dict):
        return "The body must be one JSON-RPC message, a JSON object."
    if message.get("jsonrpc") != "2.0":
        return 'A JSON-RPC message needs "jsonrpc": "2.0".'
    if "method" not in message and not ("id" in message and ("result" in message or "error" in message)):
        return 'A JSON-RPC request needs a "method"; a response, an "id" and a "result" or an "error".'
    if "method" in message:
        if not isinstance(message["method"], str) or not message["method"]:
            return 'A JSON-RPC "method" is a non-empty string.'
        if "params" in message and not isinstance(message["params"], dict):
            return 'MCP "params" are a JSON object.'
        # Any other id was dropped with a 202 and no answer: its client waited for ever (QA).
        ident = message.get("id", 0)
        if isinstance(ident, bool) or not isinstance(ident, str | int):
            return 'A JSON-RPC request "id" is a string or an integer.'
    return ""


def _bad_tool_call(message: Any) -> tuple[Any, str]:
    """A tools/call whose params name no tool or whose arguments are not an object: its id and why;
    ("", "") for anything else. The SDK answered these "Invalid request parameters", naming nothing."""
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return "", ""
    params = message.get("params")
    if not isinstance(params, dict) or not isinstance(params.get("name"), str) or not params["name"]:
        return message.get("id"), 'tools/call needs "params" with "name", the tool\'s name as a string.'
    if params.get("arguments") is not None and not isinstance(params["arguments"], dict):
        return message.get("id"), 'tools/call "arguments" are a JSON object of the tool\'s parameters.'
    return "", ""


async def _invalid_params(send: Any, request_id: Any, message: str) -> None:
    """JSON-RPC's Invalid params (-32602) answering the request, as the SDK's own errors do (HTTP 200)."""
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _media_type(scope: dict) -> str:
    for name, value in scope.get("headers", []):
        if name == b"content-type":
            return value.decode("latin-1").partition(";")[0].strip().lower()
    return ""


def _replaying(body: bytes, receive: Any) -> Any:
    """`receive` for the SDK: the body already read, then the client's own (its disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> dict:
        return pending.pop() if pending else await receive()

    return replay


def jsonrpc_error_body(code: int, message: str) -> bytes:
    """A JSON-RPC error that answers no request in particular: what /mcp clients parse."""
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}).encode()


async def _plain_response(send: Any, status: int, message: str) -> None:
    body = jsonrpc_error_body(-32600, message)
    body = body if status != 204 else b""
    headers = [(b"content-length", str(len(body)).encode())]
    if body:
        headers.append((b"content-type", b"application/json"))
    if status == 405:
        headers.append((b"allow", b"POST, DELETE"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _token_key(scope: dict) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, key = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() in ("bearer", "token") and key.strip():
                return key.strip()
            return ""
    return None


def _user_for_token(key: str) -> int | None:
    token = Token.objects.select_related("user").filter(key=key).first()
    return token.user_id if token is not None and token.user.is_active else None


async def authenticate(scope: dict) -> tuple[int | None, str]:
    """The user id for the request's DRF token, or a reason to refuse it."""
    key = _token_key(scope)
    if key is None:
        return None, "Authentication required: send 'Authorization: Bearer <token>' with your API token."
    if key == "" or len(key) > 128:
        return None, "Malformed Authorization header: use 'Bearer <token>' or 'Token <token>'."
    return await sync_to_async(_check_token, thread_sensitive=False)(scope, key)


def _check_token(scope: dict, key: str) -> tuple[int | None, str]:
    # Wrong tokens count towards the same lockout as the REST API's (SB-5).
    request = request_for_scope(scope)
    close_old_connections()
    try:
        user_id = _user_for_token(key)
        if user_id is not None:
            return user_id, ""  # a valid token is never locked out (controlcenter/lockout.py)
        if token_locked_out(request):
            return None, lockout_message()
        record_token_failure(request)
        return None, "Invalid or inactive API token."
    finally:
        connections.close_all()


async def _unauthorized(send: Any, message: str) -> None:
    body = jsonrpc_error_body(-32001, message)
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
