"""Importing an external MCP server's tools into the catalog (TD-1), with name collisions ranked apart."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from engine.catalog.ranking import index_for
from toolcatalog import services
from toolcatalog.models import McpServer, Tool, ToolGroup
from toolcatalog.selectors import catalog_records
from toolcatalog.services import McpServerImportFailed, mcp_server_import

pytestmark = pytest.mark.django_db

SERVERS = Path(__file__).parent.parent / "support" / "mcp_servers"


def _args(script: str, *extra: str) -> list[str]:
    return [str(SERVERS / script), *extra]


@pytest.fixture
def weather() -> McpServer:
    return McpServer.objects.create(
        name="weather", transport="stdio", command=sys.executable, args=_args("weather_server.py")
    )


@pytest.fixture
def almanac() -> McpServer:
    return McpServer.objects.create(
        name="almanac", transport="stdio", command=sys.executable, args=_args("almanac_server.py")
    )


def _snapshot() -> list[tuple]:
    return list(
        Tool.objects.order_by("pk").values_list(
            "name", "server__name", "group__heading", "description", "input_schema", "enabled", "server_missing"
        )
    )


@pytest.mark.req("TD-1")
def test_a_servers_tools_become_namespaced_mcp_tools_under_its_group(weather):
    result = mcp_server_import(server=weather)
    assert (result.created, result.updated, result.unchanged, result.disabled, result.refused) == (2, 0, 0, 0, [])
    tools = {tool.qualified_name: tool for tool in Tool.objects.select_related("group", "server")}
    assert set(tools) == {"weather__get_forecast", "weather__read_file"}
    forecast = tools["weather__get_forecast"]
    assert forecast.source == Tool.Source.MCP and forecast.server == weather
    assert forecast.group.heading == "weather"
    assert forecast.description == "Weather forecast for a city, day by day."
    assert forecast.input_schema["required"] == ["city"]
    assert forecast.resident is False and forecast.enabled is True
    # The server's read_file does not shadow the built-in: it is weather__read_file.
    assert {record.name for record in catalog_records()} == set(tools)


@pytest.mark.req("TD-1")
def test_importing_twice_changes_nothing_and_keeps_the_operators_choices(weather):
    mcp_server_import(server=weather)
    Tool.objects.filter(name="get_forecast").update(resident=True, requires_approval=True, max_calls_per_run=3)
    Tool.objects.filter(name="read_file").update(enabled=False)
    before = _snapshot()
    again = mcp_server_import(server=weather)
    assert (again.created, again.updated, again.unchanged, again.disabled) == (0, 0, 2, 0)
    assert _snapshot() == before
    forecast = Tool.objects.get(name="get_forecast")
    assert (forecast.resident, forecast.requires_approval, forecast.max_calls_per_run) == (True, True, 3)
    # Disabled by the operator while the server still lists it: it stays disabled.
    assert Tool.objects.get(name="read_file").enabled is False
    assert ToolGroup.objects.filter(heading="weather").count() == 1


@pytest.mark.req("TD-1")
def test_a_tool_the_server_dropped_is_disabled_not_deleted_and_comes_back(almanac):
    first = mcp_server_import(server=almanac)
    assert first.created == 2
    almanac.args = _args("almanac_server.py", "--without", "moon_phase")
    almanac.save()
    dropped = mcp_server_import(server=almanac)
    assert (dropped.disabled, dropped.unchanged) == (1, 1)
    moon = Tool.objects.get(server=almanac, name="moon_phase")
    assert moon.enabled is False and moon.server_missing is True
    assert "almanac__moon_phase" not in {record.name for record in catalog_records()}
    almanac.args = _args("almanac_server.py")
    almanac.save()
    back = mcp_server_import(server=almanac)
    assert (back.updated, back.unchanged, back.disabled) == (1, 1, 0)
    moon.refresh_from_db()
    assert moon.enabled is True and moon.server_missing is False


@pytest.mark.req("TD-1")
def test_a_tool_with_an_invalid_name_is_refused_by_name_and_the_others_are_imported(almanac):
    result = mcp_server_import(server=almanac)
    assert len(result.refused) == 1
    assert "tide.table" in result.refused[0] and "letters, digits" in result.refused[0]
    assert "refused" in result.summary() and "tide.table" in result.summary()
    assert set(Tool.objects.values_list("name", flat=True)) == {"get_forecast", "moon_phase"}


@pytest.mark.req("TD-1")
def test_an_unreachable_server_is_a_clear_error_and_changes_nothing(weather):
    mcp_server_import(server=weather)
    before = _snapshot()
    weather.command, weather.args = "/nonexistent/weather-server", ["--stdio"]
    weather.save()
    with pytest.raises(McpServerImportFailed, match="weather.*Nothing was changed"):
        mcp_server_import(server=weather)
    assert _snapshot() == before
    weather.command, weather.args, weather.env = sys.executable, _args("weather_server.py"), {"T": "${CC_UNSET_VAR}"}
    with pytest.raises(McpServerImportFailed, match=r"weather.*CC_UNSET_VAR.*not set"):
        mcp_server_import(server=weather)
    assert _snapshot() == before


@pytest.mark.req("TD-1")
@pytest.mark.req("TD-7")
def test_equal_names_from_two_servers_stay_distinct_and_are_ranked_as_distinct_tools(weather, almanac):
    mcp_server_import(server=weather)
    mcp_server_import(server=almanac)
    assert Tool.objects.filter(name="get_forecast").count() == 2
    records = catalog_records()
    names = [record.name for record in records]
    assert "weather__get_forecast" in names and "almanac__get_forecast" in names
    found = [match.tool.name for match in index_for(records).search("forecast", k=5)]
    assert set(found[:2]) == {"weather__get_forecast", "almanac__get_forecast"}
    # Each one's own description decides where it ranks.
    assert index_for(records).search("city weather day by day", k=1)[0].tool.name == "weather__get_forecast"
    assert index_for(records).search("seasonal almanac region", k=1)[0].tool.name == "almanac__get_forecast"


@pytest.mark.req("TD-1")
def test_the_import_mcp_command_imports_and_names_unknown_servers(weather, capsys):
    call_command("catalog", "import-mcp", "weather")
    out = capsys.readouterr().out
    assert "weather: 2 tools added (get_forecast, read_file), 0 changed, 0 unchanged, 0 removed" in out
    call_command("catalog", "import-mcp", "weather")
    assert "0 tools added, 0 changed, 2 unchanged, 0 removed" in capsys.readouterr().out
    with pytest.raises(CommandError, match="no MCP server named 'ghost'.*weather"):
        call_command("catalog", "import-mcp", "ghost")
    weather.command = "/nonexistent/weather-server"
    weather.save()
    with pytest.raises(CommandError, match="weather"):
        call_command("catalog", "import-mcp", "weather")


@pytest.mark.req("TD-1")
def test_the_admin_action_imports_the_selected_servers(admin_client, weather, almanac):
    response = admin_client.post(
        "/admin/toolcatalog/mcpserver/",
        {"action": "import_tools", "index": 0, "_selected_action": [weather.pk, almanac.pk]},
        follow=True,
    )
    assert response.status_code == 200
    text = response.content.decode().lower()  # the admin capitalises messages
    assert "weather: 2 tools added" in text
    assert "almanac: 2 tools added" in text and "tide.table" in text
    assert Tool.objects.filter(source=Tool.Source.MCP).count() == 4


@pytest.mark.req("MC-1")
def test_a_server_saved_by_another_request_while_this_one_listed_its_tools_is_a_clear_refusal(admin_user, monkeypatch):
    """QA: three parallel creations of one name gave one 201 and two 500s (IntegrityError): the
    name is checked, then the tools are listed for seconds, then the row is inserted."""

    def listed_while_another_request_saves(server: McpServer) -> list:
        McpServer.objects.create(name=server.name, transport="stdio", command="/bin/true", enabled=False)
        return []

    monkeypatch.setattr(services, "mcp_server_listing", listed_while_another_request_saves)
    client = APIClient()
    client.force_authenticate(admin_user)
    answer = client.post(
        "/api/mcp-servers/", {"name": "twice", "transport": "stdio", "command": sys.executable}, format="json"
    )
    assert answer.status_code == 400, answer.content
    assert "There is already an MCP server named 'twice'" in answer.json()["error"]["message"]
    assert list(McpServer.objects.values_list("name", "command")) == [("twice", "/bin/true")]
