"""Context data, read-only catalog lists, and what a real run records (TD-15, TD-5, TD-10)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.test import override_settings
from rest_framework.test import APIClient

from agents.chat import message_send
from agents.lifecycle import run_execute
from agents.models import ModelRequest, Run
from agents.turns import SYSTEM_PROMPT
from conversations.models import Conversation, Message
from conversations.services import conversation_create
from engine.emulator.validation import tool_use_system_prompt_tokens
from engine.loop import run_turn
from engine.providers.offline import OfflineProvider
from engine.request import text_block
from tests.support.catalog import CATALOG_PATH
from toolcatalog.builtins import WorkspaceToolBox
from toolcatalog.models import McpServer, Mode, RetrievalMiss, Tool, ToolActivation, ToolGroup
from toolcatalog.selectors import run_surface, surface_context
from toolcatalog.services import activations_record, catalog_import
from toolcatalog.toolbox import run_toolbox

pytestmark = pytest.mark.django_db


@pytest.fixture
def catalog():
    catalog_import(text=CATALOG_PATH.read_text())


@pytest.mark.req("TD-15")
def test_context_reports_resident_costs_the_index_and_withheld_schema_costs(alice, alice_api, catalog):
    conversation = conversation_create(owner=alice, title="c")
    response = alice_api.get(f"/api/conversations/{conversation.pk}/context")
    assert response.status_code == 200
    tools = response.json()["tools"]
    assert tools["deferral"] is True
    assert len(tools["resident"]) == 24 and all(item["tokens"] > 0 for item in tools["resident"])
    assert len(tools["deferred"]) == 102
    git_push = next(item for item in tools["deferred"] if item["name"] == "git_push")
    assert git_push["schema_tokens"] == Tool.objects.get(name="git_push").schema_tokens
    assert "git_push" in tools["index"]["text"] and tools["index"]["tokens"] > 0
    assert tools["withheld_tokens"] == sum(item["schema_tokens"] for item in tools["deferred"])
    assert tools["tool_block_tokens"] < tools["withheld_tokens"] / 4


@pytest.mark.req("TD-15")
def test_context_of_someone_elses_conversation_is_not_found(alice, bob_api, catalog):
    conversation = conversation_create(owner=alice, title="private")
    response = bob_api.get(f"/api/conversations/{conversation.pk}/context")
    assert response.status_code == 404
    assert bob_api.get("/api/conversations/999999/context").status_code == 404


@pytest.mark.req("TD-15")
def test_context_follows_the_mode_and_the_deferral_switch(alice, alice_api, catalog):
    Mode.objects.create(name="default", allow=["*"], deny=["git_*"])
    conversation = conversation_create(owner=alice, title="c")
    tools = alice_api.get(f"/api/conversations/{conversation.pk}/context").json()["tools"]
    assert not any(item["name"].startswith("git_") for item in tools["resident"] + tools["deferred"])
    with override_settings(CC_SERVER_TOOL_DEFERRAL=False):
        off = alice_api.get(f"/api/conversations/{conversation.pk}/context").json()["tools"]
    assert off["deferred"] == [] and off["index"]["text"] == "" and len(off["resident"]) == 126 - 8


@pytest.mark.req("TD-1")
def test_tools_and_modes_are_listed_read_only(alice_api, catalog):
    Mode.objects.create(name="review", allow=["git_*"], output_action="submit_report")
    tools = alice_api.get("/api/tools/").json()
    assert len(tools) == 126
    bash = next(tool for tool in tools if tool["name"] == "bash")
    assert bash["requires_approval"] is True and bash["group"] == "Files and shell" and bash["schema_tokens"] > 0
    modes = alice_api.get("/api/modes/").json()
    assert modes == [
        {
            "id": modes[0]["id"],
            "name": "review",
            "description": "",
            "allow": ["git_*"],
            "deny": [],
            "output_action": "submit_report",
        }
    ]
    assert alice_api.post("/api/tools/", {}).status_code == 405


@pytest.mark.req("TD-15")
def test_a_run_records_what_it_loaded_and_which_search_found_nothing(alice, catalog, tmp_path):
    conversation = conversation_create(owner=alice, title="c")
    _, run = message_send(conversation=conversation, text="hello")
    toolbox = run_toolbox(workspace=tmp_path)
    # git_log has no implementation here: calling it loads nothing (its schema would be of no use).
    assert "no implementation" in toolbox.execute("git_log", {})["error"] and not toolbox.activations
    toolbox.execute("describe_tool", {"names": ["git_log"]})
    toolbox.execute("search_tools", {"query": "assign a ticket to someone"})
    toolbox.execute("search_tools", {"query": "zzqx wobblefrump"})
    activations_record(run_id=run.pk, activations=toolbox.activations, misses=toolbox.misses)
    rows = list(ToolActivation.objects.filter(run=run).values_list("tool_name", "trigger", "query"))
    assert rows[0] == ("git_log", "direct", "")
    assert ("assign_ticket", "search", "assign a ticket to someone") in rows
    assert list(RetrievalMiss.objects.filter(run=run).values_list("query", flat=True)) == ["zzqx wobblefrump"]


@pytest.mark.req("TD-2")
@pytest.mark.req("TD-5")
def test_a_real_run_sends_resident_schemas_and_the_name_index(alice, catalog):
    conversation = conversation_create(owner=alice, title="c")
    _, run = message_send(conversation=conversation, text="what files are in the workspace?")
    run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    # The offline model lists the workspace with the resident list_dir; nothing deferred was loaded.
    requests = list(ModelRequest.objects.filter(run=run).order_by("step"))
    assert len(requests) == 2
    # The offline model counts the whole payload it was sent: resident schemas and the
    # index are in it, the 102 withheld schemas are not.
    # The API adds its tool-use system prompt whenever tools are present (EM-2).
    tools = surface_context(run_surface()[0])
    resident = tools["tool_block_tokens"] + tool_use_system_prompt_tokens(run.model)
    assert resident < requests[0].prompt_tokens < resident + 500
    assert not ToolActivation.objects.filter(run=run).exists()
    reply = Message.objects.filter(conversation=conversation).order_by("-id").first()
    assert "workspace holds" in reply.content[0]["text"]


class _Recording:
    name = "offline"

    def __init__(self) -> None:
        self.inner = OfflineProvider()
        self.sent: list[bytes] = []

    def stream(self, request):
        self.sent.append(request.serialize())
        yield from self.inner.stream(request)


@pytest.mark.req("TD-10")
def test_deferral_off_on_an_empty_catalog_sends_exactly_what_the_builtin_toolbox_sent(tmp_path):
    history = [{"role": "user", "content": [text_block("list the files in the workspace")]}]

    def requests(toolbox, system):
        model = _Recording()
        run_turn(provider=model, model="m", system=system, history=history, toolbox=toolbox, emit=lambda *a: None)
        return model.sent

    with override_settings(CC_SERVER_TOOL_DEFERRAL=False):
        catalog_box = run_toolbox(workspace=tmp_path)
    with_switch = requests(catalog_box, [text_block(SYSTEM_PROMPT), *catalog_box.surface.system_blocks()])
    without = requests(WorkspaceToolBox(tmp_path), [text_block(SYSTEM_PROMPT)])
    assert len(with_switch) == 2
    assert with_switch == without


@pytest.mark.req("TD-1")
@pytest.mark.req("TD-8")
def test_tools_of_a_disabled_server_and_disabled_tools_are_not_on_the_surface(catalog):
    server = McpServer.objects.create(name="jira", transport="http", url="http://jira.example/mcp")
    group = ToolGroup.objects.get(heading="Tickets and projects")
    Tool.objects.create(
        name="create_issue",
        group=group,
        description="Create a Jira issue.",
        input_schema={"type": "object"},
        source="mcp",
        server=server,
    )
    Tool.objects.filter(name="git_push").update(enabled=False)
    surface, _ = run_surface()
    assert "jira__create_issue" in surface.deferred_names and surface.get("git_push") is None
    McpServer.objects.filter(pk=server.pk).update(enabled=False)
    surface, _ = run_surface()
    assert surface.get("jira__create_issue") is None


@pytest.mark.req("TD-4")
def test_a_mode_cannot_deny_its_own_output_action_and_servers_need_an_address():
    mode = Mode(name="writer", allow=["*"], deny=["submit_*"], output_action="submit_report")
    with pytest.raises(ValidationError, match="denies its own output action"):
        mode.full_clean()
    with pytest.raises(ValidationError, match="fnmatch patterns"):
        Mode(name="odd", allow="*").full_clean()
    with pytest.raises(ValidationError, match="needs the command"):
        McpServer(name="local", transport="stdio").full_clean()
    with pytest.raises(ValidationError, match="cannot contain '__'"):
        McpServer(name="a__b", transport="http", url="http://x.example/").full_clean()
    assert not Mode.objects.exists() and not McpServer.objects.exists()


@pytest.mark.req("RN-3")
def test_groups_and_mcp_servers_are_listed_without_the_servers_command_lines(alice_api, catalog):
    from toolcatalog.models import McpServer

    McpServer.objects.create(name="weather", transport="stdio", command="weather-server", env={"TOKEN": "s3cret"})
    groups = alice_api.get("/api/groups/").json()
    headings = [group["heading"] for group in groups]
    assert "Files and shell" in headings and "Tickets and projects" in headings
    assert sum(group["tools"] for group in groups) == 126
    servers = alice_api.get("/api/mcp-servers/").json()
    assert servers == [{"id": servers[0]["id"], "name": "weather", "transport": "stdio", "enabled": True,
                        "created_at": servers[0]["created_at"]}]  # fmt: skip
    assert "s3cret" not in json.dumps(servers)


def test_groups_and_mcp_servers_need_authentication(client):
    assert client.get("/api/groups/").status_code in (401, 403)
    assert client.get("/api/mcp-servers/").status_code in (401, 403)


@pytest.mark.req("MC-1", "SB-5")
def test_mcp_servers_are_managed_over_the_api_only_with_the_permissions_the_admin_asks_for(django_user_model):
    """QA: a staff account the admin refused MCP servers created one over the API, and its command ran."""
    server = McpServer.objects.create(name="kept", transport="stdio", command="/bin/true", enabled=False)
    staff = django_user_model.objects.create_user(username="staffy", password="staffy-password-1", is_staff=True)
    api = APIClient()
    api.force_authenticate(staff)
    new = {"name": "mine", "transport": "stdio", "command": "/bin/sh", "args": ["-c", "id"], "enabled": False}
    refused = [
        api.post("/api/mcp-servers/", new, format="json"),
        api.get(f"/api/mcp-servers/{server.pk}/"),
        api.patch(f"/api/mcp-servers/{server.pk}/", {"command": "/bin/sh"}, format="json"),
        api.post(f"/api/mcp-servers/{server.pk}/refresh/"),
        api.delete(f"/api/mcp-servers/{server.pk}/"),
    ]
    assert [answer.status_code for answer in refused] == [403] * 5
    assert "MCP server permissions" in refused[0].json()["error"]["message"]
    assert list(McpServer.objects.values_list("name", "command")) == [("kept", "/bin/true")]
    assert "command" not in api.get("/api/mcp-servers/").json()[0]  # names only, as any user sees them

    staff.user_permissions.add(*Permission.objects.filter(codename__in=["view_mcpserver", "add_mcpserver"]))
    staff = django_user_model.objects.get(pk=staff.pk)  # permissions are cached on the instance
    api.force_authenticate(staff)
    assert api.get("/api/mcp-servers/").json()[0]["command"] == "/bin/true"
    assert api.post("/api/mcp-servers/", new, format="json").status_code == 201
    assert api.delete(f"/api/mcp-servers/{server.pk}/").status_code == 403  # no delete permission


@pytest.mark.req("MC-1", "UX-8")
def test_an_invalid_mcp_server_is_a_400_with_one_sentence_and_details_by_field(admin_client):
    # QA: "...tools).; transport: ..." with empty details, where serializer errors fill them.
    refused = admin_client.post("/api/mcp-servers/", {}, content_type="application/json")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert set(error["details"]) == {"name", "transport"} and all(
        isinstance(messages, list) and messages for messages in error["details"].values()
    )
    assert ".;" not in error["message"] and error["message"].startswith("name: ")
    assert f"transport: {error['details']['transport'][0]}" in error["message"]
    assert not McpServer.objects.exists()


@pytest.mark.req("TD-4")
def test_a_modes_output_action_names_a_tool_of_the_catalog(catalog, admin_client):
    """QA: the admin saved output_action 'bogus': its runs would be told to finish with a tool nobody can call."""
    with pytest.raises(ValidationError, match="no tool named 'bogus' in the catalog"):
        Mode(name="odd", allow=["*"], output_action="bogus").full_clean()
    Mode(name="reporter", allow=["*"], output_action="submit_report").full_clean()
    answer = admin_client.post(
        "/admin/toolcatalog/mode/add/", {"name": "odd", "allow": '["*"]', "deny": "[]", "output_action": "bogus"}
    )
    assert answer.status_code == 200 and "no tool named" in answer.content.decode()
    assert not Mode.objects.filter(name="odd").exists()


@pytest.mark.req("TD-4", "UX-7")
def test_a_mode_a_run_used_cannot_be_deleted_and_one_no_run_used_can(admin_client, alice, catalog):
    """QA: deleting a mode under a queued run let it run under the default mode, offered every tool
    its mode denied, and past runs lost which mode they ran."""
    used = Mode.objects.create(name="careful", allow=["*"], deny=["bash"])
    unused = Mode.objects.create(name="spare", allow=["*"])
    conversation = conversation_create(owner=alice, title="careful")
    Conversation.objects.filter(pk=conversation.pk).update(mode=used)
    conversation.refresh_from_db()
    _, run = message_send(conversation=conversation, text="hello")
    assert run.mode_id == used.pk

    refused = admin_client.post(f"/admin/toolcatalog/mode/{used.pk}/delete/", {"post": "yes"})
    assert refused.status_code == 200 and "Cannot delete mode" in refused.content.decode()
    assert Mode.objects.filter(pk=used.pk).exists() and Run.objects.get(pk=run.pk).mode_id == used.pk
    deleted = admin_client.post(f"/admin/toolcatalog/mode/{unused.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 302 and not Mode.objects.filter(pk=unused.pk).exists()


@pytest.mark.req("TD-1", "MC-1")
def test_a_catalog_tool_cannot_take_the_name_an_mcp_servers_tool_has(admin_client, tmp_path):
    """QA: a plain tool named weather__get beside server weather's get sent one name twice, and the
    API refused every request of every run (400: tool names must be unique)."""
    catalog = {
        "version": 1,
        "groups": ["Web"],
        "tools": [{"name": "weather__get", "group": "Web", "description": "d", "input_schema": {"type": "object"}}],
    }
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(catalog))
    with pytest.raises(CommandError, match="contains '__', which only an MCP server's tools have"):
        call_command("catalog", "import", str(path))
    group = ToolGroup.objects.create(heading="Web", order=1)
    with pytest.raises(ValidationError, match="only an MCP server's tools have"):
        Tool.objects.create(name="weather__get", group=group, description="d", input_schema={"type": "object"})
    assert not Tool.objects.filter(name="weather__get").exists()


@pytest.mark.req("TD-1")
def test_a_catalog_import_refuses_a_huge_description_and_names_the_tools_it_leaves_as_they_are(tmp_path, capsys):
    """QA: a 2 MB description imported fine (a resident one is in every request), and a re-import
    that left ten tools out said nothing of them."""

    def catalog_file(tools: list[dict]) -> str:
        path = tmp_path / "catalog.json"
        path.write_text(json.dumps({"version": 1, "groups": ["Web"], "tools": tools}))
        return str(path)

    def tool(name: str, description: str = "d") -> dict:
        return {"name": name, "group": "Web", "description": description, "input_schema": {"type": "object"}}

    with pytest.raises(CommandError, match="the description is 10,001 characters, over 10,000"):
        call_command("catalog", "import", catalog_file([tool("big", "x" * 10_001)]))
    assert not Tool.objects.filter(name="big").exists()
    call_command("catalog", "import", catalog_file([tool("one"), tool("two"), tool("three")]))
    capsys.readouterr()
    call_command("catalog", "import", catalog_file([tool("one")]))
    out = capsys.readouterr().out
    assert "2 catalog tools are not in the file and were left as they are" in out and "three, two" in out
    assert set(Tool.objects.values_list("name", flat=True)) == {"one", "two", "three"}
