"""The tool sandbox itself (SB-1, SB-2, SB-3): what a sandboxed program sees, its limits, its lifetime.

These run real bubblewrap sandboxes through the bash tool and toolcatalog/sandbox.py; the attacker's
session through the whole product is tests/toolcatalog/test_sandbox_attack.py.
"""

from __future__ import annotations

import contextlib
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

from agents.turns import run_sandboxes, subagent_sandboxes
from controlcenter.processes import ROOT
from conversations.models import Conversation
from tests.support.db import drop_this_connection
from tests.support.timing import scaled
from toolcatalog import cgroups, quota, sandbox
from toolcatalog.builtins import WorkspaceToolBox
from toolcatalog.toolbox import builtin_executor
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


@pytest.mark.req("SB-3")
def test_only_tmp_and_dev_shm_are_writable_outside_the_workspace_and_both_are_sized(box, settings):
    # QA: /, /etc, /dev and /dev/shm were tmpfs of half the host's memory: 3 GB in /dev/shm in one
    # call (with the cgroup off), past CC_SANDBOX_TMP_MB and the memory limit of RLIMIT_AS.
    settings.CC_SANDBOX_TMP_MB = 8
    seen = _bash(
        box,
        "for target in /rootfile /etc/etcfile /dev/devfile; do "
        "head -c 1000 /dev/zero > $target 2>/dev/null && echo wrote $target || echo refused $target; done; "
        "for target in /tmp/big /dev/shm/big; do "
        "head -c 20000000 /dev/zero > $target 2>/dev/null; echo $target $(stat -c %s $target); done; "
        "echo ok > /dev/null && echo null-writable",
    )
    assert seen["stdout"].splitlines() == [
        "refused /rootfile",
        "refused /etc/etcfile",
        "refused /dev/devfile",
        "/tmp/big 8388608",
        "/dev/shm/big 8388608",
        "null-writable",
    ], seen


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
    # Ours only (this process started it): other workers' sandboxes may have network on too.
    ours = subprocess.run(["pgrep", "-x", "-P", str(os.getpid()), "slirp4netns"], capture_output=True, text=True)
    assert ours.stdout == ""


@pytest.mark.req("SB-3")
def test_a_detached_process_does_not_outlive_its_call(box):
    seen = _bash(box, "(setsid sleep 4242 &); nohup sleep 4243 >/dev/null 2>&1 & disown; echo left")
    assert seen["ok"] is True and seen["stdout"] == "left\n"
    time.sleep(0.2)
    assert _alive("sleep 424[23]") == ""


@pytest.mark.req("SB-3")
def test_a_timeout_kills_the_whole_sandbox(box, tmp_path):
    started = time.monotonic()
    # Odd durations: other tests on other workers run plain `sleep 30`s that pgrep would match.
    seen = _bash(box, "(setsid bash -c 'sleep 30.3917; touch late.txt' &); sleep 30.3917", timeout_seconds=1)
    assert time.monotonic() - started < scaled(5)  # not the sleep's 30 s
    assert seen.get("timed_out") is True and "every process it started" in seen["error"], seen
    time.sleep(0.3)
    assert not (tmp_path / "late.txt").exists() and _alive("sleep 30.3917; touch late") == ""


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
    assert time.monotonic() - cancelled < scaled(1.0)
    assert outcome["ok"] is False and "cancelled" in outcome["error"]
    assert _alive(command) == ""


@pytest.mark.django_db
@pytest.mark.req("SB-3")
def test_a_cancel_that_ends_the_sandbox_before_it_is_watched_still_reports_it_and_removes_its_cgroup(
    tmp_path, monkeypatch, per_call
):
    """Seen in CI: the cancel's kill (another thread) ended the call between its start and its
    pidfd_open, which then found no process (ESRCH); the call failed with ProcessLookupError and
    its cgroup stayed behind."""
    box = WorkspaceToolBox(tmp_path, approve=_approve_all, conversation_id=987655)
    opened = os.pidfd_open

    def cancelled_first(pid: int) -> int:
        sandbox.kill_running(987655)
        with contextlib.suppress(ChildProcessError):  # reaped, as by a wait in another thread
            os.waitpid(pid, 0)
        return opened(pid)  # raises ProcessLookupError, as it did in CI

    monkeypatch.setattr(sandbox.os, "pidfd_open", cancelled_first)
    outcome = box.execute("bash", {"command": f"sleep {6000 + secrets.randbelow(100_000) / 1000:.3f}"})
    assert outcome["ok"] is False and "cancelled" in outcome["error"], outcome
    assert _leftover_cgroups(per_call) == []


