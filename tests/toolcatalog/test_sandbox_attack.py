"""An ordinary user cannot take over the installation through her own approved shell (SB-1, SB-2, SB-3).

The attacker's session, done for real: a services-mode stack (its own Redis, a uvicorn web
process and a Celery worker) with the provider key, the admin password and a generated
var/secret_key; alice's model (the emulator, scripted) asks for bash calls an attacker would
write, alice approves each one herself through the REST API, and the real worker runs them in
the real bubblewrap sandbox. Every attack must fail visibly in the tool result she gets back,
the host must show no trace of it afterwards, and the worker must still serve her.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import threading
import time

import httpx
import pytest
from django.db import connection
from rest_framework.authtoken.models import Token

from agents.models import Approval, Run, RunEvent
from controlcenter.processes import ROOT
from controlcenter.stack import Stack
from conversations.models import Conversation
from engine.emulator import Emulator, ScriptedPolicy
from engine.emulator.server import EmulatorServer
from scratchpad.models import Entry

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

MARKER = "31337"  # the detached sleeper's argument, to find it on the host afterwards


def _bash(call_id: str, command: str, timeout: int = 20) -> list[dict]:
    return [
        {"type": "tool_use", "id": call_id, "name": "bash", "input": {"command": command, "timeout_seconds": timeout}}
    ]


def _probe(name: str, command: str) -> str:
    """One attack: prints `name: OPEN <what it got>` if it worked, `name: BLOCKED <why>` if not."""
    flat = f'out=$({command} 2>&1 | tr "\\n" " ")'
    return f'if {flat}; then echo "{name}: OPEN $out"; else echo "{name}: BLOCKED $out"; fi\n'


def _port(name: str, port: int) -> str:
    return _probe(name, f"timeout 3 bash -c 'echo > /dev/tcp/127.0.0.1/{port}'")


def _approve_until_finished(client: httpx.Client, run_id: int, timeout: float = 150) -> Run:
    """Alice approves every call her run asks for, through the API, until the run ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.get(pk=run_id)
        if run.status not in ("queued", "running", "waiting"):
            return run
        for approval in Approval.objects.filter(run_id=run_id, status="pending"):
            answer = client.post(f"/api/approvals/{approval.pk}/approve/")
            assert answer.status_code == 200, answer.text
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} did not finish within {timeout}s")


def _results(run_id: int) -> dict[str, dict]:
    """Each tool call's observation, by its tool-use id, as the run's events recorded it."""
    events = RunEvent.objects.filter(run_id=run_id, type="tool_result").order_by("seq")
    return {event.payload["id"]: event.payload["output"] for event in events}


