"""The tool sandbox itself (SB-1, SB-2, SB-3): what a sandboxed program sees, its limits, its lifetime.

These run real bubblewrap sandboxes through the bash tool and toolcatalog/sandbox.py; the attacker's
session through the whole product is tests/test_sandbox_attack.py.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from controlcenter.processes import ROOT
from conversations.models import Conversation
from toolcatalog import sandbox
from toolcatalog.builtins import WorkspaceToolBox
from toolcatalog.workspace import workspace_root


def _approve_all(name, arguments):
    return True


@pytest.fixture
def box(tmp_path: Path) -> WorkspaceToolBox:
    return WorkspaceToolBox(tmp_path, approve=_approve_all)


def _bash(box: WorkspaceToolBox, command: str, **extra) -> dict:
    return box.execute("bash", {"command": command, **extra})


def _alive(pattern: str) -> str:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout


@pytest.mark.req("SB-1")
def test_the_sandbox_sees_its_workspace_at_a_fixed_path_and_the_system_read_only(box, tmp_path):
    (tmp_path / "mine.txt").write_text("mine\n")
    seen = _bash(box, "pwd; cat mine.txt; echo made > made.txt; ls /; touch /usr/x 2>&1; ls /etc")
    lines = seen["stdout"].splitlines()
    assert lines[:2] == ["/workspace", "mine"]
    assert (tmp_path / "made.txt").read_text() == "made\n"
    root = set(lines[2 : lines.index("alternatives") - 1])
    assert {"usr", "workspace", "etc", "proc", "dev", "tmp"} <= root
    assert root <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr", "workspace"}
    assert "Read-only file system" in seen["stdout"]
    etc = set(lines[lines.index("alternatives") :])
    assert "passwd" in etc and "shadow" not in etc and "postgresql" not in etc and "hostname" in etc


@pytest.mark.req("SB-1")
def test_nothing_of_the_host_is_visible(box, tmp_path, settings):
    hidden = [str(ROOT), str(settings.VAR_DIR), str(tmp_path.parent), "/home", "/root", "/work", "/var", "/run"]
    seen = _bash(box, "; ".join(f"ls -d {path} 2>&1" for path in hidden))
    for path in hidden:
        assert f"cannot access '{path}': No such file or directory" in seen["stdout"], seen


@pytest.mark.req("SB-1")
def test_the_environment_of_the_program_and_of_the_sandboxs_pid_1_is_the_allow_list(box, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-should-not-leak")
    monkeypatch.setenv("DATABASE_URL", "postgres://user:hunter2@db/cc")
    seen = _bash(box, "tr '\\0' '\\n' < /proc/1/environ; echo ---; tr '\\0' '\\n' < /proc/$PPID/environ; echo ---; env")
    pid1, parent, own = seen["stdout"].split("---\n")
    allowed = {"PATH", "HOME", "LANG", "LC_ALL", "TERM"}
    assert {line.split("=")[0] for line in pid1.split()} == allowed
    assert {line.split("=")[0] for line in parent.split()} == allowed
    assert {line.split("=")[0] for line in own.split()} <= allowed | {"PWD", "SHLVL", "_"}
    assert "HOME=/workspace" in own
    assert "sk-should-not-leak" not in seen["stdout"] and "hunter2" not in seen["stdout"]


@pytest.mark.req("SB-1")
def test_the_uid_inside_is_unprivileged_and_cannot_become_root(box):
    seen = _bash(box, "id -u; grep -E '^Cap(Eff|Prm)' /proc/self/status; unshare -r id -u 2>&1; su -c id 2>&1")
    lines = seen["stdout"].splitlines()
    assert lines[0] == "1000"
    assert lines[1].split() == ["CapPrm:", "0000000000000000"]
    assert lines[2].split() == ["CapEff:", "0000000000000000"]
    assert "unshare failed" in lines[3]
    assert "uid=0" not in seen["stdout"]


@pytest.mark.req("SB-1")
def test_other_processes_of_the_host_are_invisible(box):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        seen = _bash(box, "ps -eo pid=,comm=")
        pids = [line.split()[0] for line in seen["stdout"].splitlines()]
        assert str(sleeper.pid) not in pids and len(pids) <= 4, seen["stdout"]
        assert "1" in pids  # the sandbox's own init
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.req("SB-2")
def test_there_is_no_network_by_default_not_even_the_hosts_loopback(box):
    server = subprocess.Popen(
        [sys.executable, "-c", "import socket,time; s=socket.socket(); s.bind(('127.0.0.1', 0)); s.listen();"
         "print(s.getsockname()[1], flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = int(server.stdout.readline())
        seen = _bash(box, f"timeout 3 bash -c 'echo > /dev/tcp/127.0.0.1/{port}' 2>&1; ip -o link 2>&1 | wc -l")
        assert "Connection refused" in seen["stdout"], seen
        seen = _bash(
            box, "getent hosts example.com || echo no-dns; timeout 3 bash -c 'echo > /dev/tcp/1.1.1.1/53' 2>&1"
        )
        assert "no-dns" in seen["stdout"] and "Network is unreachable" in seen["stdout"], seen
    finally:
        server.kill()
        server.wait()


@pytest.mark.req("SB-2")
def test_network_on_reaches_out_but_never_the_hosts_loopback(box, settings):
    settings.CC_SANDBOX_NETWORK = "on"
    server = subprocess.Popen(
        [sys.executable, "-c", "import socket,time; s=socket.socket(); s.bind(('0.0.0.0', 0)); s.listen();"
         "print(s.getsockname()[1], flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = int(server.stdout.readline())
        seen = _bash(
            box,
            f"ip -o -4 addr show tap0 | grep -o 'inet [0-9./]*'; cat /etc/resolv.conf; "
            f'for host in 127.0.0.1 10.0.2.2; do timeout 3 bash -c "echo > /dev/tcp/$host/{port}" 2>&1 '
            f"&& echo $host-open || echo $host-closed; done",
        )
        out = seen["stdout"]
        assert "inet 10.0.2.100/24" in out and "nameserver 10.0.2.3" in out, seen
        # Its own loopback is its own; the host's loopback (10.0.2.2 under slirp4netns) is refused.
        assert "127.0.0.1-closed" in out and "10.0.2.2-closed" in out, seen
    finally:
        server.kill()
        server.wait()
    assert _alive("slirp4netns") == ""


@pytest.mark.req("SB-3")
def test_a_detached_process_does_not_outlive_its_call(box):
    seen = _bash(box, "(setsid sleep 4242 &); nohup sleep 4243 >/dev/null 2>&1 & disown; echo left")
    assert seen["ok"] is True and seen["stdout"] == "left\n"
    time.sleep(0.2)
    assert _alive("sleep 424[23]") == ""


@pytest.mark.req("SB-3")
def test_a_timeout_kills_the_whole_sandbox(box, tmp_path):
    started = time.monotonic()
    seen = _bash(box, "(setsid bash -c 'sleep 30; touch late.txt' &); sleep 30", timeout_seconds=1)
    assert time.monotonic() - started < 5
    assert seen["timed_out"] is True and "every process it started" in seen["error"]
    time.sleep(0.3)
    assert not (tmp_path / "late.txt").exists() and _alive("sleep 30; touch late") == ""


@pytest.mark.django_db
@pytest.mark.req("SB-3")
def test_cancel_kills_the_running_sandbox_within_a_second(tmp_path):
    box = WorkspaceToolBox(tmp_path, approve=_approve_all, conversation_id=987654)
    outcome: dict = {}
    # A duration of its own, so a sleep left by another run on this machine is not taken for ours.
    command = f"sleep {6000 + secrets.randbelow(100_000) / 1000:.3f}"
    thread = threading.Thread(target=lambda: outcome.update(box.execute("bash", {"command": command})))
    thread.start()
    deadline = time.monotonic() + 10
    while not sandbox.kill_running(987654):
        assert time.monotonic() < deadline, "the sandbox never started"
        time.sleep(0.02)
    cancelled = time.monotonic()
    thread.join(timeout=5)
    assert time.monotonic() - cancelled < 1.0
    assert outcome["ok"] is False and "cancelled" in outcome["error"]
    assert _alive(command) == ""


@pytest.mark.req("SB-3")
def test_the_sandbox_dies_with_its_worker(tmp_path):
    # A worker process is killed (SIGKILL, no cleanup) while its tool runs a detached process.
    script = textwrap.dedent(
        f"""
        import django, os
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlcenter.settings")
        django.setup()
        from pathlib import Path
        from toolcatalog import sandbox
        sandbox.run(Path({str(tmp_path)!r}), ["bash", "-c", "(setsid sleep 4711 &); sleep 4712"],
                    limits=sandbox.Limits.from_settings(), output_cap=1000)
        """
    )
    worker = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 30
    while "4711" not in (_alive("sleep 4711") and "4711"):
        assert time.monotonic() < deadline and worker.poll() is None, "the sandbox never started"
        time.sleep(0.05)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    deadline = time.monotonic() + 2
    while _alive("sleep 471[12]") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive("sleep 471[12]") == ""


@pytest.mark.req("SB-3")
def test_cpu_memory_process_and_file_size_limits_end_with_a_clear_tool_error(box, settings):
    settings.CC_SANDBOX_CPU_SECONDS = 1
    settings.CC_SANDBOX_MEMORY_MB = 128
    settings.CC_SANDBOX_PROCESSES = 32
    settings.CC_SANDBOX_FILE_SIZE_MB = 1
    cpu = _bash(box, "while :; do :; done")
    assert cpu["ok"] is False and "CPU-time limit of 1 s" in cpu["error"], cpu
    memory = _bash(box, "python3 -c 'bytearray(512 * 1024 * 1024)'")
    assert memory["ok"] is False and "memory limit of 128 MB" in memory["error"], memory
    processes = _bash(box, "for i in $(seq 60); do sleep 5 & done; wait")
    assert processes["ok"] is False and "process limit of 32" in processes["error"], processes
    big = _bash(box, "head -c 5M /dev/zero > big.bin")
    assert big["ok"] is False and "file-size limit" in big["error"], big


@pytest.mark.django_db
@pytest.mark.req("SB-3")
def test_the_disk_quota_covers_all_of_a_users_workspaces_and_a_refused_write_leaves_nothing(
    alice, bob, settings, tmp_path
):
    settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.CC_WORKSPACE_QUOTA_MB = 2
    first, second = (Conversation.objects.create(owner=alice, title=t) for t in ("one", "two"))
    bobs = Conversation.objects.create(owner=bob, title="bob's")
    (workspace_root(first.pk) / "old.bin").write_bytes(b"x" * 1_200_000)
    (workspace_root(bobs.pk) / "bob.bin").write_bytes(b"x" * 1_800_000)  # bob's use is bob's
    box = WorkspaceToolBox(workspace_root(second.pk), conversation_id=second.pk, approve=_approve_all)

    refused = box.execute("write_file", {"path": "new.txt", "content": "y" * 1_000_000})
    assert refused["ok"] is False and "2 MB quota" in refused["error"] and "nothing was written" in refused["error"]
    assert not (workspace_root(second.pk) / "new.txt").exists()
    assert box.execute("write_file", {"path": "small.txt", "content": "y" * 100_000})["ok"] is True

    filler = _bash(box, "for i in $(seq 1 20); do head -c 200K /dev/zero > fill-$i; done")
    assert filler["ok"] is False and "quota" in filler["error"] and "CC_WORKSPACE_QUOTA_MB" in filler["error"], filler
    after = box.execute("write_file", {"path": "more.txt", "content": "z" * 500_000})
    assert after["ok"] is False and "quota" in after["error"]
    # Over the quota a command still runs, to delete files, but cannot grow one.
    grow = _bash(box, "echo more >> small.txt")
    assert grow["ok"] is False and "reached your disk quota" in grow["error"], grow
    assert _bash(box, "rm fill-*")["ok"] is True
    assert box.execute("write_file", {"path": "more.txt", "content": "z" * 100_000})["ok"] is True
    # Bob is not affected by alice's use.
    bob_box = WorkspaceToolBox(workspace_root(bobs.pk), conversation_id=bobs.pk, approve=_approve_all)
    assert bob_box.execute("write_file", {"path": "b.txt", "content": "b" * 100_000})["ok"] is True


@pytest.mark.req("SB-1")
def test_a_missing_bubblewrap_refuses_to_run_anything(box, tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "PATH", "/nonexistent")
    refused = _bash(box, "touch ran.txt")
    assert refused["ok"] is False and "bubblewrap" in refused["error"]
    assert not (tmp_path / "ran.txt").exists()
