"""stdio MCP servers run in the tool sandbox (MC-2, SB-1..3), through the real path: a real
bubblewrap, the probe SDK server imported from a servers file and called by a run's toolbox.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from toolcatalog.mcp_client import connections
from toolcatalog.models import McpServer
from toolcatalog.toolbox import run_toolbox
from toolcatalog.workspace import workspace_root

pytestmark = pytest.mark.django_db(transaction=True)

PROBE = Path(__file__).parents[1] / "support" / "mcp_servers" / "probe_server.py"
WORKER_CANARY = "worker-canary-5d2e"
SERVER_SECRET = "server-secret-81f0"


@pytest.fixture(autouse=True)
def _fresh_connections():
    connections.close()
    yield
    connections.close()


def _import_probe(tmp_path: Path, **extra) -> None:
    entry = {
        "command": sys.executable,
        "args": [str(PROBE), *extra.pop("args", [])],
        "env": {"PROBE_SECRET": SERVER_SECRET},
    }
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"mcpServers": {"probe": {**entry, **extra}}}), encoding="utf-8")
    call_command("catalog", "import-mcp", "--config", str(path))


def _tagged_processes(tag: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if tag.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _wait_until_none(tag: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while _tagged_processes(tag):
        assert time.monotonic() < deadline, f"processes outlived their server: {_tagged_processes(tag)}"
        time.sleep(0.1)


@pytest.mark.req("MC-2")
@pytest.mark.req("SB-1")
@pytest.mark.req("SB-2")
def test_a_stdio_server_sees_only_its_workspace_and_nothing_of_the_worker(alice, bob, tmp_path, settings, monkeypatch):
    settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
    monkeypatch.setenv("CC_TEST_WORKER_CANARY", WORKER_CANARY)
    _import_probe(tmp_path)
    from conversations.models import Conversation

    mine = Conversation.objects.create(owner=alice, title="mine")
    theirs = Conversation.objects.create(owner=bob, title="theirs")
    (workspace_root(mine.pk) / "notes.txt").write_text("alice's notes")
    bobs_file = workspace_root(theirs.pk) / "private.txt"
    bobs_file.write_text("bob's secret")
    secret_key = Path(settings.VAR_DIR) / "secret_key"
    assert secret_key.is_file()
    paths = [
        "/workspace/notes.txt",
        str(bobs_file),
        str(secret_key),
        str(Path(settings.VAR_DIR)),
        str(Path(settings.BASE_DIR) / "controlcenter" / "settings.py"),
        "/etc/shadow",
    ]

    seen = run_toolbox(workspace=workspace_root(mine.pk), deferral=False).execute("probe__peek", {"paths": paths})
    assert seen["ok"] is True, seen
    report = json.loads(seen["text"])
    files = report["files"]
    assert files["/workspace/notes.txt"] == "read: alice's notes" and report["cwd"] == "/workspace"
    for hidden in paths[1:]:
        assert files[hidden].startswith("refused: "), (hidden, files[hidden])
    # Neither its parent (the sandbox's PID 1) nor its own environment holds the worker's.
    for environ in (report["parent_environ"], report["init_environ"]):
        assert environ.startswith("read: ") and "PATH=" in environ
        assert WORKER_CANARY not in environ and "DATABASE_URL" not in environ and SERVER_SECRET not in environ
    assert "PROBE_SECRET" in report["env"] and "CC_TEST_WORKER_CANARY" not in report["env"]
    assert "DATABASE_URL" not in report["env"] and "REDIS_URL" not in report["env"]
    # No network by default: only its own loopback, where PostgreSQL and Redis are not.
    assert report["interfaces"] == ["lo"]
    assert report["postgres"].startswith("refused") and report["redis"].startswith("refused")

    # Bob's conversation gets a server process of its own, on his workspace only.
    bobs = run_toolbox(workspace=workspace_root(theirs.pk), deferral=False).execute(
        "probe__peek", {"paths": ["/workspace/private.txt", "/workspace/notes.txt"]}
    )
    bobs_files = json.loads(bobs["text"])["files"]
    assert bobs_files["/workspace/private.txt"] == "read: bob's secret"
    assert bobs_files["/workspace/notes.txt"].startswith("refused: ")
    assert len(connections.running()["probe"]) == 2


@pytest.mark.req("MC-1")
@pytest.mark.req("SB-2")
def test_network_true_in_a_servers_config_gives_that_server_outbound_network_only(tmp_path, settings):
    settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
    _import_probe(tmp_path, network=True)
    seen = run_toolbox(workspace=workspace_root(1), deferral=False).execute("probe__peek", {"paths": []})
    report = json.loads(seen["text"])
    assert report["interfaces"] == ["lo", "tap0"]  # slirp4netns's way out
    assert report["postgres"].startswith("refused") and report["redis"].startswith(
        "refused"
    )  # never the host's loopback


@pytest.mark.req("MC-2")
@pytest.mark.req("SB-3")
def test_stopping_a_server_or_killing_its_worker_ends_every_process_it_started(tmp_path, settings):
    settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
    tag = f"cc-mcp-{uuid.uuid4().hex[:10]}"
    _import_probe(tmp_path, args=["--tag", tag])
    toolbox = run_toolbox(workspace=workspace_root(1), deferral=False)
    assert toolbox.execute("probe__detach", {"tag": tag})["ok"] is True
    assert len(_tagged_processes(tag)) >= 2  # the server and its detached child
    connections.close("probe")
    _wait_until_none(tag, 5)

    # A worker that dies (SIGKILL: no atexit, no clean-up) takes its servers with it.
    worker = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", _WORKER.format(probe=str(PROBE), tag=tag, workspace=str(workspace_root(2)))],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "controlcenter.settings"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=settings.BASE_DIR,
    )
    try:
        line = worker.stdout.readline()
        assert line.strip() == b"detached", worker.stderr.read().decode()
        assert len(_tagged_processes(tag)) >= 2
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    _wait_until_none(tag, 5)


_WORKER = """
import django, sys, time
from pathlib import Path
django.setup()
from toolcatalog.mcp_client import McpConnections
from toolcatalog.mcp_spec import McpServerSpec
spec = McpServerSpec(name="probe", transport="stdio", command=sys.executable, args=["{probe}", "--tag", "{tag}"])
McpConnections().call_tool(spec, "detach", {{"tag": "{tag}"}}, workspace=Path("{workspace}"))
print("detached", flush=True)
time.sleep(600)
"""


@pytest.mark.req("MC-1")
def test_network_is_a_stdio_setting_and_a_clear_error_anywhere_else(django_user_model):

    from toolcatalog.mcp_config import parse_servers_file

    configs, problems = parse_servers_file(
        {
            "mcpServers": {
                "local": {"command": "mcp-server-fetch", "network": True},
                "remote": {"url": "https://example.com/mcp", "network": True},
                "vague": {"command": "x", "network": "yes"},
            }
        }
    )
    assert configs["local"]["network"] is True
    assert "network applies to stdio servers" in problems["remote"]
    assert "true or false" in problems["vague"]
    staff = django_user_model.objects.create_superuser(username="op", password="op-password-1")
    api = APIClient()
    api.force_authenticate(staff)
    config = {"name": "remote", "transport": "http", "url": "https://example.com/mcp", "network": True}
    refused = api.post("/api/mcp-servers/", config, format="json")
    assert refused.status_code == 400 and "network" in refused.content.decode()
    assert not McpServer.objects.exists()


@pytest.mark.req("MC-1")
def test_a_server_whose_folder_holds_the_workspaces_is_refused_naming_it_once(django_user_model, tmp_path, settings):
    settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
    script = tmp_path / "server.py"
    script.write_text("print('never started')\n")
    staff = django_user_model.objects.create_superuser(username="op", password="op-password-1")
    api = APIClient()
    api.force_authenticate(staff)
    config = {"name": "nosy", "transport": "stdio", "command": sys.executable, "args": [str(script)]}
    refused = api.post("/api/mcp-servers/", config, format="json")
    message = refused.json()["error"]["message"]
    assert refused.status_code == 400 and "would show the sandboxed server" in message, message
    assert message.count("MCP server 'nosy'") == 1, message
    assert not McpServer.objects.exists()