@pytest.mark.django_db
@pytest.mark.req("SB-3", "OP-3")
def test_cancelling_one_child_kills_its_commands_and_not_its_siblings_or_parents(tmp_path):
    # A parent run and two of its children work in one conversation's workspace at once.
    turns = {
        "parent": run_sandboxes(41),
        "first child": subagent_sandboxes("subagent-7"),
        "second child": subagent_sandboxes("subagent-8"),
    }
    commands = {who: f"sleep {7000 + secrets.randbelow(100_000) / 1000:.3f}" for who in turns}
    outcomes: dict[str, dict] = {}

    def call(who: str) -> None:
        outcomes[who] = builtin_executor(tmp_path, 987655, None, turns[who])("bash", {"command": commands[who]})

    threads = {who: threading.Thread(target=call, args=(who,)) for who in turns}
    for thread in threads.values():
        thread.start()
    deadline = time.monotonic() + 10
    while not all(_alive(command) for command in commands.values()):
        assert time.monotonic() < deadline, "the sandboxes never started"
        time.sleep(0.02)

    assert sandbox.kill_running(turns["first child"]) == 1
    threads["first child"].join(timeout=5)
    assert "cancelled" in outcomes["first child"]["error"]
    assert _alive(commands["first child"]) == ""
    time.sleep(0.5)  # a kill that spread would have reached the others by now
    assert _alive(commands["second child"]) and _alive(commands["parent"])
    assert "second child" not in outcomes and "parent" not in outcomes

    for who in ("second child", "parent"):
        assert sandbox.kill_running(turns[who]) == 1
        threads[who].join(timeout=5)
        assert _alive(commands[who]) == ""


@pytest.mark.req("SB-3")
def test_the_sandbox_dies_with_its_worker(tmp_path):
    # A worker process is killed (SIGKILL, no cleanup) while its tool runs a detached process.
    script = textwrap.dedent(
        f"""
        import os
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlcenter.settings")
        from pathlib import Path
        from toolcatalog import sandbox  # settings only: no app registry needed
        sandbox.run(Path({str(tmp_path)!r}), ["bash", "-c", "(setsid sleep 4711 &); sleep 4712"],
                    limits=sandbox.Limits.from_settings(), output_cap=1000)
        """
    )
    found = cgroups.layout()  # this process's, found while the worker lives
    assert found is not None
    worker = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 30
    # The sleep itself (the worker's own command line names it too).
    while not _alive("^sleep 4711"):
        assert time.monotonic() < deadline and worker.poll() is None, "the sandbox never started"
        time.sleep(0.05)
    # The call's cgroup, seen while its worker lives.
    made = [path for parent in found.parents() for path in parent.glob(f"{cgroups.PREFIX}{worker.pid}-*")]
    assert made
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    deadline = time.monotonic() + 2
    while _alive("sleep 471[12]") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive("sleep 471[12]") == ""
    # The dead worker's call cgroup is left behind until the next worker starts and removes it
    # (in a parallel suite, another test's worker may be that next one: either way it is gone).
    cgroups.reset()
    assert cgroups.layout() is not None and not any(path.exists() for path in made)


@pytest.fixture
def rlimits_only(settings):
    """The fallback where no cgroup is writable: per-process rlimits."""
    settings.CC_SANDBOX_CGROUP = "off"
    cgroups.reset()
    yield
    cgroups.reset()


@pytest.fixture
def per_call() -> cgroups.Layout:
    found = cgroups.layout()
    assert found is not None, "these tests need a writable cgroup (v2, or v1 pids+memory+cpuacct+freezer)"
    return found


