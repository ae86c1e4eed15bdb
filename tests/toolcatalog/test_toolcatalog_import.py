"""Catalog files in and out, schema checks on save, and the admin (TD-1)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from tests.support.catalog import CATALOG_PATH, reference_catalog
from toolcatalog.models import McpServer, Mode, Tool, ToolGroup
from toolcatalog.services import CatalogFileInvalid, catalog_export, catalog_import

pytestmark = pytest.mark.django_db


def _snapshot() -> list[tuple]:
    return list(Tool.objects.order_by("name").values_list("name", "description", "input_schema", "resident"))


@pytest.mark.req("TD-1")
def test_import_loads_the_reference_catalog_and_is_idempotent():
    out = StringIO()
    call_command("catalog", "import", str(CATALOG_PATH), stdout=out)
    assert "126 tools created" in out.getvalue()
    assert Tool.objects.count() == 126
    assert Tool.objects.filter(resident=True).count() == 24
    assert ToolGroup.objects.get(heading="Tickets and projects").order == 3
    assert Tool.objects.get(name="bash").requires_approval is True
    # Entries the installation implements itself are built-ins; the rest are imported.
    assert Tool.objects.get(name="list_dir").source == "built-in"
    assert Tool.objects.get(name="create_ticket").source == "imported"
    before = _snapshot()
    again = StringIO()
    call_command("catalog", "import", str(CATALOG_PATH), stdout=again)
    assert "0 tools created, 0 updated, 126 unchanged" in again.getvalue()
    assert _snapshot() == before


@pytest.mark.req("TD-1")
def test_import_refuses_a_file_with_one_bad_tool_naming_its_line_and_changes_nothing(tmp_path):
    catalog_import(text=CATALOG_PATH.read_text())
    before = _snapshot()
    data = reference_catalog()
    data["tools"][0]["description"] = "changed, and must not be stored"
    data["tools"][5]["input_schema"] = {"type": "object", "properties": {"path": {"type": "strng"}}}
    data["tools"].append({"name": "bad name!", "group": "Nowhere", "description": "", "input_schema": {}})
    text = json.dumps(data, indent=2)
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(CommandError) as refused:
        call_command("catalog", "import", str(bad))
    message = str(refused.value)
    lines = text.splitlines()
    sixth = next(i for i, line in enumerate(lines, 1) if f'"name": "{data["tools"][5]["name"]}"' in line) - 1
    assert f"line {sixth}: tool 'search_files': the input schema is not valid JSON Schema" in message
    last = max(i for i, line in enumerate(lines, 1) if line.strip() == "{")
    assert f"line {last}: tool 'bad name!'" in message
    assert "is not one of the file's 'groups'" in message and "'description' is required" in message
    assert "nothing was changed" in message
    assert _snapshot() == before


@pytest.mark.req("TD-1")
def test_import_may_reword_a_built_in_but_not_change_its_schema(tmp_path):
    # The model would be offered arguments the implementation does not take.
    catalog_import(text=CATALOG_PATH.read_text())
    before = _snapshot()
    data = reference_catalog()
    bash = next(tool for tool in data["tools"] if tool["name"] == "bash")
    bash["input_schema"] = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
    with pytest.raises(CatalogFileInvalid) as refused:
        catalog_import(text=json.dumps(data, indent=2))
    assert "tool 'bash': this tool is built in, and its input schema is its implementation's" in str(refused.value)
    assert _snapshot() == before
    # Its description, group and flags are the operator's to change.
    bash["input_schema"] = next(t for t in reference_catalog()["tools"] if t["name"] == "bash")["input_schema"]
    bash["description"] = "Run a shell command in the sandbox."
    assert catalog_import(text=json.dumps(data, indent=2)).updated == 1
    assert Tool.objects.get(name="bash").description == "Run a shell command in the sandbox."


@pytest.mark.req("TD-1")
def test_the_admin_shows_a_built_in_or_mcp_tools_name_and_schema_read_only(admin_client):
    catalog_import(text=CATALOG_PATH.read_text())
    bash, ticket = Tool.objects.get(name="bash"), Tool.objects.get(name="create_ticket")
    fixed = admin_client.get(f"/admin/toolcatalog/tool/{bash.pk}/change/").content.decode()
    assert 'name="input_schema"' not in fixed and 'name="name"' not in fixed
    editable = admin_client.get(f"/admin/toolcatalog/tool/{ticket.pk}/change/").content.decode()
    assert 'name="input_schema"' in editable and 'name="name"' in editable
    before = bash.input_schema
    admin_client.post(
        f"/admin/toolcatalog/tool/{bash.pk}/change/",
        {"group": bash.group_id, "description": bash.description, "input_schema": "{}", "side_effects": "none"},
    )
    bash.refresh_from_db()
    assert bash.input_schema == before


@pytest.mark.req("TD-1")
def test_import_reports_broken_json_with_line_and_column():
    with pytest.raises(CatalogFileInvalid) as refused:
        catalog_import(text='{"version": 1,\n "groups": [],\n "tools": [,]}')
    assert refused.value.errors == ["line 3, column 12: not valid JSON: Expecting value"]
    assert Tool.objects.count() == 0


@pytest.mark.req("TD-1")
def test_import_refuses_duplicate_names_pointing_at_the_first():
    data = {"version": 1, "groups": ["G"], "tools": []}
    tool = {"name": "t", "group": "G", "description": "d", "input_schema": {"type": "object"}}
    data["tools"] = [tool, tool]
    with pytest.raises(CatalogFileInvalid) as refused:
        catalog_import(text=json.dumps(data, indent=2))
    assert refused.value.errors == ["line 15: tool 't': the name is already used by the tool on line 7."]


@pytest.mark.req("TD-1")
def test_export_round_trips_through_import():
    catalog_import(text=CATALOG_PATH.read_text())
    Tool.objects.filter(name="git_push").update(max_calls_per_run=2)
    exported = catalog_export()
    data = json.loads(exported)
    assert len(data["tools"]) == 126 and data["groups"] == reference_catalog()["groups"]
    result = catalog_import(text=exported)
    assert (result.created, result.updated, result.unchanged) == (0, 0, 126)
    assert Tool.objects.get(name="git_push").max_calls_per_run == 2


@pytest.mark.req("TD-1")
def test_export_command_writes_the_file(tmp_path):
    catalog_import(text=CATALOG_PATH.read_text())
    target = tmp_path / "out.json"
    call_command("catalog", "export", "--output", str(target))
    assert len(json.loads(target.read_text())["tools"]) == 126


@pytest.mark.req("TD-1")
def test_saving_a_tool_with_an_invalid_schema_is_refused_with_a_message():
    group = ToolGroup.objects.create(heading="G")
    with pytest.raises(ValidationError) as refused:
        Tool.objects.create(name="t", group=group, description="d", input_schema={"type": "object", "required": "x"})
    assert "input schema is not valid JSON Schema at required" in str(refused.value)
    with pytest.raises(ValidationError, match="must describe an object"):
        Tool.objects.create(name="t", group=group, description="d", input_schema={"type": "string"})
    assert Tool.objects.count() == 0


@pytest.mark.req("TD-1")
def test_equal_tool_names_from_two_mcp_servers_are_distinct_tools():
    group = ToolGroup.objects.create(heading="G")
    one = McpServer.objects.create(name="jira", transport="http", url="http://a.example/mcp")
    two = McpServer.objects.create(name="linear", transport="stdio", command="linear-mcp")
    schema = {"type": "object"}
    a = Tool.objects.create(
        name="create_issue", group=group, description="d", input_schema=schema, source="mcp", server=one
    )
    b = Tool.objects.create(
        name="create_issue", group=group, description="d", input_schema=schema, source="mcp", server=two
    )
    assert (a.qualified_name, b.qualified_name) == ("jira__create_issue", "linear__create_issue")


@pytest.mark.req("TD-1")
def test_admin_lists_tools_with_schema_cost_and_toggles_resident_in_bulk(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "root@example.org", "root-password-1")
    client.force_login(admin)
    catalog_import(text=CATALOG_PATH.read_text())
    page = client.get("/admin/toolcatalog/tool/?q=ticket&resident__exact=0")
    assert page.status_code == 200
    assert b"Schema tokens" in page.content and b"assign_ticket" in page.content
    ids = list(Tool.objects.filter(name__in=["git_log", "git_diff"]).values_list("pk", flat=True))
    client.post("/admin/toolcatalog/tool/", {"action": "make_resident", "_selected_action": ids})
    assert set(Tool.objects.filter(pk__in=ids).values_list("resident", flat=True)) == {True}
    for url in ("/admin/toolcatalog/mode/", "/admin/toolcatalog/mcpserver/", "/admin/toolcatalog/toolgroup/"):
        assert client.get(url).status_code == 200
    tool = Tool.objects.get(name="git_log")
    assert client.get(f"/admin/toolcatalog/tool/{tool.pk}/change/").status_code == 200


@pytest.mark.req("TD-1")
def test_admin_refuses_an_invalid_schema_with_a_message_and_keeps_the_old_one(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "root@example.org", "root-password-1")
    client.force_login(admin)
    catalog_import(text=CATALOG_PATH.read_text())
    tool = Tool.objects.get(name="git_log")
    before = tool.input_schema
    form = {
        "name": "git_log",
        "group": tool.group_id,
        "description": tool.description,
        "input_schema": json.dumps({"type": "object", "properties": {"n": {"type": "nummber"}}}),
        "source": tool.source,
        "side_effects": tool.side_effects,
        "enabled": "on",
    }
    response = client.post(f"/admin/toolcatalog/tool/{tool.pk}/change/", form)
    assert response.status_code == 200  # the form comes back with the error
    assert b"not valid JSON Schema" in response.content
    tool.refresh_from_db()
    assert tool.input_schema == before


@pytest.mark.req("SB-5")
@pytest.mark.parametrize(
    ("page", "form"),
    [
        ("tool", {"name": "deep", "description": "d", "source": "builtin", "side_effects": "none", "enabled": "on"}),
        ("mode", {"name": "deep", "deny": "[]"}),
        ("mcpserver", {"name": "deep", "transport": "http", "url": "https://mcp.example.test/mcp", "args": "[]",
                       "env": "{}"}),
    ],
)  # fmt: skip
def test_every_admin_json_field_answers_deep_nesting_with_a_form_error(admin_client, page, form):
    """Django's JSON form field recursed once per level: 3,000 nested brackets were a 500."""
    field = {"tool": "input_schema", "mode": "allow", "mcpserver": "headers"}[page]
    if page == "tool":
        form["group"] = ToolGroup.objects.create(heading="G").pk
    before = {model: model.objects.count() for model in (Tool, Mode, McpServer)}
    for nested, reason in [
        ("[" * 3000 + "]" * 3000, "nests deeper than 32 levels (CC_MAX_JSON_DEPTH)"),
        (json.dumps(_nested(40)), "nests deeper than 32 levels (CC_MAX_JSON_DEPTH)"),
    ]:
        response = admin_client.post(f"/admin/toolcatalog/{page}/add/", {**form, field: nested})
        assert response.status_code == 200 and reason in response.content.decode()
    assert {model: model.objects.count() for model in (Tool, Mode, McpServer)} == before


