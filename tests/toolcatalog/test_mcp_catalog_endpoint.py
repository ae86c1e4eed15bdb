"""The MCP endpoint serves the tool catalog: full list, the catalog's BM25 index, run rules (TD-7, TD-9)."""

from __future__ import annotations

from datetime import timedelta

import anyio
import httpx
import httpx2
import pytest
from django.utils import timezone
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from rest_framework.authtoken.models import Token

from engine.catalog.ranking import index_for
from engine.catalog.toolbox import DISCOVERY_TOOLS
from tests.support.catalog import CATALOG_PATH
from tests.support.mcp_servers import fixtures as live
from toolcatalog.mcp_server import SEARCH_TOOL, _catalog_index, mcp_tool_list
from toolcatalog.models import McpCallCount, McpServer, Tool, ToolGroup
from toolcatalog.selectors import catalog_records
from toolcatalog.services import catalog_import, catalog_load_builtins
from toolcatalog.toolbox import run_toolbox

pytestmark = pytest.mark.django_db(transaction=True)

server_url = live.server_url
workspaces = live.workspaces


@pytest.fixture
def alice_token(alice) -> str:
    return Token.objects.create(user=alice).key


@pytest.fixture
def reference_catalog() -> None:
    catalog_import(text=CATALOG_PATH.read_text(encoding="utf-8"))


def _run(url: str, token: str, steps, mode: str = "auto"):
    async def main():
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
        async with http, Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            return await steps(client)

    return anyio.run(main)