@pytest.fixture(params=["as found", "v1 only"])
def per_call_each(request, monkeypatch):
    """The layout this host gives, and v1 alone (v2 hidden): its CPU time is cpuacct's, its kill the freezer's."""
    if request.param == "v1 only":
        mounts = cgroups._mounts
        monkeypatch.setattr(cgroups, "_mounts", lambda: [mount for mount in mounts() if mount[2] != "cgroup2"])
    cgroups.reset()
    found = cgroups.layout()
    assert found is not None, "these tests need a writable cgroup (v2, or v1 pids+memory+cpuacct+freezer)"
    assert request.param == "as found" or (found.v2 is None and {"cpuacct", "freezer"} <= set(found.v1))
    yield found
    cgroups.reset()


def _leftover_cgroups(found: cgroups.Layout) -> list[str]:
    mine = f"{cgroups.PREFIX}{os.getpid()}-"
    return [child.name for parent in found.parents() for child in parent.iterdir() if child.name.startswith(mine)]


@pytest.mark.req("SB-3")
def test_without_a_cgroup_per_process_limits_end_with_a_clear_tool_error(box, settings, rlimits_only):
    settings.CC_SANDBOX_CPU_SECONDS = 1
    settings.CC_SANDBOX_MEMORY_MB = 128
    settings.CC_SANDBOX_PROCESSES = 32
    settings.CC_SANDBOX_FILE_SIZE_MB = 1
    # RLIMIT_NPROC counts every process of the host uid: one of its own, not shared with other
    # sandboxes on this machine (a root worker's; an unprivileged worker's own uid counts too).
    settings.CC_SANDBOX_UID = 60000 + secrets.randbelow(5000)
    assert cgroups.describe().startswith("per process, with rlimits")
    cpu = _bash(box, "while :; do :; done")
    assert cpu["ok"] is False and "CPU-time limit of 1 s" in cpu["error"], cpu
    memory = _bash(box, "python3 -c 'bytearray(512 * 1024 * 1024)'")
    assert memory["ok"] is False and "memory limit of 128 MB" in memory["error"], memory
    processes = _bash(box, "for i in $(seq 60); do sleep 5 & done; wait")
    assert processes["ok"] is False and "process limit of 32" in processes["error"], processes
    big = _bash(box, "head -c 5M /dev/zero > big.bin")
    assert big["ok"] is False and "file-size limit" in big["error"], big


@pytest.mark.req("SB-3")
def test_the_process_limit_counts_the_calls_own_processes_and_nothing_else(box, settings, per_call):
    settings.CC_SANDBOX_PROCESSES = 32
    # 40 processes of the host uid the sandbox runs as: RLIMIT_NPROC would count them.
    uid = sandbox.sandbox_uid()
    prefix = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if uid is not None else []
    host = [subprocess.Popen([*prefix, "sleep", "61.5"]) for _ in range(40)]
    try:
        fits = _bash(box, "for i in $(seq 20); do sleep 0.3 & done; wait; echo all-started")
        assert fits["ok"] is True and fits["stdout"] == "all-started\n", fits
        started = time.monotonic()
        # An odd duration: other tests on other workers run plain `sleep 30`s that pgrep would match.
        bomb = _bash(box, "for i in $(seq 200); do sleep 30.2917 & done; wait", timeout_seconds=25)
        assert bomb["ok"] is False and "process limit of 32" in bomb["error"] and "killed" in bomb["error"], bomb
        assert time.monotonic() - started < 10  # stopped at the limit, not by the timeout
        assert all(process.poll() is None for process in host)  # the host's own are untouched
    finally:
        for process in host:
            process.kill()
            process.wait()
    assert _alive("sleep 30.2917") == "" and _leftover_cgroups(per_call) == []


@pytest.mark.req("SB-3")
def test_the_memory_limit_is_over_all_of_a_calls_processes(box, settings, per_call):
    settings.CC_SANDBOX_MEMORY_MB = 128
    hold = "python3 -c 'import time; b = bytearray(45 << 20); time.sleep(1)'"
    alone = _bash(box, hold)
    assert alone["ok"] is True, alone
    together = _bash(box, f"for i in 1 2 3 4; do {hold} & done; wait")
    assert together["ok"] is False and "memory limit of 128 MB" in together["error"], together
    assert "over all its processes" in together["error"]


