"""A catalog change never rewrites a running conversation's tools (MC-4), through real runs.

The probe SDK server (stdio, sandboxed) is imported, then refreshed as a new version: one
resident tool's schema changed, one removed, one added. The model is the emulator behind the
Anthropic adapter, so the test sees the exact tools array and system blocks each request sent.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from agents.chat import message_send
from agents.lifecycle import run_execute
from agents.models import Run, RunEvent
from conversations.services import conversation_create
from engine.emulator import Emulator
from engine.emulator.server import EmulatorServer
from toolcatalog.mcp_client import connections
from toolcatalog.models import McpServer, Tool
from toolcatalog.services import mcp_server_delete

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("inprocess_runs")]


PROBE = Path(__file__).parents[1] / "support" / "mcp_servers" / "probe_server.py"
MODEL = "claude-sonnet-4-5"


class Recorder:
    """Answers in text, or calls the tool a message names (`use probe__x`); keeps every request."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []

    def __call__(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        self.payloads.append(copy.deepcopy(payload))
        last = payload["messages"][-1]["content"]
        text = last if isinstance(last, str) else " ".join(b.get("text", "") for b in last if b.get("type") == "text")
        if text.startswith("use ") and not any(b.get("type") == "tool_result" for b in last if isinstance(b, dict)):
            return [{"type": "tool_use", "name": text.removeprefix("use ").strip(), "input": {}}]
        return [{"type": "text", "text": "done"}]


def _import(tmp_path: Path, *args: str) -> str:
    config = {"mcpServers": {"probe": {"command": sys.executable, "args": [str(PROBE), *args]}}}
    path = tmp_path / "servers.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    call_command("catalog", "import-mcp", "--config", str(path))
    return path.read_text()


def _tools_bytes(payload: dict[str, Any]) -> str:
    return json.dumps(payload["tools"], sort_keys=True)


def _system_text(payload: dict[str, Any]) -> str:
    return json.dumps(payload.get("system"), sort_keys=True)


@pytest.mark.req("MC-4")
def test_a_refresh_changes_new_conversations_and_leaves_running_ones_as_they_began(
    alice, tmp_path, settings, live_worker_name
):
    connections.close()
    settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.CC_MODEL, settings.CC_MODELS = MODEL, {MODEL: "anthropic"}
    settings.CC_SERVER_TOOL_DEFERRAL = True
    _import(tmp_path, "--without", "grow", "crash", "detach", "peek")
    Tool.objects.filter(server__name="probe", name__in=["echo", "whoami"]).update(resident=True)
    recorder = Recorder()
    with EmulatorServer(Emulator(policy=recorder)) as server:
        settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "test-key", server.base_url

        def turn(conversation, text: str) -> tuple[Run, dict[str, Any]]:
            _, run = message_send(conversation=conversation, text=text)
            before = len(recorder.payloads)
            run_execute(run_id=run.pk, worker=live_worker_name)
            run.refresh_from_db()
            assert run.status == Run.Status.SUCCEEDED, run.error
            return run, recorder.payloads[before]

        running = conversation_create(owner=alice, title="running")
        _, first = turn(running, "hello")
        names = [tool["name"] for tool in first["tools"]]
        assert "probe__echo" in names and "probe__whoami" in names

        # The server's new version: echo's schema changed, whoami gone, novel added.
        _import(tmp_path, "--v2", "--without", "grow", "crash", "detach", "peek", "whoami")
        echo = Tool.objects.get(server__name="probe", name="echo")
        assert "times" in echo.input_schema["properties"] and echo.resident
        assert Tool.objects.get(server__name="probe", name="whoami").server_missing

        # The running conversation sends the very same tools and system blocks as before.
        _, later = turn(running, "hello again")
        assert _tools_bytes(later) == _tools_bytes(first)
        assert _system_text(later) == _system_text(first)
        # A new conversation takes the catalog as it is now: the new schema, no whoami, novel indexed.
        fresh = conversation_create(owner=alice, title="fresh")
        _, new = turn(fresh, "hello")
        new_tools = {tool["name"]: tool for tool in new["tools"]}
        assert "times" in new_tools["probe__echo"]["input_schema"]["properties"]
        assert "probe__whoami" not in new_tools
        assert "probe__novel" in _system_text(new) and "probe__novel" not in _system_text(later)

        # The removed tool, still offered where it was, says why it cannot run.
        run, _ = turn(running, "use probe__whoami")
        [result] = RunEvent.objects.filter(run=run, type="tool_result").values_list("payload", flat=True)
        assert "this tool was removed from server probe" in result["output"]["error"]

        # The whole server deleted: its tools go with it, and a conversation that still offers one
        # says so (QA: "is in the catalog but has no implementation", both parts false).
        mcp_server_delete(server=McpServer.objects.get(name="probe"))
        run, _ = turn(running, "use probe__picture")
        [result] = RunEvent.objects.filter(run=run, type="tool_result").values_list("payload", flat=True)
        assert "its MCP server probe was removed; this tool cannot be called any more" in result["output"]["error"]
    connections.close()
