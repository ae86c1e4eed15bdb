"""An installation of the first release upgrades in place: `migrate` takes its database to this
release, and what it held keeps working.

The database is taken back to the first release's migrations, filled the way that release
stored things (a stdio MCP server as one command line, a mode, a conversation with a reply),
then migrated forward as an operator's `controlcenter manage migrate` does.
"""

from __future__ import annotations

import copy
import shlex
import sys
from typing import Any

import pytest
from django.contrib.auth.hashers import make_password
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from agents.chat import message_send
from agents.lifecycle import run_execute
from agents.models import Run
from conversations.models import Conversation
from engine.emulator import Emulator
from engine.emulator.server import EmulatorServer
from toolcatalog.models import McpServer, Mode, Tool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("inprocess_runs")]

# The leaf migration of each app in the first release (dd46ae4).
FIRST_RELEASE = [
    ("agents", "0006_approval_status_expired"),
    ("conversations", "0005_conversation_model_mode"),
    ("scratchpad", "0002_chunk_data_storage_external"),
    ("toolcatalog", "0002_tool_server_missing_mcpcallcount"),
]
TIME_SERVER_LINE = shlex.join([sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"])
UNSPLITTABLE_LINE = 'python -m "server with an unclosed quote'
MODEL = "claude-sonnet-4-5"


def _first_release_rows() -> int:
    """Rows as the first release wrote them, through its own schema; returns the conversation's id."""
    executor = MigrationExecutor(connection)
    executor.migrate(FIRST_RELEASE)
    old = executor.loader.project_state(FIRST_RELEASE).apps
    user = old.get_model("auth", "User").objects.create(username="carol", password=make_password("carol-pass-1"))
    servers = old.get_model("toolcatalog", "McpServer").objects
    servers.create(name="time", transport="stdio", command=TIME_SERVER_LINE)
    servers.create(name="broken", transport="stdio", command=UNSPLITTABLE_LINE)
    servers.create(name="remote", transport="http", url="https://mcp.example.com/mcp")
    mode = old.get_model("toolcatalog", "Mode").objects.create(name="reviewer", allow=["*"], deny=["bash"])
    conversation = old.get_model("conversations", "Conversation").objects.create(
        owner=user, title="from the first release", mode=mode
    )
    messages = old.get_model("conversations", "Message").objects
    question = messages.create(conversation=conversation, role="user", content=[{"type": "text", "text": "hi"}])
    answer = messages.create(
        conversation=conversation, parent=question, role="assistant", content=[{"type": "text", "text": "hello"}]
    )
    conversation.tip = answer
    conversation.save(update_fields=["tip"])
    return conversation.pk


def _migrate_to_this_release() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.req("MC-1")
def test_a_first_release_database_migrates_in_place_and_its_servers_modes_and_conversations_keep_working(
    settings, tmp_path, live_worker_name
):
    conversation_id = _first_release_rows()

    _migrate_to_this_release()

    # This release stores a stdio server's executable and arguments apart; the migration splits
    # the first release's command lines, and one it cannot parse is left for a person to fix.
    time_server = McpServer.objects.get(name="time")
    assert time_server.command == sys.executable
    assert time_server.args == ["-m", "mcp_server_time", "--local-timezone", "UTC"]
    broken = McpServer.objects.get(name="broken")
    assert (broken.command, broken.args) == (UNSPLITTABLE_LINE, [])
    assert McpServer.objects.get(name="remote").url == "https://mcp.example.com/mcp"
    # The split server starts: the real reference server's tools come into the catalog.
    call_command("catalog", "import-mcp", "time")
    assert set(Tool.objects.filter(server=time_server).values_list("name", flat=True)) == {
        "get_current_time",
        "convert_time",
    }

    mode = Mode.objects.get(name="reviewer")
    assert (mode.version, mode.resident_add, mode.resident_remove, mode.deny) == (1, [], [], ["bash"])

    # The conversation goes on where it stopped: its history goes with the next turn.
    payloads: list[dict[str, Any]] = []

    def answer(payload: dict[str, Any]) -> list[dict[str, Any]]:
        payloads.append(copy.deepcopy(payload))
        return [{"type": "text", "text": "still here"}]

    settings.CC_WORKSPACE_ROOT = tmp_path
    settings.CC_MODEL, settings.CC_MODELS = MODEL, {MODEL: "anthropic"}
    with EmulatorServer(Emulator(policy=answer)) as server:
        settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "test-key", server.base_url
        _, run = message_send(conversation=Conversation.objects.get(pk=conversation_id), text="and now?")
        run_execute(run_id=run.pk, worker=live_worker_name)
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    sent = [(message["role"], _text(message["content"])) for message in payloads[0]["messages"]]
    assert sent == [("user", "hi"), ("assistant", "hello"), ("user", "and now?")]


def _text(content: str | list[dict[str, Any]]) -> str:
    return content if isinstance(content, str) else " ".join(block.get("text", "") for block in content)


@pytest.mark.django_db
def test_every_model_change_has_its_migration(capsys):
    # A model changed without its migration would work in the suite's freshly made database
    # and fail on an operator's upgrade.
    call_command("makemigrations", "--check", "--dry-run")
    assert "No changes detected" in capsys.readouterr().out