@pytest.mark.req("SB-1", "SB-2", "SB-3", "SB-4")
def test_alice_approving_her_own_malicious_shell_cannot_reach_secrets_data_network_or_outlive_the_call(
    tmp_path, alice, bob
):
    api_key, admin_password = f"sk-ant-LEAK{secrets.token_hex(8)}", f"admin-LEAK{secrets.token_hex(8)}"
    bob_conversation = Conversation.objects.create(owner=bob, title="bob's private work")
    workspaces = tmp_path / "workspaces"
    bob_file = workspaces / f"conversation-{bob_conversation.pk}" / "bob-diary.txt"
    bob_file.parent.mkdir(parents=True)
    bob_file.write_text("BOB-PRIVATE-DIARY\n")
    token = Token.objects.create(user=alice).key

    attack = "".join(
        [
            "set -o pipefail\n",
            _probe("pid1-environ", "tr '\\0' '\\n' < /proc/1/environ"),
            _probe("parent-environ", "tr '\\0' '\\n' < /proc/$PPID/environ"),
            _probe("environment", "env"),
            _probe("secret-key", f"cat {tmp_path}/var/secret_key"),
            _probe("sqlite", f"cat {tmp_path}/var/db.sqlite3 {ROOT}/var/db.sqlite3"),
            _probe("settings", f"cat {ROOT}/controlcenter/settings.py"),
            _probe("bob-workspace", f"cat {bob_file}"),
            _probe("bob-by-guess", f"ls /workspace/../conversation-{bob_conversation.pk}"),
            _probe("project-tree", f"ls {ROOT}"),
            _probe("home", "ls /home /root"),
            _probe("host-processes", "ps -eo comm= | grep -cE '^(python|celery|uvicorn|redis|postgres)'"),
            _probe("become-root", "unshare -r id -u"),
            "(setsid sleep " + MARKER + " &)\n",
            "nohup sleep " + MARKER + " >/dev/null 2>&1 &\n",
            "echo detached\n",
        ]
    )

    emulator = Emulator(policy=ScriptedPolicy([]))
    with EmulatorServer(emulator) as server:
        stack = Stack(
            connection.settings_dict["NAME"],
            tmp_path,
            {
                "CC_PROVIDER": "anthropic",
                "CC_MODEL": "claude-sonnet-4-5",
                "ANTHROPIC_API_KEY": api_key,
                "ANTHROPIC_BASE_URL": server.base_url,
                "CC_ADMIN_PASSWORD": admin_password,
                # The real approval flow: nothing is auto-approved.
                "CC_TOOL_AUTO_APPROVE": "",
                "CC_WORKSPACE_QUOTA_MB": "40",
                "CC_SANDBOX_PROCESSES": "64",
                "CC_SANDBOX_MEMORY_MB": "256",
            },
        )
        # No SECRET_KEY in the environment: the web process generates var/secret_key, as `make run` does.
        stack.env.pop("SECRET_KEY")
        try:
            web = stack.start_web()
            stack.start_worker()
            ports = {"postgres": int(connection.settings_dict["PORT"] or 5432), "redis": stack.redis.port}
            ports["web"] = int(web.base_url.rsplit(":", 1)[1])
            attack += "".join(_port(name, port) for name, port in ports.items())
            emulator.policy = ScriptedPolicy(
                [
                    [{"type": "text", "text": "Let me look around."}, *_bash("toolu_attack", attack)],
                    _bash("toolu_forkbomb", ":(){ :|:& };:; sleep 2", timeout=4),
                    _bash("toolu_memory", "python3 -c 'x = bytearray(2 * 1024**3)' || head -c 2G /dev/zero | tail"),
                    _bash("toolu_disk", "for i in $(seq 1 80); do head -c 1M /dev/zero > fill-$i; done; echo filled"),
                    _bash("toolu_alive", "rm fill-*; echo still-alive; id -u"),
                    "Done.",
                ]
            )
            client = httpx.Client(base_url=web.base_url, headers={"Authorization": f"Token {token}"}, timeout=30)
            conversation = client.post("/api/conversations/", json={"title": "innocent"}).json()
            sent = client.post(f"/api/conversations/{conversation['id']}/messages/", json={"text": "tidy up"})
            run = _approve_until_finished(client, sent.json()["run"]["id"])
            assert run.status == Run.Status.SUCCEEDED, run.error
            results = _results(run.pk)
            assert Approval.objects.filter(run=run, status="approved").count() == 5

            report = results["toolu_attack"]["stdout"]
            lines = {line.split(":", 1)[0]: line for line in report.splitlines() if ": " in line}
            expected = {"pid1-environ", "parent-environ", "environment", "secret-key", "sqlite", "settings"}
            expected |= {"bob-workspace", "bob-by-guess", "project-tree", "home", "host-processes", "become-root"}
            expected |= set(ports)
            assert expected <= set(lines), report
            # The environment (bwrap's PID 1 included) is the allow-list: nothing of the worker's.
            for name in ("pid1-environ", "parent-environ", "environment"):
                assert "HOME=/workspace" in lines[name], report
            assert api_key not in report and admin_password not in report
            assert "DATABASE_URL" not in report and "REDIS_URL" not in report and "SECRET_KEY" not in report
            secret_key = (tmp_path / "var" / "secret_key").read_text().strip()
            assert secret_key not in report
            for name in ("secret-key", "sqlite", "settings", "bob-workspace", "bob-by-guess", "project-tree", "home"):
                assert lines[name].startswith(f"{name}: BLOCKED"), lines[name]
                assert "No such file or directory" in lines[name], lines[name]
            assert "BOB-PRIVATE-DIARY" not in report
            # Only the sandbox's own processes are visible; no celery worker, no host PIDs.
            assert lines["host-processes"].strip() == "host-processes: BLOCKED 0", report
            assert lines["become-root"].startswith("become-root: BLOCKED"), lines["become-root"]
            for name in ports:  # an empty network namespace: loopback is the sandbox's own
                assert lines[name].startswith(f"{name}: BLOCKED") and "refused" in lines[name], lines[name]
            assert "detached" in report
            # Nothing the call started outlives it, detached or not.
            leftover = subprocess.run(["pgrep", "-f", f"sleep {MARKER}"], capture_output=True, text=True)
            assert leftover.stdout == "", leftover.stdout

            # The bomb's stderr is large, so the model gets it through the scratchpad (SP-1); the
            # stored observation keeps the error.
            forkbomb = results["toolu_forkbomb"]
            assert forkbomb["ok"] is False, forkbomb
            if "scratchpad_id" in forkbomb:
                forkbomb = Entry.objects.get(pk=forkbomb["scratchpad_id"]).envelope
            assert "process limit of 64" in forkbomb["error"], forkbomb
            memory = results["toolu_memory"]
            assert memory["ok"] is False and "memory limit of 256 MB" in memory["error"], memory
            disk = results["toolu_disk"]
            assert disk["ok"] is False and "quota" in disk["error"], disk
            assert "CC_WORKSPACE_QUOTA_MB" in disk["error"]
            alive = results["toolu_alive"]
            assert alive["ok"] is True and alive["stdout"] == "still-alive\n1000\n", alive
            assert httpx.get(f"{web.base_url}/healthz", timeout=5).status_code == 200
            _redos_over_mcp_leaves_the_web_process_answering(web, token, tmp_path / "workspaces", alice.pk)
        finally:
            stack.stop()


