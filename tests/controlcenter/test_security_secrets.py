"""Secrets never appear in logs, events, stored errors or error messages (RN-3).

A real stack (controlcenter/stack.py: its own password-protected redis-server, a uvicorn web process and
a Celery worker, all at DEBUG log level) runs with every kind of secret configured: the provider API key,
SECRET_KEY, a password in DATABASE_URL, a Redis password, the user's API/MCP token and MCP server
credentials (a token in an http server's URL, one in a stdio server's command line). It then does real
work and hits real errors: a run with a tool call and a failing tool, provider 429s, the worker's database
connections dropped mid-tool, wrong tokens on the API and /mcp, failing MCP imports and settings that stop
the server at start. Every log line, HTTP answer, command output and stored row is then searched.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from django.core import serializers
from django.db import connection
from rest_framework.authtoken.models import Token

from agents.models import ModelRequest, Run, RunEvent
from controlcenter.processes import ROOT
from controlcenter.stack import Stack, free_port
from conversations.models import Conversation, Message
from engine.emulator import Emulator, Fault, ScriptedPolicy
from engine.emulator.server import EmulatorServer
from tests.support.db import terminate_backends as _terminate_backends
from tests.support.waiting import run_finished as finished
from tests.support.waiting import wait_until as wait_for
from toolcatalog.models import McpServer, Tool

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]


def _secret(kind: str) -> str:
    return f"{kind}-LEAK{secrets.token_hex(12)}"


class _Refuses(BaseHTTPRequestHandler):
    """An MCP server that answers every request 401, as one behind a wrong token would."""

    def do_POST(self) -> None:
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": "unauthorized"}')

    do_GET = do_POST

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
        return


def _tool_turn() -> list[list[dict]]:
    bash = {"type": "tool_use", "id": "toolu_bash_1", "name": "bash", "input": {"command": "sleep 2; echo fine"}}
    missing = {"type": "tool_use", "id": "toolu_read_1", "name": "read_file", "input": {"path": "missing.txt"}}
    return [
        [{"type": "text", "text": "Running it."}, bash],
        [{"type": "text", "text": "Reading it."}, missing],
        [{"type": "text", "text": "All done."}],
    ]


@pytest.mark.req("RN-3")
def test_no_secret_appears_in_logs_events_stored_errors_or_error_messages(tmp_path, alice):
    found: dict[str, str] = {}  # where -> text, everything a secret could leak into

    api_key, secret_key = _secret("sk-ant-api03"), _secret("django-secret-key") + secrets.token_urlsafe(40)
    db_password, redis_password = _secret("dbpass"), _secret("redispass")
    url_token, command_token = _secret("mcp-url-token"), _secret("mcp-command-token")
    token = Token.objects.create(user=alice).key
    db = connection.settings_dict
    database_url = (
        f"postgres://{db['USER']}:{db_password}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    )

    emulator = Emulator(policy=ScriptedPolicy([*_tool_turn(), "Second answer."]))
    refusing = ThreadingHTTPServer(("127.0.0.1", 0), _Refuses)
    threading.Thread(target=refusing.serve_forever, daemon=True).start()
    McpServer.objects.create(
        name="tokened", transport="http", url=f"http://127.0.0.1:{refusing.server_port}/mcp?token={url_token}"
    )
    McpServer.objects.create(
        name="closed", transport="http", url=f"http://user:{url_token}@127.0.0.1:{free_port()}/mcp"
    )
    McpServer.objects.create(
        name="stdio",
        transport="stdio",
        command="/nonexistent/mcp-server",
        args=["--stdio"],
        env={"MCP_TOKEN": command_token},
    )

    with EmulatorServer(emulator) as server:
        stack = Stack(
            db["NAME"],
            tmp_path,
            {
                "CC_PROVIDER": "anthropic",
                "CC_MODEL": "claude-sonnet-4-5",
                "ANTHROPIC_API_KEY": api_key,
                "ANTHROPIC_BASE_URL": server.base_url,
                "SECRET_KEY": secret_key,
                "DATABASE_URL": database_url,
                "LOG_LEVEL": "DEBUG",
            },
            redis_password=redis_password,
        )
        try:
            web = stack.start_web()
            stack.start_worker()
            client = httpx.Client(base_url=web.base_url, headers={"Authorization": f"Token {token}"}, timeout=30)
            conversation = client.post("/api/conversations/", json={"title": "secrets"}).json()
            messages_url = f"/api/conversations/{conversation['id']}/messages/"

            # A run with a shell call, a failing tool call, and the worker's database dropped mid-tool.
            first = client.post(messages_url, json={"text": "do the work"}).json()["run"]["id"]
            wait_for(lambda: RunEvent.objects.filter(run_id=first, type="tool_call").exists(), 60, "the tool call")
            assert _terminate_backends(stack.app_name("worker", 0)) >= 1
            run = finished(first, timeout=90)
            if run.status == Run.Status.FAILED:
                found["retry"] = client.post(f"/api/runs/{first}/retry/").text
                finished(json.loads(found["retry"])["id"], timeout=90)

            # Provider 429s, then an answer.
            emulator.inject(Fault("rate_limit", retry_after=1))
            emulator.inject(Fault("overloaded", retry_after=1))
            second = client.post(messages_url, json={"text": "again"}).json()["run"]["id"]
            assert finished(second, timeout=90).status == Run.Status.SUCCEEDED

            # Wrong credentials on every door; the right token on /mcp.
            # The first /mcp request of a web process loads the MCP SDK: seconds on a loaded machine.
            found["wrong api token"] = httpx.get(
                f"{web.base_url}/api/conversations/", headers={"Authorization": "Token nope"}, timeout=60
            ).text
            mcp_headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
            listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
            found["mcp wrong token"] = httpx.post(
                f"{web.base_url}/mcp", json=listing, headers={**mcp_headers, "Authorization": "Bearer nope"}, timeout=60
            ).text
            found["mcp"] = httpx.post(
                f"{web.base_url}/mcp",
                json=listing,
                headers={**mcp_headers, "Authorization": f"Bearer {token}"},
                timeout=60,
            ).text
            found["healthz"] = client.get("/healthz").text
            found["a missing run"] = client.get("/api/runs/999999/").text

            # MCP imports that fail: a 401, a closed port, a command that does not exist.
            for name in ("tokened", "closed", "stdio"):
                imported = subprocess.run(
                    [sys.executable, "manage.py", "catalog", "import-mcp", name],
                    cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                assert imported.returncode != 0, imported.stdout
                found[f"import-mcp {name}"] = imported.stdout + imported.stderr
        finally:
            stack.stop()
            refusing.shutdown()

    # Settings that stop the server at start name the variable, never its secret.
    bad_settings = {
        "DATABASE_URL": f"postgresql+psycopg://cc:{db_password}@db/cc?password={db_password}",
        "REDIS_URL": f"http://:{redis_password}@redis:6379/0",
        "ANTHROPIC_BASE_URL": f"ftp://key:{api_key}@example.com/",
    }
    for name, value in bad_settings.items():
        env = {**stack.env, name: value}
        started = subprocess.run(
            [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert started.returncode != 0 and name in started.stderr, started.stderr
        found[f"startup with a bad {name}"] = started.stdout + started.stderr

    for log in sorted(Path(tmp_path).glob("*.log")):
        found[log.name] = log.read_text(errors="replace")
    stored = [Run, RunEvent, ModelRequest, Message, Conversation, Tool]
    for model in stored:
        found[f"table {model.__name__}"] = serializers.serialize("json", model.objects.all())

    # The search can fail: the material is really there (the run, its tool error, the retries, the imports).
    assert "agents.run_turn" in found["worker-0.log"] and "HTTP Request" in found["worker-0.log"]
    assert "is_error" in found["table Message"] or '"ok": false' in found["table RunEvent"]
    assert ModelRequest.objects.filter(run_id=second).exists()
    assert "127.0.0.1" in found["import-mcp closed"] and "***" in found["startup with a bad DATABASE_URL"]
    assert "HTTP/1.1 429" in found["worker-0.log"] and "database connection was lost" in found["worker-0.log"]

    # The redaction keeps every formatter working (uvicorn's access log unpacks its arguments).
    assert '"POST /mcp HTTP/1.1" 200' in found["web-0.log"]
    assert not [where for where, text in found.items() if "--- Logging error ---" in text]

    leaks = {
        label: [where for where, text in found.items() if value in text]
        for label, value in {
            "ANTHROPIC_API_KEY": api_key,
            "SECRET_KEY": secret_key,
            "database password": db_password,
            "Redis password": redis_password,
            "API/MCP token": token,
            "MCP server URL token": url_token,
            "MCP server command token": command_token,
        }.items()
    }
    assert leaks == {label: [] for label in leaks}, leaks


@pytest.mark.req("RN-3")
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("POST http://h/mcp?token=abc&page=2 done", "POST http://h/mcp?token=***&page=2 done"),
        ("postgres://cc:pw@db:5432/cc", "postgres://cc:***@db:5432/cc"),
        ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("https://x/a?api_key=k1&X-Amz-Signature=s2", "https://x/a?api_key=***&X-Amz-Signature=***"),
        ("GET /api/runs/1/events/?after=5 200", "GET /api/runs/1/events/?after=5 200"),
        ("user@example.com said key: value", "user@example.com said key: value"),
        ("the key sk-ant-XYZ12345 leaked", "the key *** leaked"),
    ],
)
def test_redaction_hides_credentials_and_leaves_ordinary_text(text, expected):
    from controlcenter.redact import redact_text

    assert redact_text(text, ["sk-ant-XYZ12345"]) == expected
