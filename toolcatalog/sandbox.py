"""The OS sandbox every program a tool runs goes through (SB-1, SB-2, SB-3).

A program runs under bubblewrap in fresh user, PID, IPC, UTS, cgroup, mount and network
namespaces (the network one empty by default; with `CC_SANDBOX_NETWORK=on`, slirp4netns NATs it
out without the host's loopback). It sees its workspace read-write at `/workspace`, the system
directories read-only, a `/etc` of a few files, its own `/proc`, `/dev` and a small `/tmp`;
nothing else of the host. bwrap itself is started with the allow-listed environment, so the
sandbox's PID 1 holds nothing of the worker's either.

Limits and lifetimes: where a cgroup is writable, each call runs in a cgroup of its own
(toolcatalog/cgroups.py) with a process limit, a memory limit and a CPU-time budget over all of
its processes, and ending the call kills that cgroup; elsewhere per-process rlimits apply. The
program is also PID 2 of its own PID namespace under bwrap's init, which ends the namespace
(every process in it, detached or not) when the program exits; `--die-with-parent` does the same
when the worker dies, and `Sandboxed.kill()` when a call times out or is cancelled.

Identity: a non-root worker runs the sandbox as itself. A root worker first drops to
`CC_SANDBOX_UID` (the kernel ignores RLIMIT_NPROC for root, so a fork bomb could not be bounded
otherwise) and hands the workspace to that uid. Inside, the uid is 1000 with no capabilities,
no setuid (no_new_privs) and no nested user namespaces.

The API is small on purpose: `start()` for a long-lived program on pipes (an MCP stdio server),
`run()` for a command with a timeout and output caps (the bash tool), `kill_running()` for cancel.
"""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from django.conf import settings

from toolcatalog.cgroups import CallCgroup
from toolcatalog.workspace import entries_beneath

WORKSPACE = "/workspace"
INNER_UID = 1000
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_READ_CHUNK = 65536
# Host /etc entries a shell and the usual tools need to start (dynamic linker, alternatives,
# certificates, time zone); nothing with accounts, credentials or host configuration.
_ETC = ("ld.so.cache", "alternatives", "ssl", "localtime", "nsswitch.conf", "protocols", "services")
_BWRAP_WRITES = 4096
_SYSTEM = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces here; nothing runs unsandboxed instead."""


@dataclass(frozen=True)
class Limits:
    """Per-call limits; every field is a setting (`CC_SANDBOX_*`)."""

    cpu_seconds: int
    memory_mb: int
    processes: int
    file_size_mb: int
    wall_seconds: float
    tmp_mb: int

    @classmethod
    def from_settings(cls, *, wall_seconds: float | None = None) -> Limits:
        return cls(
            cpu_seconds=settings.CC_SANDBOX_CPU_SECONDS,
            memory_mb=settings.CC_SANDBOX_MEMORY_MB,
            processes=settings.CC_SANDBOX_PROCESSES,
            file_size_mb=settings.CC_SANDBOX_FILE_SIZE_MB,
            wall_seconds=wall_seconds if wall_seconds is not None else settings.CC_BASH_MAX_TIMEOUT_SECONDS,
            tmp_mb=settings.CC_SANDBOX_TMP_MB,
        )


def bwrap_path() -> str | None:
    return shutil.which("bwrap", path=PATH)


def check() -> None:
    """Raise SandboxUnavailable with what to do when the sandbox cannot run on this host."""
    if bwrap_path() is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed; install Debian's `bubblewrap` package "
            "(apt-get install bubblewrap). Tools that run programs refuse to run without it."
        )
    probe = subprocess.run(  # noqa: S603 - a fixed argv
        [*_as_sandbox_user(sandbox_uid()), bwrap_path() or "bwrap", *bwrap_options(None), "--", "true"],
        env=environment(),
        capture_output=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        raise SandboxUnavailable(
            "bubblewrap cannot create its namespaces here: "
            f"{probe.stderr.decode(errors='replace').strip()}. Unprivileged user namespaces must be "
            "enabled (kernel.unprivileged_userns_clone=1; in Docker, a seccomp/AppArmor profile that "
            "allows them, see docs/security.md)."
        )


def environment() -> dict[str, str]:
    """The whole environment of the sandbox, bwrap's own included: the short allow-list."""
    return {"PATH": PATH, "HOME": WORKSPACE, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb"}


def sandbox_uid() -> int | None:
    """The host uid the sandbox runs as when the worker is root; None when it runs as the worker."""
    return settings.CC_SANDBOX_UID if os.geteuid() == 0 else None


def _as_sandbox_user(uid: int | None) -> list[str]:
    """The argv prefix that becomes `uid` before the program starts (setpriv: no fork-time Python)."""
    if uid is None:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def _launcher(limits: Limits, uid: int | None, file_size: int, *, per_call: bool) -> list[str]:
    """prlimit then setpriv in front of bwrap: the limits are set before bwrap creates its user
    namespace (RLIMIT_NPROC is captured then), and Python can spawn with vfork instead of
    running a preexec function in a forked copy of a large process (tens of ms per call). (The
    worker cannot set them from outside once setpriv has changed the uid: that needs
    CAP_SYS_RESOURCE, which a root worker in a container may lack.)

    `per_call`: the call has its own cgroup, whose process and memory limits replace RLIMIT_NPROC
    (which counts every process of the host uid, the worker's own too) and RLIMIT_AS (address
    space, per process). RLIMIT_CPU stays as a per-process backstop of the call's CPU budget:
    nothing polls the budget of a long-lived MCP server."""
    mb = 1024 * 1024
    per_process = [] if per_call else [f"--as={limits.memory_mb * mb}", f"--nproc={limits.processes}"]
    return [
        "prlimit",
        # CPU: SIGXCPU at the soft limit (the result can name it), SIGKILL a second later.
        f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}",
        *per_process,
        f"--fsize={file_size}",
        "--core=0",
        "--",
        *_as_sandbox_user(uid),
    ]


