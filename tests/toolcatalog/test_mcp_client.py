"""Imported MCP tools really run on their servers (MC-1..5, LM-3).

Real servers only: the reference servers from PyPI (mcp-server-time, mcp-server-git, both
stdio) and our own SDK server with a call log (tests/support/mcp_servers/probe_server.py), over
stdio and over Streamable HTTP with a bearer token. Every stdio server runs in the real bubblewrap
sandbox (SB-1): it sees the calling workspace at /workspace, where the probe writes its call log.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from django.core.management import CommandError, call_command
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from agents.chat import message_send
from agents.lifecycle import run_execute
from agents.models import Approval, Run, RunEvent
from controlcenter.redact import HIDDEN
from controlcenter.stack import free_port
from conversations.models import Conversation
from conversations.services import conversation_create
from engine.actions import tool_result
from engine.emulator import Emulator
from tests.support.mcp_servers import fixtures as live
from tests.support.waiting import wait_until
from toolcatalog.admin import McpServerForm
from toolcatalog.mcp_client import connections
from toolcatalog.models import McpServer, Tool
from toolcatalog.services import catalog_load_builtins
from toolcatalog.toolbox import run_toolbox
from toolcatalog.workspace import mcp_workspace_root, workspace_root

pytestmark = pytest.mark.django_db(transaction=True)

PROBE = Path(__file__).parents[1] / "support" / "mcp_servers" / "probe_server.py"
BIN = Path(sys.executable).parent
CANARY_ENV = "canary-env-value-7c1f"
CANARY_HEADER = "canary-header-value-93ab"
CALL_LOG = "calls.jsonl"

server_url = live.server_url
workspaces = live.workspaces


@pytest.fixture(autouse=True)
def _fresh_connections():
    # Each test's servers are its own: no process or session carries over.
    connections.close()
    yield
    connections.close()


def _servers_file(tmp_path: Path, servers: dict) -> Path:
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")
    return path


def _reference_servers(only: tuple[str, ...] = ("time", "git", "probe")) -> dict:
    # The sandboxed probe logs into the workspace it runs on (its working directory).
    probe_env = {"PROBE_SECRET": CANARY_ENV, "PROBE_CALL_LOG": CALL_LOG}
    servers = {
        "time": {"command": str(BIN / "mcp-server-time")},
        "git": {"command": str(BIN / "mcp-server-git")},
        "probe": {"command": sys.executable, "args": [str(PROBE)], "env": probe_env},
    }
    # Each server started costs a Python start-up: a test imports only those it calls.
    return {name: servers[name] for name in only}


def _calls(call_log: Path) -> list[dict]:
    if not call_log.exists():
        return []
    return [json.loads(line) for line in call_log.read_text().splitlines()]


def _tool_results(run: Run) -> list[dict]:
    return [event.payload for event in RunEvent.objects.filter(run=run, type="tool_result").order_by("seq")]


def _staff_api(django_user_model) -> APIClient:
    staff = django_user_model.objects.create_superuser(username="op", password="op-password-1")
    client = APIClient()
    client.force_authenticate(staff)
    return client


@pytest.mark.req("MC-1")
def test_a_servers_file_imports_each_server_all_or_nothing_and_a_reimport_reports_changes(tmp_path, capsys):
    servers = {
        **_reference_servers(),
        "broken": {"command": "/nonexistent/mcp-server", "args": ["--stdio"]},
        "confused": {"url": "ftp://example.com/mcp"},
        "dying": {
            "command": sys.executable,
            "args": [str(PROBE), "--die-at-start", "SIGKILL"],
            "env": {"PROBE_SECRET": CANARY_ENV},
        },
        "looping": {"command": sys.executable, "args": [str(PROBE.parent / "looping_server.py")]},
    }
    with pytest.raises(CommandError, match="4 of 7 servers"):
        call_command("catalog", "import-mcp", "--config", str(_servers_file(tmp_path, servers)))
    out, err = capsys.readouterr()
    # A server that dies at start says how, and its last words, its secret hidden.
    assert (
        "dying: not imported, nothing changed: MCP server 'dying': MCPError: Connection closed. "
        f"It exited with status 137 (killed by SIGKILL). Its stderr: cannot start: bad token {HIDDEN}."
    ) in err
    assert CANARY_ENV not in err
    # A list whose pages never end is refused, not cut short (a refresh then took the rest for removed).
    assert "looping: not imported, nothing changed: MCP server 'looping': its tool list never ends" in err
    assert "time: server added; 2 tools added (convert_time, get_current_time)" in out
    assert "git: server added;" in out and "git_status" in out and "probe: server added;" in out
    assert "broken: not imported, nothing changed: MCP server 'broken': cannot start the server command" in err
    assert "confused: not imported, nothing changed: url: An http server needs its http(s):// URL." in err
    assert set(McpServer.objects.values_list("name", flat=True)) == {"time", "git", "probe"}
    probe = McpServer.objects.get(name="probe")
    assert (probe.command, probe.args, probe.env["PROBE_SECRET"]) == (sys.executable, [str(PROBE)], CANARY_ENV)
    names = {tool.qualified_name for tool in Tool.objects.select_related("server")}
    assert {"time__get_current_time", "git__git_status", "probe__echo", "probe__crash"} <= names

    # The same servers again, the probe now without two tools: only the differences are reported.
    servers = _reference_servers()
    servers["probe"]["args"] = [str(PROBE), "--without", "crash", "grow"]
    call_command("catalog", "import-mcp", "--config", str(_servers_file(tmp_path, servers)))
    out = capsys.readouterr().out
    assert "time: server updated; 0 tools added, 0 changed, 2 unchanged, 0 removed" in out
    assert "probe: server updated; 0 tools added, 0 changed, 8 unchanged, 2 removed" in out and "(crash, grow)" in out
    assert not Tool.objects.get(server__name="probe", name="crash").enabled

    (tmp_path / "bad.json").write_text('{"servers": {}}')
    with pytest.raises(CommandError, match='"mcpServers" object'):
        call_command("catalog", "import-mcp", "--config", str(tmp_path / "bad.json"))


@pytest.mark.req("MC-2")
@pytest.mark.req("LM-3")
@pytest.mark.usefixtures("inprocess_runs")
def test_a_conversation_calls_the_reference_servers_deferred_tools(alice, tmp_path, settings, workspaces):
    time_and_git = _reference_servers(only=("time", "git"))
    call_command("catalog", "import-mcp", "--config", str(_servers_file(tmp_path, time_and_git)))
    conversation = conversation_create(owner=alice, title="mcp")

    _, run = message_send(conversation=conversation, text='call `time__get_current_time {"timezone": "UTC"}`')
    before = datetime.now(UTC)
    run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    [result] = _tool_results(run)
    assert result["name"] == "time__get_current_time" and result["output"]["ok"] is True
    # The server's own answer, loaded like any deferred tool (tool_reference in the result).
    answered = datetime.fromisoformat(result["output"]["structured_content"]["datetime"])
    assert abs((answered - before).total_seconds()) < 120
    assert result["loads_tools"] == ["time__get_current_time"]

    repo = workspace_root(conversation.pk) / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "notes.txt").write_text("hello")
    # The sandboxed server sees the conversation's workspace where the shell does: at /workspace.
    arguments = json.dumps({"repo_path": "/workspace/repo"})
    _, run = message_send(conversation=conversation, text=f"call `git__git_status {arguments}`")
    run_execute(run_id=run.pk, worker="test")
    [result] = _tool_results(Run.objects.get(pk=run.pk))
    assert result["output"]["ok"] is True
    assert "Untracked files" in result["output"]["text"] and "notes.txt" in result["output"]["text"]
    reply = conversation.messages.order_by("-id").first()
    assert "notes.txt" in reply.content[0]["text"]  # the offline model read the real status


@pytest.mark.req("MC-2")
@pytest.mark.req("MC-5")
def test_imported_tools_are_listed_and_called_over_the_mcp_endpoint(alice, tmp_path, server_url):
    time_and_git = _reference_servers(only=("time", "git"))
    call_command("catalog", "import-mcp", "--config", str(_servers_file(tmp_path, time_and_git)))
    token = Token.objects.create(user=alice).key
    repo = mcp_workspace_root(alice.pk) / "repo"  # /mcp calls run on the caller's MCP workspace
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "plan.md").write_text("x")

    async def steps():
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
        async with http, Client(streamable_http_client(server_url, http_client=http)) as client:
            listed = {tool.name for tool in (await client.list_tools()).tools}
            now = await client.call_tool("time__get_current_time", {"timezone": "UTC"})
            status = await client.call_tool("git__git_status", {"repo_path": "/workspace/repo"})
            return listed, now, status

    listed, now, status = anyio.run(steps)
    assert {"time__get_current_time", "git__git_status"} <= listed
    assert now.is_error is False and "datetime" in now.structured_content["structured_content"]
    assert status.is_error is False and "plan.md" in status.structured_content["text"]


class _HttpProbe:
    """The probe server over Streamable HTTP, as a process that can be killed and started again."""

    def __init__(self, token: str, call_log: Path) -> None:
        self.port, self.token, self.call_log = free_port(), token, call_log
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [sys.executable, str(PROBE), "--http", str(self.port), "--token", self.token]
        env = {"PATH": "/usr/bin:/bin", "PROBE_CALL_LOG": str(self.call_log)}
        self.process = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/", timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError("the probe HTTP server did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.mark.req("MC-1")
@pytest.mark.req("MC-2")
@pytest.mark.req("MC-3")
def test_an_http_server_with_a_bearer_reference_maps_results_and_fails_clearly(
    django_user_model, tmp_path, settings, monkeypatch, caplog
):
    call_log = tmp_path / "calls.jsonl"
    probe = _HttpProbe(CANARY_HEADER, call_log)
    probe.start()
    try:
        monkeypatch.setenv("PROBE_TOKEN", CANARY_HEADER)
        api = _staff_api(django_user_model)
        headers = {"Authorization": "Bearer ${PROBE_TOKEN}"}
        config = {"name": "remote", "transport": "http", "url": probe.url, "headers": headers}
        created = api.post("/api/mcp-servers/", config, format="json")
        assert created.status_code == 201, created.content
        assert "remote__picture" in created.json()["server"]["tools"]
        assert "echo" in created.json()["imported"]["added"]
        server_id = created.json()["server"]["id"]

        settings.CC_MCP_CALL_TIMEOUT_SECONDS = 2
        toolbox = run_toolbox(workspace=tmp_path, deferral=False)
        picture = toolbox.execute("remote__picture", {})
        assert picture["ok"] is True and picture["images"] == [{"media_type": "image/png"}]
        # The model sees the image itself: an image block in the tool_result.
        blocks = tool_result("toolu_1", picture)["content"]
        assert blocks[1]["type"] == "image" and blocks[1]["source"]["media_type"] == "image/png"
        failed = toolbox.execute("remote__fail", {"reason": "quota"})
        assert (
            failed["ok"] is False and "remote__fail reported an error" in failed["error"] and "quota" in failed["error"]
        )
        started = time.monotonic()
        slow = toolbox.execute("remote__slow", {"seconds": 30})
        assert slow["ok"] is False and "did not answer within 2 s" in slow["error"]
        assert time.monotonic() - started < 10
        assert toolbox.execute("remote__echo", {"text": "still here"})["text"] == "echo: still here"

        crashed = toolbox.execute("remote__crash", {})
        assert crashed["ok"] is False and "MCP server 'remote' stopped during the call of 'crash'" in crashed["error"]
        probe.stop()
        probe.start()  # the server comes back: the broken connection is opened again
        assert toolbox.execute("remote__echo", {"text": "again"})["text"] == "echo: again"
        # Restarted between two calls on a live session: it answers 404 ("Session not found" in the
        # body, which the SDK passes on without the status), so the call goes once more on a new
        # session. QA: every later call was "refused" until the worker restarted.
        probe.stop()
        probe.start()
        assert toolbox.execute("remote__echo", {"text": "after a restart"})["text"] == "echo: after a restart"
        assert [call["tool"] for call in _calls(call_log)] == [
            "picture", "fail", "slow", "echo", "crash", "echo", "echo"
        ]  # fmt: skip

        # A wrong literal token: a clear error that never repeats the token.
        wrong = api.patch(
            f"/api/mcp-servers/{server_id}/",
            {"headers": {"Authorization": f"Bearer {CANARY_HEADER}-no"}},
            format="json",
        )
        assert wrong.status_code == 400 and "remote" in wrong.json()["error"]["message"]
        assert "It answered HTTP 401: it refused our credentials" in wrong.json()["error"]["message"]
        assert CANARY_HEADER not in wrong.content.decode()
        # Write-only: the answer shows names and references, never a value; "***" keeps a value.
        shown = api.get(f"/api/mcp-servers/{server_id}/").json()
        assert shown["headers"] == {"Authorization": "***"}
        kept = api.patch(f"/api/mcp-servers/{server_id}/", {"headers": {"Authorization": "***"}}, format="json")
        assert kept.status_code == 200, kept.content
        assert McpServer.objects.get(pk=server_id).headers == {"Authorization": "Bearer ${PROBE_TOKEN}"}
        # Bad values are refused and change nothing: "***" for a header never stored (it stored ""
        # and dropped the token), a value that would end the header line, addresses that are no URL.
        stored = McpServer.objects.values().get(pk=server_id)
        for field, value, reason in [
            ("headers", {"X-New": "***"}, "header 'X-New' has no stored value"),
            ("headers", {"Authorization": "***", "X-Injected": "v\r\nX-Other: y"}, "line break or NUL"),
            # A name's pattern ends at the end of the name: `$` alone let a trailing newline through.
            ("headers", {"Authorization": "***", "X-Injected\n": "v"}, "is not a valid header name"),
            ("url", "https://exa mple.com/mcp", "not a valid http(s) URL"),
            ("url", "https://[::1/mcp", "not a valid http(s) URL"),
            ("url", "https://example.com:99999/mcp", "not a valid http(s) URL"),
            # Numbers are no strings: DRF's CharField stored [1, 2] as ["1", "2"].
            ("headers", {"Authorization": 42}, "Must be a string, not int"),
        ]:
            refused = api.patch(f"/api/mcp-servers/{server_id}/", {field: value}, format="json")
            assert refused.status_code == 400 and reason in refused.json()["error"]["message"], refused.content
            assert McpServer.objects.values().get(pk=server_id) == stored
        refreshed = api.post(f"/api/mcp-servers/{server_id}/refresh/")
        assert refreshed.status_code == 200 and refreshed.json()["imported"]["unchanged"] == 10
        listed = api.get("/api/mcp-servers/").content.decode()
        assert CANARY_HEADER not in listed and '"headers":{"Authorization":"***"}' in listed
        assert APIClient().post("/api/mcp-servers/", {}, format="json").status_code in (401, 403)

        assert api.delete(f"/api/mcp-servers/{server_id}/").status_code == 204
        assert not Tool.objects.filter(server__name="remote").exists()
    finally:
        probe.stop()
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert CANARY_HEADER not in logged


@pytest.mark.req("MC-2")
@pytest.mark.req("MC-4")
def test_a_stdio_server_is_reused_restarted_after_a_crash_and_its_list_changes_reach_the_catalog(tmp_path, settings):
    call_log = tmp_path / CALL_LOG
    probe_only = _reference_servers(only=("probe",))
    extra_tools = tmp_path / "installed" / "extra-tools.json"  # its folder is mounted read-only
    extra_tools.parent.mkdir()
    extra_tools.write_text("[]")
    probe_only["probe"]["args"] += ["--extra-tools", str(extra_tools)]
    call_command("catalog", "import-mcp", "--config", str(_servers_file(tmp_path, probe_only)))
    Tool.objects.filter(server__name="probe", name="echo").update(max_calls_per_run=2)
    toolbox = run_toolbox(workspace=tmp_path, deferral=False)

    first = toolbox.execute("probe__whoami", {})["text"]
    again = toolbox.execute("probe__whoami", {})["text"]
    assert (
        json.loads(first)
        == json.loads(again)
        == {"instance": _calls(call_log)[0]["instance"], "secret_length": len(CANARY_ENV)}
    )
    # Action limits hold for imported tools: the third call never reaches the server.
    assert [toolbox.execute("probe__echo", {"text": str(n)})["ok"] for n in range(3)] == [True, True, False]
    assert len([call for call in _calls(call_log) if call["tool"] == "echo"]) == 2

    assert toolbox.execute("probe__fail", {"reason": "an earlier, unrelated refusal"})["ok"] is False
    toolbox.execute("probe__whoami", {})  # a round trip more: that stderr line has been read by now
    crashed = toolbox.execute("probe__crash", {})["error"]
    assert "stopped during the call" in crashed
    # How it ended, and its last words: "Connection closed" alone gave an operator nothing.
    assert "It exited with status 3. Its stderr: crash: giving up" in crashed
    # The error quotes what the server wrote during this call only, not the earlier refusal.
    assert "unrelated refusal" not in crashed
    restarted = json.loads(toolbox.execute("probe__whoami", {})["text"])
    assert restarted["instance"] != json.loads(first)["instance"]

    # The server's installation gains a tool and the server announces a change: the catalog learns
    # it (deferred, like any new tool) from a listing of its own. Not from the process that spoke:
    # one runs per workspace, and what this user's calls grew in it ("local-only") is not the
    # server's (QA: one user's process rewrote everyone's catalog, dropping what others had).
    before = set(Tool.objects.filter(server__name="probe", enabled=True).values_list("name", flat=True))
    extra_tools.write_text(json.dumps(["sprout"]))
    toolbox.execute("probe__grow", {"name": "local-only"})
    deadline = time.monotonic() + 30
    while not Tool.objects.filter(server__name="probe", name="sprout").exists():
        assert time.monotonic() < deadline, "the list_changed notification did not refresh the catalog"
        time.sleep(0.2)
    assert Tool.objects.get(server__name="probe", name="sprout").resident is False
    assert set(Tool.objects.filter(server__name="probe", enabled=True).values_list("name", flat=True)) == {
        *before,
        "sprout",
    }
    # A tool its server dropped answers a clear error in a run that still lists it.
    Tool.objects.filter(server__name="probe", name="whoami").update(server_missing=True, enabled=False)
    removed = toolbox.execute("probe__whoami", {})
    assert "this tool was removed from server probe" in removed["error"]

    settings.CC_MCP_IDLE_SECONDS = 1
    deadline = time.monotonic() + 15
    while "probe" in connections.running():
        assert time.monotonic() < deadline, "an idle server was not stopped"
        time.sleep(0.2)


@pytest.mark.req("MC-1")
def test_a_server_installed_beside_control_center_starts_without_its_venv_on_the_path(tmp_path, monkeypatch):
    # An operator runs `.venv/bin/controlcenter worker` without activating the venv: the PATH has
    # no .venv/bin, and `mcp-server-time` was "not installed" although pip had put it there.
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    assert shutil.which("mcp-server-time") is None
    call_command(
        "catalog", "import-mcp", "--config", str(_servers_file(tmp_path, {"time": {"command": "mcp-server-time"}}))
    )
    assert Tool.objects.filter(server__name="time", name="get_current_time").exists()


@pytest.mark.req("MC-2")
def test_a_server_that_never_starts_is_a_clear_error_and_its_schema_is_not_loaded(tmp_path):
    time_only = _reference_servers(only=("time",))
    call_command("catalog", "import-mcp", "--config", str(_servers_file(tmp_path, time_only)))
    McpServer.objects.filter(name="time").update(command="/nonexistent/mcp-server-time")
    toolbox = run_toolbox(workspace=tmp_path, deferral=True)
    assert "time__get_current_time" in toolbox.surface.deferred_names
    failed = toolbox.execute("time__get_current_time", {"timezone": "UTC"})
    assert failed["ok"] is False and "MCP server 'time' could not be started" in failed["error"]
    # A run's worker, the web process (/mcp) or an import may be the one that looked.
    assert "not found in the PATH of the process starting it: a worker for runs, the web process" in failed["error"]
    assert "_loads_tools" not in failed and "time__get_current_time" not in toolbox.activated


@pytest.mark.integration
@pytest.mark.req("MC-2")
@pytest.mark.req("MC-3")
@pytest.mark.req("LM-3")
def test_a_real_worker_forwards_imported_calls_after_approval_in_runs_and_subagents(
    celery_worker_process, alice, alice_api, tmp_path
):
    catalog_load_builtins()
    probe_only = _reference_servers(only=("probe",))
    call_command("catalog", "import-mcp", "--config", str(_servers_file(tmp_path, probe_only)))
    Tool.objects.filter(server__name="probe", name="echo").update(requires_approval=True)
    conversation = Conversation.objects.create(owner=alice, title="mcp e2e")
    call_log = workspace_root(conversation.pk) / CALL_LOG
    messages_url = f"/api/conversations/{conversation.pk}/messages/"

    # The approval gate of a built-in holds an imported tool: nothing reaches the server before a person says yes.
    sent = alice_api.post(messages_url, {"text": 'call `probe__echo {"text": "approved"}`'}, format="json")
    run_id = sent.json()["run"]["id"]
    wait_until(lambda: Run.objects.get(pk=run_id).status == Run.Status.WAITING, 60, "the approval request")
    assert _calls(call_log) == []
    approval = Approval.objects.get(run_id=run_id)
    assert alice_api.post(f"/api/approvals/{approval.pk}/approve/").status_code == 200
    wait_until(lambda: Run.objects.get(pk=run_id).is_finished, 60, "the approved run")
    run = Run.objects.get(pk=run_id)
    assert run.status == Run.Status.SUCCEEDED and run.worker.startswith("test-"), run.error
    [result] = _tool_results(run)
    assert result["output"]["text"] == "echo: approved"

    # Subagents call imported tools too; the worker reuses its one server process across runs.
    sent = alice_api.post(
        messages_url, {"text": "in parallel: call `probe__whoami {}`; call `probe__whoami {}`"}, format="json"
    )
    run_id = sent.json()["run"]["id"]
    wait_until(lambda: Run.objects.get(pk=run_id).is_finished, 90, "the run with subagents")
    assert Run.objects.get(pk=run_id).status == Run.Status.SUCCEEDED
    calls = _calls(call_log)
    assert [call["tool"] for call in calls] == ["echo", "whoami", "whoami"]
    assert len({call["instance"] for call in calls}) == 1

    # The server's env secret reached the server (it reported its length) and nothing else.
    stored = json.dumps(list(RunEvent.objects.filter(run__conversation=conversation).values_list("payload", flat=True)))
    assert f'\\"secret_length\\": {len(CANARY_ENV)}' in stored
    assert CANARY_ENV not in stored and CANARY_ENV not in celery_worker_process.log_path.read_text()
    assert CANARY_ENV not in alice_api.get("/api/mcp-servers/").content.decode()


@pytest.mark.req("MC-1")
@pytest.mark.req("MC-3")
def test_the_admin_never_shows_env_values_and_keeps_them_when_saved_back(admin_client, tmp_path):
    probe_only = _reference_servers(only=("probe",))
    call_command("catalog", "import-mcp", "--config", str(_servers_file(tmp_path, probe_only)))
    probe = McpServer.objects.get(name="probe")
    page = admin_client.get(f"/admin/toolcatalog/mcpserver/{probe.pk}/change/").content.decode()
    assert "PROBE_SECRET" in page and CANARY_ENV not in page
    form = {
        "name": "probe",
        "transport": "stdio",
        "command": sys.executable,
        "args": json.dumps([str(PROBE), "--without", "grow"]),
        "env": json.dumps({"PROBE_SECRET": "***", "EXTRA": "${HOME}"}),
        "cwd": "",
        "url": "",
        "headers": "{}",
        "enabled": "on",
    }
    saved = admin_client.post(f"/admin/toolcatalog/mcpserver/{probe.pk}/change/", form, follow=True)
    assert saved.status_code == 200
    probe.refresh_from_db()
    assert probe.env == {"PROBE_SECRET": CANARY_ENV, "EXTRA": "${HOME}"}
    # Saving re-imported the tools: the one left out is reported removed.
    assert "1 removed" in saved.content.decode() and "grow" in saved.content.decode()
    assert CANARY_ENV not in saved.content.decode()


@pytest.mark.django_db
@pytest.mark.req("MC-1")
def test_an_http_endpoint_typed_without_a_scheme_is_taken_as_https_and_a_bad_one_is_refused():
    # Disabled: the address alone is checked here; an enabled server is also reached (below).
    base = {"name": "remote", "transport": "http", "args": "[]", "env": "{}", "headers": "{}"}
    typed = {
        "mcp.example.test/mcp": "https://mcp.example.test/mcp",
        # Django's own guess read the host of a host:port address as a scheme and refused it.
        "mcp.example.test:8443/mcp": "https://mcp.example.test:8443/mcp",
        "localhost:9000/mcp": "https://localhost:9000/mcp",
        "http://127.0.0.1:9000/mcp": "http://127.0.0.1:9000/mcp",
    }
    for given, taken in typed.items():
        form = McpServerForm(data=base | {"url": given})
        assert form.is_valid(), (given, form.errors)
        assert form.cleaned_data["url"] == taken
    for bad in ("not a url at all", "https://exa mple.com/mcp", "https://[::1/mcp", "https://example.com:99999/"):
        refused = McpServerForm(data=base | {"url": bad})
        assert not refused.is_valid() and "url" in refused.errors, bad
    assert not McpServer.objects.exists()


@pytest.mark.req("MC-1")
def test_the_admin_saves_an_enabled_server_only_once_it_listed_its_tools(admin_client, tmp_path):
    """All or nothing, as the API: a server that cannot be reached is a form error and no row."""
    form = {
        "name": "silent",
        "transport": "stdio",
        "command": "/bin/false",
        "args": "[]",
        "env": "{}",
        "cwd": "",
        "url": "",
        "headers": "{}",
        "enabled": "on",
    }
    page = admin_client.post("/admin/toolcatalog/mcpserver/add/", form)
    assert page.status_code == 200  # the form again, with its error
    text = page.content.decode()
    assert "MCP server &#x27;silent&#x27;" in text and "Nothing was changed." in text and "errornote" in text
    assert "was added successfully" not in text
    assert not McpServer.objects.exists()
    # The same server, reachable, is saved with its tools in one step.
    form |= {"name": "probe", "command": sys.executable, "args": json.dumps([str(PROBE), "--without", "grow"])}
    saved = admin_client.post("/admin/toolcatalog/mcpserver/add/", form, follow=True)
    assert "was added successfully" in saved.content.decode()
    assert Tool.objects.filter(server__name="probe", enabled=True).exists()


@pytest.mark.req("MC-2")
def test_images_a_server_returns_reach_the_model_only_as_the_api_takes_them(tmp_path):
    """QA: an SVG from a server failed the whole run (the API takes JPEG, PNG, GIF and WebP only)."""
    call_command("catalog", "import-mcp", "--config", str(_servers_file(tmp_path, _reference_servers(only=("probe",)))))
    drawn = run_toolbox(workspace=tmp_path, deferral=False).execute("probe__drawings", {})
    assert drawn["ok"] is True and drawn["text"] == "drawn"
    # The PNG labelled image/jpeg goes as what it is; the SVG and the bytes that are no image are
    # left out with the reason, the result kept.
    assert drawn["images"] == [{"media_type": "image/png"}]
    assert drawn["images_left_out"] == [
        "an image was left out: it is no JPEG, PNG, GIF or WebP image (labelled image/svg+xml)",
        "an image was left out: it is no JPEG, PNG, GIF or WebP image (labelled image/png)",
    ]
    # And the request carrying it is one the API takes: the emulator refuses what it refuses.
    payload = {
        "model": "claude-sonnet-4-5",
        "messages": [
            {"role": "user", "content": "draw"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "d", "input": {}}]},
            {"role": "user", "content": [tool_result("toolu_1", drawn)]},
        ],
    }
    assert Emulator().count_tokens(payload) > 0
