"""The MCP protocol side of /mcp: the official SDK's low-level `Server` and its Streamable HTTP
session manager (stateless, JSON responses), with the catalog's list and call handlers.

`toolcatalog.mcp_server` authenticates and routes; it imports this module on the first /mcp
request of a process.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, connections
from mcp import MCPError
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from engine.actions import ATTACHED_IMAGES, LOADS_TOOLS
from toolcatalog.mcp_server import SESSION_SCOPE_KEY, USER_SCOPE_KEY, UnknownMcpTool, mcp_execute, mcp_tool_list

_META_PREFIX = "controlcenter/"


def session_manager() -> StreamableHTTPSessionManager:
    return StreamableHTTPSessionManager(
        app=build_server(), stateless=True, json_response=True, security_settings=_security_settings()
    )


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


def _call_in_thread(user_id: int, session_key: str | None, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    close_old_connections()
    try:
        return mcp_execute(user_id=user_id, session_key=session_key, name=name, arguments=arguments)
    finally:
        # Worker threads come and go: never leave a database connection behind.
        connections.close_all()


async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    scope = getattr(ctx.request, "scope", None) or {}
    user_id = scope.get(USER_SCOPE_KEY)
    if user_id is None:
        observation: dict[str, Any] = {"ok": False, "error": "This call carries no authenticated user."}
    else:
        try:
            observation = await sync_to_async(_call_in_thread, thread_sensitive=False)(
                user_id, scope.get(SESSION_SCOPE_KEY), params.name, dict(params.arguments or {})
            )
        except UnknownMcpTool as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from None
    images = observation.pop(ATTACHED_IMAGES, None) or []
    observation.pop(LOADS_TOOLS, None)
    content: list[Any] = [
        types.TextContent(type="text", text=json.dumps(observation, sort_keys=True, ensure_ascii=False))
    ]
    content += [
        types.ImageContent(type="image", data=image["source"]["data"], mime_type=image["source"]["media_type"])
        for image in images
    ]
    return types.CallToolResult(
        content=content, structured_content=observation, is_error=observation.get("ok") is False
    )


def build_server() -> Server:
    return Server(
        "controlcenter",
        version="0.1.0",
        instructions=(
            "Control Center's tool catalog. Call search_tool_bm25 to find a tool by what it does; "
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