def _mcp_server_tool(name: str, server: str = "weather") -> Tool:
    mcp = McpServer.objects.create(name=server, transport="stdio", command="weather-server")
    group, _ = ToolGroup.objects.get_or_create(heading=server, defaults={"order": 99})
    return Tool.objects.create(
        name=name,
        group=group,
        description="Weather forecast for a city, day by day.",
        input_schema={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        source=Tool.Source.MCP,
        server=mcp,
    )


@pytest.mark.req("TD-9")
def test_tools_list_returns_the_whole_enabled_catalog_with_deferred_schemas(server_url, alice_token, reference_catalog):
    forecast = _mcp_server_tool("get_forecast")
    Tool.objects.filter(name="create_ticket").update(enabled=False)
    listed = _run(server_url, alice_token, lambda client: client.list_tools()).tools
    names = [tool.name for tool in listed]
    expected = sorted(
        tool.qualified_name
        for tool in Tool.objects.filter(enabled=True).select_related("server")
        if tool.name not in DISCOVERY_TOOLS
    )
    assert names == [*expected, SEARCH_TOOL]
    assert "weather__get_forecast" in names and "create_ticket" not in names
    # search_tools and describe_tool belong to the built-in runtime only (TD-7).
    assert not set(DISCOVERY_TOOLS) & set(names)
    by_name = {tool.name: tool for tool in listed}
    deferred = Tool.objects.filter(resident=False, enabled=True, server__isnull=True)
    assert deferred.count() > 50
    for tool in deferred:
        assert by_name[tool.name].input_schema == tool.input_schema
        assert by_name[tool.name].description == tool.description
    assert by_name["bash"].meta["controlcenter/requires_approval"] is True
    # A disabled server's tools leave the listing with it.
    McpServer.objects.filter(pk=forecast.server_id).update(enabled=False)
    assert "weather__get_forecast" not in [record["name"] for record in mcp_tool_list()]


@pytest.mark.req("TD-9")
def test_an_empty_catalog_lists_the_built_ins(server_url, alice_token):
    listed = _run(server_url, alice_token, lambda client: client.list_tools()).tools
    assert "read_file" in [tool.name for tool in listed] and listed[-1].name == SEARCH_TOOL


@pytest.mark.req("TD-7")
def test_search_tool_bm25_ranks_with_the_runs_index_and_only_describes(
    server_url, alice_token, reference_catalog, tmp_path
):
    query = "open a pull request for my branch"

    async def steps(client):
        return await client.call_tool(SEARCH_TOOL, {"query": query, "limit": 5})

    found = _run(server_url, alice_token, steps)
    assert found.is_error is False
    matches = found.structured_content["matches"]
    assert all(set(match) == {"name", "group", "description"} for match in matches)
    # The same ranking a run's search_tools gives, from the same cached index object.
    toolbox = run_toolbox(workspace=tmp_path, deferral=False)
    loaded = toolbox.execute("search_tools", {"query": query, "limit": 5})
    assert [match["name"] for match in matches] == [match["name"] for match in loaded["matches"]]
    assert _catalog_index()[0] is index_for(catalog_records()) is toolbox._index()
    assert matches[0]["name"] == "create_pull_request"


@pytest.mark.req("TD-7")
def test_search_tool_bm25_never_returns_runtime_only_discovery_tools(server_url, alice_token, reference_catalog):
    async def steps(client):
        return await client.call_tool(SEARCH_TOOL, {"query": "search for tools by what they do", "limit": 10})

    names = [match["name"] for match in _run(server_url, alice_token, steps).structured_content["matches"]]
    assert names and not set(DISCOVERY_TOOLS) & set(names)


@pytest.mark.req("TD-9")
def test_a_listed_tool_this_installation_cannot_run_is_a_clear_error(server_url, alice_token, reference_catalog):
    _mcp_server_tool("get_forecast")

    async def steps(client):
        imported = await client.call_tool(
            "create_ticket", {"project": "OPS", "issue_type": "bug", "summary": "Disk full"}
        )
        relayed = await client.call_tool("weather__get_forecast", {"city": "Oslo"})
        try:
            await client.call_tool("search_tools", {"query": "tickets"})
            runtime_only = None
        except MCPError as exc:
            runtime_only = exc
        return imported, relayed, runtime_only

    imported, relayed, runtime_only = _run(server_url, alice_token, steps)
    assert imported.is_error is True
    assert "create_ticket is in the catalog but has no implementation" in imported.structured_content["error"]
    # The imported tool is forwarded (MC-2): its server's command does not exist, which the error says.
    error = relayed.structured_content["error"]
    assert relayed.is_error is True and "MCP server 'weather' could not be started" in error
    assert runtime_only is not None and "Unknown tool: 'search_tools'" in runtime_only.message


@pytest.mark.req("TD-8")
def test_tools_call_keeps_the_catalogs_approval_flag_and_the_operator_gate(
    server_url, alice_token, workspaces, settings
):
    catalog_load_builtins()
    # The catalog, not the built-in definition, decides: the operator made write_file need approval.
    Tool.objects.filter(name="write_file").update(requires_approval=True)

    async def write(client):
        return await client.call_tool("write_file", {"path": "a.txt", "content": "x"})

    refused = _run(server_url, alice_token, write)
    assert refused.is_error is True and refused.structured_content["approval_required"] is True
    assert "CC_TOOL_AUTO_APPROVE" in refused.structured_content["error"]
    assert not any(workspaces.rglob("a.txt"))
    settings.CC_TOOL_AUTO_APPROVE = ["write_file"]
    assert _run(server_url, alice_token, write).is_error is False
    assert len(list(workspaces.rglob("a.txt"))) == 1


async def _three_todo_adds(client):
    return [await client.call_tool("todo_add", {"items": [{"content": f"item {n}"}]}) for n in range(3)]


@pytest.mark.req("TD-8")
def test_action_limits_count_per_handshake_session(server_url, alice, alice_token, workspaces):
    catalog_load_builtins()
    Tool.objects.filter(name="todo_add").update(max_calls_per_run=2)
    first_session = _run(server_url, alice_token, _three_todo_adds, mode="legacy")
    assert [result.is_error for result in first_session] == [False, False, True]
    assert "at most 2 times in one session" in first_session[2].structured_content["error"]
    # The refused call did not run.
    assert alice.todo_items.count() == 2
    # The client ended its session (DELETE): its counts are gone; a new session starts afresh.
    assert McpCallCount.objects.count() == 0
    second_session = _run(server_url, alice_token, _three_todo_adds, mode="legacy")
    assert [result.is_error for result in second_session] == [False, False, True]
    assert alice.todo_items.count() == 4


@pytest.mark.req("TD-8")
def test_sessionless_calls_share_one_implicit_session_per_user_until_it_idles(
    server_url, alice, alice_token, bob, workspaces, settings
):
    catalog_load_builtins()
    Tool.objects.filter(name="todo_add").update(max_calls_per_run=2)
    # The 2026 protocol has no sessions: two connections of one user share the count...
    assert [r.is_error for r in _run(server_url, alice_token, _three_todo_adds)] == [False, False, True]
    another_client = _run(server_url, alice_token, _three_todo_adds)
    assert [r.is_error for r in another_client] == [True, True, True]
    # ...and a client refused at its first call is told what it shares, and until when.
    assert (
        "share one session per user, from every client, which ends once none has come for"
        in (another_client[0].structured_content["error"])
    )
    # ...which is the user's own: bob has his.
    bob_token = Token.objects.create(user=bob).key
    assert [r.is_error for r in _run(server_url, bob_token, _three_todo_adds)] == [False, False, True]
    # After CC_MCP_SESSION_IDLE_SECONDS without a counted call the implicit session is over.
    McpCallCount.objects.update(updated_at=timezone.now() - timedelta(seconds=settings.CC_MCP_SESSION_IDLE_SECONDS + 1))
    assert [r.is_error for r in _run(server_url, alice_token, _three_todo_adds)] == [False, False, True]
    assert alice.todo_items.count() == 4


@pytest.mark.req("TD-8")
def test_a_session_id_header_scopes_the_count_and_a_malformed_one_is_refused(server_url, alice_token, workspaces):
    catalog_load_builtins()
    Tool.objects.filter(name="todo_list").update(max_calls_per_run=1)
    headers = {
        "Authorization": f"Bearer {alice_token}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "todo_list", "arguments": {}}}
    sessionless = httpx.post(server_url, json=call, headers=headers, timeout=10)
    assert sessionless.json()["result"]["isError"] is False
    assert sessionless.headers["mcp-session-id"]  # offered for a handshake-era client
    for key, refused in [("abc123", False), ("abc123", True), ("def456", False)]:
        response = httpx.post(server_url, json=call, headers={**headers, "Mcp-Session-Id": key}, timeout=10)
        assert response.json()["result"]["isError"] is refused, key
    malformed = httpx.post(server_url, json=call, headers={**headers, "Mcp-Session-Id": "a b/c"}, timeout=10)
    assert malformed.status_code == 400 and "Mcp-Session-Id" in malformed.json()["error"]["message"]
    assert McpCallCount.objects.count() == 3
