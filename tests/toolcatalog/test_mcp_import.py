"""Importing tool lists from external MCP servers over stdio and Streamable HTTP (TD-1)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rest_framework.authtoken.models import Token

from tests.support.mcp_servers import fixtures as live
from toolcatalog.builtins import BUILTINS
from toolcatalog.mcp_import import list_server_tools
from toolcatalog.mcp_server import SEARCH_TOOL
from toolcatalog.mcp_spec import ImportedTool, McpImportError, McpServerSpec

WEATHER_SERVER = Path(__file__).parent.parent / "support" / "mcp_servers" / "weather_server.py"

# The live ASGI server (uvicorn in a thread) and the workspace root it uses.
server_url = live.server_url
workspaces = live.workspaces


def _weather() -> McpServerSpec:
    return McpServerSpec(name="weather", transport="stdio", command=sys.executable, args=[str(WEATHER_SERVER)])


@pytest.mark.req("TD-1")
def test_a_stdio_servers_tools_come_back_as_plain_records():
    tools = list_server_tools(_weather())
    assert [tool.name for tool in tools] == ["get_forecast", "read_file"]
    forecast = tools[0]
    assert isinstance(forecast, ImportedTool)
    assert forecast.server == "weather"
    assert forecast.description == "Weather forecast for a city, day by day."
    assert forecast.input_schema["required"] == ["city"]
    assert set(forecast.input_schema["properties"]) == {"city", "days"}
    # A name that collides with a built-in still comes back, tagged with its server.
    assert tools[1].name in BUILTINS and tools[1].server == "weather"


@pytest.mark.req("TD-1")
def test_an_unreachable_server_is_a_clear_error():
    missing = McpServerSpec(name="ghost", transport="stdio", command="/nonexistent/mcp-server")
    with pytest.raises(McpImportError, match="ghost"):
        list_server_tools(missing)
    crashing = McpServerSpec(
        name="crash", transport="stdio", command=sys.executable, args=["-c", "raise SystemExit(3)"], timeout_seconds=5
    )
    with pytest.raises(McpImportError, match="crash"):
        list_server_tools(crashing)
    with pytest.raises(McpImportError, match="http"):
        list_server_tools(McpServerSpec(name="bad", transport="http", url="ftp://example.com/mcp"))


@pytest.mark.req("TD-1")
@pytest.mark.django_db(transaction=True)
def test_an_http_servers_tools_are_imported_with_its_auth_header(alice, server_url):
    token = Token.objects.create(user=alice).key
    spec = McpServerSpec(
        name="controlcenter", transport="http", url=server_url, headers={"Authorization": f"Bearer {token}"}
    )
    names = [tool.name for tool in list_server_tools(spec)]
    assert names == [*sorted(BUILTINS), SEARCH_TOOL]
    refused = McpServerSpec(name="controlcenter", transport="http", url=server_url, headers={}, timeout_seconds=5)
    with pytest.raises(McpImportError, match="controlcenter"):
        list_server_tools(refused)