def _etc_files() -> dict[str, str]:
    return {
        "passwd": f"sandbox:x:{INNER_UID}:{INNER_UID}:sandbox:{WORKSPACE}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"sandbox:x:{INNER_UID}:\nnogroup:x:65534:\n",
        "hostname": "sandbox\n",
        "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
    }


def bwrap_options(
    workspace_fd: int | None,
    *,
    cwd: str = ".",
    tmp_mb: int = 64,
    data_fds: dict[str, int] | None = None,
    more: Sequence[str] = (),
) -> list[str]:
    """bwrap's options for a sandbox whose workspace is the open directory `workspace_fd` (None: a probe);
    `more` are the caller's own (mounts among them), placed before the root is made read-only.

    The workspace goes in as a file descriptor opened by the worker, so a root worker's sandbox
    uid needs no access to the directories above it (var/ may be 0700).
    """
    options = [
        "--unshare-user",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--uid",
        str(INNER_UID),
        "--gid",
        str(INNER_UID),
        "--hostname",
        "sandbox",
        # Always a network namespace of its own; with network on, slirp4netns gives it a way out.
        "--unshare-net",
    ]
    for name in _SYSTEM:
        host = Path("/") / name
        if host.is_symlink():
            options += ["--symlink", str(host.readlink()), f"/{name}"]
        elif host.is_dir():
            options += ["--ro-bind", str(host), f"/{name}"]
    for name in _ETC:
        if (Path("/etc") / name).exists():
            options += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    for name, fd in (data_fds or {}).items():
        options += ["--ro-bind-data", str(fd), f"/etc/{name}"]
    # bwrap's / and /dev are tmpfs with no size of their own (half the host's memory; QA wrote
    # 3 GB into /dev/shm in one call): both become read-only, and the two places a program
    # expects to write are sized tmpfs.
    size = str(tmp_mb * 1024 * 1024)
    options += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
    options += ["--size", size, "--tmpfs", "/dev/shm", "--size", size, "--tmpfs", "/tmp"]
    if workspace_fd is None:
        return [*options, *more, "--remount-ro", "/", "--chdir", "/"]
    inside = WORKSPACE if cwd in ("", ".") else f"{WORKSPACE}/{cwd}"
    return [*options, "--bind-fd", str(workspace_fd), WORKSPACE, *more, "--remount-ro", "/", "--chdir", inside]