def _redos_over_mcp_leaves_the_web_process_answering(web, token: str, workspaces, user_id: int) -> None:
    """SB-4: a catastrophic regex through /mcp (no approval needed) while /healthz is polled."""
    base_url = web.base_url
    mine = workspaces / f"mcp-user-{user_id}"
    mine.mkdir(parents=True, exist_ok=True)
    (mine / "evil.txt").write_text(("a" * 34 + "!\n") * 50)
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        # `regex` answers the issue's `(a+)+$` at once; `(a|aa)+$` is exponential for it too.
        "params": {"name": "search_files", "arguments": {"pattern": "(a|aa)+$"}},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Authorization": f"Bearer {token}",
    }
    # The process's first /mcp request loads the MCP SDK (a CPU second and more); measured below is
    # what the regex costs, so a listing loads it first.
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    assert httpx.post(f"{base_url}/mcp", json=listing, headers=headers, timeout=60).status_code == 200
    answer: dict = {}
    cpu_before = web.cpu_seconds()
    caller = threading.Thread(
        target=lambda: answer.update(response=httpx.post(f"{base_url}/mcp", json=call, headers=headers, timeout=60))
    )
    started = time.monotonic()
    caller.start()
    latencies = []
    while caller.is_alive() or not latencies:
        began = time.monotonic()
        status = httpx.get(f"{base_url}/healthz", timeout=5).status_code
        latencies.append(time.monotonic() - began)
        assert status in (200, 503)
        time.sleep(0.05)
    caller.join()
    assert max(latencies) < 1.0, latencies
    # The budget is wall-clock (1 s), so the call costs the web process at most about a second of
    # CPU, plus the /healthz requests served meanwhile; on a loaded machine it takes longer in wall time.
    assert web.cpu_seconds() - cpu_before < 2.0
    assert time.monotonic() - started < 15
    text = answer["response"].text
    assert "CC_REGEX_TIMEOUT_SECONDS" in text and "backtracks catastrophically" in text, text
    call["params"]["arguments"]["pattern"] = "(a+)+$"
    began = time.monotonic()
    quick = httpx.post(f"{base_url}/mcp", json=call, headers=headers, timeout=60).json()
    assert time.monotonic() - began < 1.0 and quick["result"]["structuredContent"]["ok"] is True
    # A counted repetition is written out in full when compiled: `a{99999999}` took 23 GB and the
    # web process with it. This one would take 1.3 GB and seconds; it is refused before compiling.
    call["params"]["arguments"]["pattern"] = "a{5000000}"
    began = time.monotonic()
    refused = httpx.post(f"{base_url}/mcp", json=call, headers=headers, timeout=60).json()
    assert time.monotonic() - began < 1.0, refused
    assert refused["result"]["isError"] is True and "up to 5,000,000 copies" in json.dumps(refused), refused
    assert httpx.get(f"{base_url}/healthz", timeout=5).status_code in (200, 503)