@pytest.mark.req("TD-1")
def test_a_schema_nested_past_the_checkers_depth_is_refused_by_name():
    # From an MCP server, where no form bounds it: 95 levels ended in RecursionError, a 500.
    group = ToolGroup.objects.create(heading="G")
    with pytest.raises(ValidationError, match="the input schema nests deeper than 32 levels"):
        Tool.objects.create(name="deep", group=group, description="d", input_schema=_nested(95))
    assert Tool.objects.count() == 0


def _nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"inner": schema}}
    return schema


@pytest.mark.req("TD-1")
def test_the_tool_form_says_plainly_what_is_wrong_with_a_name(admin_client):
    group = ToolGroup.objects.create(heading="G")
    Tool.objects.create(name="taken", group=group, description="d", input_schema={"type": "object"})
    form = {
        "group": group.pk,
        "description": "d",
        "input_schema": '{"type": "object"}',
        "source": "builtin",
        "side_effects": "none",
        "enabled": "on",
    }
    too_long = admin_client.post("/admin/toolcatalog/tool/add/", {**form, "name": "n" * 65}).content.decode()
    assert "Ensure this value has at most 64 characters" in too_long and "tool name &#x27;&#x27;" not in too_long
    taken = admin_client.post("/admin/toolcatalog/tool/add/", {**form, "name": "taken"}).content.decode()
    assert "There is already a tool with this name (outside MCP servers)." in taken
    assert "tool_name_unique_outside_servers" not in taken
    assert Tool.objects.count() == 1