def _hand_over(workspace: Path, uid: int) -> None:
    """Give the workspace to the sandbox uid (root worker only): files the worker wrote stay writable inside.

    bwrap opens the workspace as that uid, so each directory above it must let others search
    it; a root worker adds the search bit (x, never read) where it is missing.
    """
    for parent in reversed(workspace.parents):
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
    with contextlib.suppress(FileNotFoundError):
        if workspace.lstat().st_uid != uid:
            os.lchown(workspace, uid, uid)
    # It runs before every call, while another call's command may be changing the tree: each
    # entry is changed relative to its open directory, never through a path a link could redirect
    # (a folder swapped for a link to /etc would have handed a host file to the sandbox uid).
    for directory, name, _path, info in entries_beneath(workspace):
        if info.st_uid != uid:
            with contextlib.suppress(FileNotFoundError):
                os.chown(name, uid, uid, dir_fd=directory, follow_symlinks=False)


def _searchable_parents(directory: Path) -> None:
    """Let the sandbox uid reach `directory` (root worker only): bwrap resolves a mount's source path
    as that uid, so each directory above it gets the search bit (x, never read) where it lacks it."""
    for parent in reversed(directory.parents):
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


_PIPE_BUFFER = 65536


def _pipe_of(data: bytes) -> int:
    """A pipe's read end already holding `data` (well under the 64 KiB a pipe buffers)."""
    read, write = os.pipe()
    try:
        os.write(write, data)
    finally:
        os.close(write)
    return read


# How often a running call's cgroup counters (CPU time, OOM kills, failed forks) are read.
POLL_SECONDS = 0.1


@dataclass(eq=False)
class Sandboxed:
    """A running sandbox: `kill()` ends every process in it (its cgroup, or its PID namespace with bwrap)."""

    process: subprocess.Popen[bytes]
    key: Any = None
    network: _Network | None = None
    cgroup: CallCgroup | None = None
    _killed: bool = field(default=False, repr=False)

    def kill(self) -> None:
        self._killed = True
        if self.cgroup is not None:
            self.cgroup.kill()  # every process of the call, bwrap and one being cloned included
        # Without a cgroup, a kill that lands while bwrap is still cloning the sandbox's PID 1 can
        # miss that child, which has not yet asked to die with its parent and is in a session of
        # its own (`--new-session`): it lives on under init (docs/security.md). Killing bwrap's
        # process group again later does not reach it, so only the cgroup closes that gap.
        self._kill_group()
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    def limit_hit(self, limits: Limits) -> str | None:
        """ "processes", "memory" or "cpu": the per-call limit the call ran into (cgroups only)."""
        return self.cgroup.limit_hit(limits.cpu_seconds) if self.cgroup is not None else None

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    @property
    def killed(self) -> bool:
        return self._killed


_running: dict[Any, set[Sandboxed]] = {}
_running_lock = threading.Lock()


def kill_running(key: Any) -> int:
    """Kill every sandbox started with this key (a cancel); returns how many were running."""
    with _running_lock:
        victims = list(_running.get(key, ()))
    for sandboxed in victims:
        sandboxed.kill()
    return len(victims)