@pytest.mark.req("SB-3")
def test_the_cpu_limit_is_summed_over_a_calls_processes(box, settings, per_call_each):
    settings.CC_SANDBOX_CPU_SECONDS = 1
    # Each burns 0.6 s of CPU: under the limit on its own, 1.8 s together.
    burn = "python3 -c 'import time\nwhile time.process_time() < 0.6: pass'"
    summed = _bash(box, f"for i in 1 2 3; do {burn} & done; wait; echo finished")
    assert summed["ok"] is False and "CPU-time limit of 1 s" in summed["error"], summed
    assert "summed over all its processes" in summed["error"] and "finished" not in summed["stdout"]


@pytest.mark.req("SB-3")
def test_a_call_killed_at_any_moment_leaves_no_process_and_no_cgroup(tmp_path, per_call_each):
    # A kill can land while bwrap is still cloning; killing the call's cgroup takes that child too.
    marker = f"{7000 + secrets.randbelow(100_000) / 1000:.3f}"
    for delay in range(0, 60, 6):
        running = sandbox.start(
            tmp_path,
            ["bash", "-c", f"(setsid sleep {marker} &); sleep {marker}"],
            limits=sandbox.Limits.from_settings(wall_seconds=30),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        assert running.cgroup is not None and running.cgroup.directories[0].is_dir()
        time.sleep(delay / 1000)
        running.kill()
        sandbox.finish(running)
        assert not any(directory.exists() for directory in running.cgroup.directories)
    assert _alive(f"sleep {marker}") == "" and _leftover_cgroups(per_call_each) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("CH-5")
def test_a_connection_dropped_after_the_tools_check_does_not_fail_the_command(alice, settings, tmp_path):
    """The race CI met: PostgreSQL dropped the worker's connection between the toolbox's check and
    the quota's look at the user's other workspaces, and the command never ran."""
    settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
    conversation = Conversation.objects.create(owner=alice, title="dropped")
    box = WorkspaceToolBox(workspace_root(conversation.pk), conversation_id=conversation.pk, approve=_approve_all)
    drop_this_connection()

    result = box.execute("bash", {"command": "echo ran"})
    assert result["ok"] is True and result["stdout"] == "ran\n", result


@pytest.mark.django_db
@pytest.mark.req("SB-3")
def test_the_disk_quota_covers_all_of_a_users_workspaces_and_nothing_past_it_stays(alice, bob, settings, tmp_path):
    settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.CC_WORKSPACE_QUOTA_MB = 2
    quota_bytes = 2 * 1024 * 1024
    first, second = (Conversation.objects.create(owner=alice, title=t) for t in ("one", "two"))
    bobs = Conversation.objects.create(owner=bob, title="bob's")
    old = workspace_root(first.pk) / "old.bin"
    old.write_bytes(b"x" * 1_200_000)
    (workspace_root(bobs.pk) / "bob.bin").write_bytes(b"x" * 1_800_000)  # bob's use is bob's
    root = workspace_root(second.pk)
    box = WorkspaceToolBox(root, conversation_id=second.pk, approve=_approve_all)

    def usage() -> int:
        return quota.tree_bytes(workspace_root(first.pk)) + quota.tree_bytes(root)

    refused = box.execute("write_file", {"path": "new.txt", "content": "y" * 1_000_000})
    assert refused["ok"] is False and "2 MB quota" in refused["error"] and "nothing was written" in refused["error"]
    assert not (root / "new.txt").exists()
    assert box.execute("write_file", {"path": "small.txt", "content": "y" * 100_000})["ok"] is True

    # Many files, one after the other: stopped, and the newest undone until alice fits again, the
    # one being written when it was stopped first; what stays is whole.
    filler = _bash(box, "for i in $(seq 1 20); do head -c 200K /dev/zero > fill-$i; done")
    assert filler["ok"] is False and "CC_WORKSPACE_QUOTA_MB" in filler["error"], filler
    assert "was undone (removed fill-" in filler["error"] and filler["quota_undone"], filler
    assert usage() <= quota_bytes
    kept = sorted(int(path.name.split("-")[1]) for path in root.glob("fill-*"))
    assert kept == list(range(1, len(kept) + 1)) and kept, kept
    assert all((root / f"fill-{i}").stat().st_size == 200 * 1024 for i in kept)
    # Writers in parallel: the same end state, within the quota.
    parallel = _bash(box, "for i in $(seq 1 12); do head -c 300K /dev/zero > par-$i & done; wait")
    assert parallel["ok"] is False and "was undone" in parallel["error"], parallel
    assert usage() <= quota_bytes
    # One file past what is left: the file-size limit stops it at the quota, and it is removed.
    big = _bash(box, "head -c 5M /dev/zero > big.bin")
    assert big["ok"] is False and "reached your disk quota" in big["error"] and "removed big.bin" in big["error"]
    assert not (root / "big.bin").exists() and usage() <= quota_bytes
    assert old.stat().st_size == 1_200_000 and (root / "small.txt").stat().st_size == 100_000

    # Over the quota (alice's other workspace grew meanwhile) a command still runs, to delete
    # files, but cannot grow one.
    old.write_bytes(b"x" * 2_000_000)
    after = box.execute("write_file", {"path": "more.txt", "content": "z" * 10_000})
    assert after["ok"] is False and "quota" in after["error"]
    grow = _bash(box, "echo more >> small.txt")
    assert grow["ok"] is False and "reached your disk quota" in grow["error"], grow
    assert (root / "small.txt").stat().st_size == 100_000
    assert _bash(box, "rm -f fill-* par-* small.txt")["ok"] is True
    assert box.execute("write_file", {"path": "more.txt", "content": "z" * 50_000})["ok"] is True
    # Bob is not affected by alice's use.
    bob_box = WorkspaceToolBox(workspace_root(bobs.pk), conversation_id=bobs.pk, approve=_approve_all)
    assert bob_box.execute("write_file", {"path": "b.txt", "content": "b" * 100_000})["ok"] is True


@pytest.mark.req("SB-1")
def test_a_missing_bubblewrap_refuses_to_run_anything(box, tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "PATH", "/nonexistent")
    refused = _bash(box, "touch ran.txt")
    assert refused["ok"] is False and "bubblewrap" in refused["error"]
    assert not (tmp_path / "ran.txt").exists()


@pytest.mark.req("SB-1")
def test_handing_the_workspace_over_never_changes_a_file_outside_through_a_swapped_folder(tmp_path):
    # Before every call a root worker gives the workspace's files to the sandbox uid, while another
    # call's command may be changing the tree: by path, a folder swapped for a link between the
    # listing and the chown handed the link's target (a host file) to that uid.
    if os.geteuid() != 0:
        pytest.fail("this test needs a root worker, as the product's own sandbox hand-over does")
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (workspace / "d").mkdir()
    names = [f"victim-{number}" for number in range(200)]  # a long listing: a wide window
    for name in names:
        (outside / name).write_text("host file\n")
        (workspace / "d" / name).write_text("own file\n")
    swapper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys\n"
            "os.chdir(sys.argv[1])\n"
            "while True:\n"
            "    os.rename('d', 'd_away'); os.symlink(sys.argv[2], 'd')\n"
            "    os.unlink('d'); os.rename('d_away', 'd')\n",
            str(workspace),
            str(outside),
        ]
    )
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            sandbox._hand_over(workspace, sandbox.INNER_UID)
            assert {(outside / name).stat().st_uid for name in names} == {0}
            # The workspace's own file back to root, so the next hand-over changes it again.
            for folder in ("d", "d_away"):
                with contextlib.suppress(OSError):
                    fd = os.open(workspace / folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                    try:
                        for name in names:
                            os.chown(name, 0, 0, dir_fd=fd, follow_symlinks=False)
                    finally:
                        os.close(fd)
        assert swapper.poll() is None  # it swapped for the whole time
    finally:
        swapper.kill()
        swapper.wait()