def start(
    workspace: Path,
    command: Sequence[str],
    *,
    limits: Limits,
    cwd: str = ".",
    key: Any = None,
    file_size_bytes: int | None = None,
    stdin: Any = subprocess.DEVNULL,
    stdout: Any = subprocess.PIPE,
    stderr: Any = subprocess.PIPE,
    env: Mapping[str, str] | None = None,
    read_only: Sequence[Path] = (),
    network: bool | None = None,
    chdir: str | None = None,
) -> Sandboxed:
    """Start `command` in the sandbox of `workspace`; the caller waits and must `finish()` it.

    For a long-lived server (an MCP stdio server): `env` is set for the program alone (bwrap and
    the sandbox's PID 1 keep the allow-list), `read_only` host directories are mounted read-only
    at their own paths, `network` overrides CC_SANDBOX_NETWORK and `chdir` the starting directory.
    """
    if bwrap_path() is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed; install Debian's `bubblewrap` package.")
    network = settings.CC_SANDBOX_NETWORK == "on" if network is None else network
    slirp = shutil.which("slirp4netns", path=PATH) if network else None
    if network and slirp is None:
        raise SandboxUnavailable(
            "CC_SANDBOX_NETWORK=on needs slirp4netns (Debian's `slirp4netns` package) to give the sandbox "
            "outbound network without the host's loopback; install it or set CC_SANDBOX_NETWORK=off."
        )
    uid = sandbox_uid()
    if uid is not None:
        _hand_over(workspace, uid)
        for directory in read_only:
            _searchable_parents(directory)
    fsize = limits.file_size_mb * 1024 * 1024 if file_size_bytes is None else file_size_bytes
    data = _etc_files()
    if network:
        data["resolv.conf"] = f"nameserver {_SLIRP_DNS}\n"
    fds: dict[str, int] = {}
    kept: dict[str, int] = {}
    cgroup = CallCgroup.create(limits.memory_mb * 1024 * 1024, limits.processes)
    try:
        for name, text in data.items():
            fds[name] = _pipe_of(text.encode())
        fds["workspace"] = os.open(workspace, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        options = bwrap_options(
            fds["workspace"],
            cwd=cwd,
            tmp_mb=limits.tmp_mb,
            data_fds={name: fds[name] for name in data},
            more=_server_options(fds, read_only, env or {}),
        )
        if chdir is not None:
            options += ["--chdir", chdir]  # after bwrap_options' own: the last one counts
        if network:
            kept["info"], fds["info"] = os.pipe()
            fds["block"], kept["block"] = os.pipe()
            options += ["--info-fd", str(fds["info"]), "--block-fd", str(fds["block"])]
        # The options go through a pipe so the sandbox's /proc/1/cmdline does not show host paths.
        # Its write end stays open until the process is in the call's cgroup: bwrap reads the
        # options to their end before it clones anything, so every process of the call starts there.
        fds["args"], kept["args"] = os.pipe()
        encoded = b"".join(option.encode() + b"\0" for option in options)
        if len(encoded) > _PIPE_BUFFER:
            fcntl.fcntl(kept["args"], fcntl.F_SETPIPE_SZ, len(encoded))
        os.write(kept["args"], encoded)
        # bwrap itself writes /etc/passwd & co. (a few hundred bytes): a file-size limit below that
        # (a user over the quota) goes on the program alone, at the cost of one more exec.
        inner = fsize < _BWRAP_WRITES
        limited = ["prlimit", f"--fsize={max(fsize, 0)}", "--", *command] if inner else list(command)
        process = subprocess.Popen(  # noqa: S603 - running the caller's program in the sandbox is the point
            [
                *_launcher(limits, uid, _BWRAP_WRITES if inner else fsize, per_call=cgroup is not None),
                bwrap_path() or "bwrap",
                "--args",
                str(fds["args"]),
                "--",
                *limited,
            ],
            env=environment(),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            pass_fds=tuple(fds.values()),
        )
    except BaseException:
        for fd in kept.values():
            os.close(fd)
        if cgroup is not None:
            cgroup.remove()
        raise
    finally:
        for fd in fds.values():
            os.close(fd)
    sandboxed = Sandboxed(process, key, cgroup=cgroup)
    with _running_lock:
        _running.setdefault(key, set()).add(sandboxed)
    try:
        if cgroup is not None:
            try:
                cgroup.add(process.pid)
            except OSError as error:
                # Gone already (a cancel that came first): nothing ran, bwrap was waiting for its options.
                if process.poll() is None and not sandboxed.killed:
                    raise SandboxUnavailable(f"the call could not be put in its cgroup: {error}") from error
        os.close(kept.pop("args"))
        if network:
            sandboxed.network = _connect(slirp or "slirp4netns", kept["info"], uid)
            os.write(kept["block"], b"1")
    except BaseException:
        # Nothing has run yet (bwrap still waits for its options): end it rather than run it unlimited.
        finish(sandboxed)
        raise
    finally:
        for fd in kept.values():
            os.close(fd)
    return sandboxed


def _server_options(fds: dict[str, int], read_only: Sequence[Path], env: Mapping[str, str]) -> list[str]:
    """bwrap options for `start()`'s server parameters; opened directories are added to `fds`.

    Each directory goes in as a descriptor the worker opened, like the workspace (bwrap still
    resolves its path as the sandbox uid: `_searchable_parents`). The `--setenv` pairs travel in
    the options pipe, so no command line shows their values.
    """
    options: list[str] = []
    for number, directory in enumerate(read_only):
        fds[f"ro{number}"] = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        options += ["--ro-bind-fd", str(fds[f"ro{number}"]), str(directory)]
    for name, value in env.items():
        options += ["--setenv", name, value]
    return options


_SLIRP_DNS = "10.0.2.3"
_NS_GET_USERNS = 0xB701  # ioctl(2) on a namespace fd: the user namespace owning it (linux/nsfs.h)


def _connect(slirp: str, info_fd: int, uid: int | None) -> _Network:
    """Give the waiting sandbox outbound network through slirp4netns, the host's loopback refused."""
    buffer = b""
    decoder = json.JSONDecoder()
    deadline = time.monotonic() + 10
    while True:
        ready, _, _ = select.select([info_fd], [], [], max(deadline - time.monotonic(), 0))
        chunk = os.read(info_fd, 4096) if ready else b""
        if not chunk:
            raise SandboxUnavailable("bubblewrap ended before it said which process to connect to the network.")
        buffer += chunk
        try:
            child_pid = decoder.raw_decode(buffer.decode())[0]["child-pid"]
            break
        except ValueError:
            continue
    # slirp4netns must join the user namespace that owns the network namespace; bwrap may already
    # have moved the child into a nested one, so ask the kernel for the owner instead of guessing.
    netns = os.open(f"/proc/{child_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        owner = fcntl.ioctl(netns, _NS_GET_USERNS)
    finally:
        os.close(netns)
    ready_read, ready_write = os.pipe()
    exit_read, exit_write = os.pipe()
    try:
        process = subprocess.Popen(  # noqa: S603 - a fixed argv
            [
                *_as_sandbox_user(uid),
                slirp,
                "--configure",
                "--mtu=65520",
                "--disable-host-loopback",
                # The network namespace belongs to the sandbox's user namespace: join that first.
                f"--userns-path=/proc/self/fd/{owner}",
                "--ready-fd",
                str(ready_write),
                "--exit-fd",
                str(exit_read),
                str(child_pid),
                "tap0",
            ],
            env=environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=(ready_write, exit_read, owner),
        )
    finally:
        os.close(ready_write)
        os.close(exit_read)
        os.close(owner)
    network = _Network(process, exit_write)
    ready, _, _ = select.select([ready_read], [], [], 10)
    ok = bool(ready) and os.read(ready_read, 1) == b"1"
    os.close(ready_read)
    if not ok:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        problem = process.stderr.read().decode(errors="replace").strip() if process.stderr else ""
        network.close()
        raise SandboxUnavailable(f"slirp4netns could not give the sandbox its network: {problem or 'no answer'}")
    return network


@dataclass(eq=False)
class _Network:
    process: subprocess.Popen[bytes]
    exit_fd: int

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.exit_fd)
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()
        if self.process.stderr:
            self.process.stderr.close()


def finish(sandboxed: Sandboxed) -> None:
    """Make sure nothing of the sandbox is left and forget it."""
    if sandboxed.process.poll() is None:
        sandboxed.kill()
        sandboxed.process.wait()
    if sandboxed.cgroup is not None:
        sandboxed.cgroup.remove()  # also whatever left the PID namespace's reach, if anything could
    if sandboxed.network is not None:
        sandboxed.network.close()
        sandboxed.network = None
    with _running_lock:
        same = _running.get(sandboxed.key)
        if same is not None:
            same.discard(sandboxed)
            if not same:
                del _running[sandboxed.key]


class _CappedReader(threading.Thread):
    def __init__(self, stream: IO[bytes] | Any, cap: int) -> None:
        super().__init__(daemon=True)
        self.stream, self.cap = stream, cap
        self.kept = bytearray()
        self.total = 0

    def run(self) -> None:
        # A pipe of Popen is a BufferedReader; the stubs' IO[bytes] has no read1.
        while chunk := self.stream.read1(_READ_CHUNK):  # type: ignore[union-attr]
            self.total += len(chunk)
            room = self.cap - len(self.kept)
            if room > 0:
                self.kept.extend(chunk[:room])

    def text(self) -> str:
        # Bytes that are not UTF-8 stay as lone surrogates: offloaded, the output is kept as its
        # exact bytes (a binary entry); inline, each is shown as `\xNN` (engine.actions.storable).
        # A stream cut at the cap may end inside a character: that partial character is left out
        # (the incremental decoder holds it back), not taken for bytes that are not UTF-8.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        return decoder.decode(bytes(self.kept), final=self.total == len(self.kept))


@dataclass
class Result:
    exit_code: int
    stdout: _CappedReader
    stderr: _CappedReader
    duration_ms: int
    timed_out: bool = False
    killed: bool = False
    signal: int | None = None
    stopped_by: str | None = None
    # The per-call limit (cgroups) the call ran into and was killed for: "processes", "memory", "cpu".
    limit: str | None = None


def run(
    workspace: Path,
    command: Sequence[str],
    *,
    limits: Limits,
    output_cap: int,
    cwd: str = ".",
    key: Any = None,
    file_size_bytes: int | None = None,
    watchdog: Any = None,
) -> Result:
    """Run `command` to its end, its timeout or a kill; stdout/stderr kept up to `output_cap` each.

    With a cgroup, the call is killed as soon as it hits its process limit, its memory limit (an
    OOM kill of any of its processes) or its CPU-time budget summed over its processes; `limit`
    names which. `watchdog`, if given, is called while the command runs, as often as every
    `POLL_SECONDS` but at most a tenth of the time (it may be slow); a string it returns kills the
    sandbox and becomes `stopped_by` (the disk quota uses it).
    """
    started = time.monotonic()
    sandboxed = start(workspace, command, limits=limits, cwd=cwd, key=key, file_size_bytes=file_size_bytes)
    process = sandboxed.process
    readers = [_CappedReader(process.stdout, output_cap), _CappedReader(process.stderr, output_cap)]
    for reader in readers:
        reader.start()
    timed_out, stopped_by, limit = False, None, None
    deadline = started + limits.wall_seconds
    next_watch = started + POLL_SECONDS
    # A pidfd wakes the wait the moment bwrap exits; Popen.wait(timeout) polls with sleeps of up
    # to 50 ms, which was most of a short call's cost.
    pidfd: int | None = None
    waiter = select.poll()
    try:
        # Gone already when a cancel from another thread killed it before this point and it was
        # reaped: then poll() below ends the wait at once, and finish() still removes its cgroup.
        with contextlib.suppress(ProcessLookupError):
            pidfd = os.pidfd_open(process.pid)
            waiter.register(pidfd, select.POLLIN)
        while process.poll() is None:
            if waiter.poll(min(int(POLL_SECONDS * 1000), max(int((deadline - time.monotonic()) * 1000), 1))):
                continue
            now = time.monotonic()
            timed_out = now >= deadline
            limit = None if timed_out else sandboxed.limit_hit(limits)
            if not (timed_out or limit) and watchdog is not None and now >= next_watch:
                stopped_by = watchdog()
                next_watch = now + max(POLL_SECONDS, 10 * (time.monotonic() - now))
            if timed_out or limit or stopped_by:
                sandboxed.kill()
                process.wait()
        if not (timed_out or limit or stopped_by or sandboxed.killed):
            # A limit can end the call on its own: an OOM kill of the program, a fork that failed.
            # (A CPU total just past the budget at a natural end is not one: the call finished.)
            limit = sandboxed.limit_hit(limits)
            limit = None if limit == "cpu" else limit
    finally:
        if pidfd is not None:
            os.close(pidfd)
        finish(sandboxed)
        for reader in readers:
            reader.join(timeout=2)
    exit_code = process.returncode
    return Result(
        exit_code=exit_code,
        stdout=readers[0],
        stderr=readers[1],
        duration_ms=int((time.monotonic() - started) * 1000),
        timed_out=timed_out,
        killed=sandboxed.killed and not timed_out and stopped_by is None and limit is None,
        signal=_program_signal(exit_code),
        stopped_by=stopped_by,
        limit=limit,
    )


def _program_signal(code: int) -> int | None:
    # bwrap exits with the program's status: a program killed by signal N shows as 128+N, and
    # bwrap itself killed (timeout, cancel) as -N.
    if code < 0:
        return -code
    if code > 128 and code - 128 < 65:
        return code - 128
    return None
