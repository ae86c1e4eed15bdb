"""One cgroup per sandboxed call (SB-3): limits over the whole call, and a kill that misses nothing.

Each call gets a cgroup of its own below the worker's own cgroup, so limits the operator put on
the worker still hold for its sandboxes. In it: `pids.max` (every process and thread of the
call), a memory limit over all its processes (swap included where there is swap), and the
call's CPU time, which `toolcatalog.sandbox.run` reads while the call runs and kills it past
its budget (no kernel limit caps CPU *time*). Killing the call kills the cgroup: `cgroup.kill`
on v2, freeze then SIGKILL then thaw on v1; either way a process that is forking or that
double-forked and left its session cannot slip out.

Each part comes from cgroup v2 where the worker's v2 cgroup offers it, else from v1 (a hybrid
host has v2 for the kill and the CPU time and v1 for the controllers). With no writable cgroup
(`CC_SANDBOX_CGROUP=off`, a container with a read-only /sys/fs/cgroup) `layout()` is None and
the sandbox falls back to per-process rlimits; `describe()` says which applies (log, /healthz).

On v2 a cgroup with processes in it cannot enable controllers for its children (the "no internal
processes" rule), so, as systemd asks of a delegated service, the worker's processes are first
moved into a leaf `cc-worker` next to the calls' cgroups.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

logger = logging.getLogger(__name__)

LEAF = "cc-worker"
PREFIX = "cc-sandbox-"
_V2_WANTED = frozenset({"pids", "memory"})
_names = itertools.count()
_lock = threading.Lock()
_layout: Layout | None = None
_detected = False
# Cgroups whose processes had not all gone when their call ended: removed by a later call.
_leftovers: list[CallCgroup] = []


@dataclass(frozen=True)
class Layout:
    """Where the calls' cgroups go: a v2 parent (kill and CPU time at least) and v1 parents for the rest."""

    v2: Path | None
    v2_controllers: frozenset[str]
    v1: dict[str, Path] = field(default_factory=dict)

    def parents(self) -> list[Path]:
        return ([self.v2] if self.v2 is not None else []) + list(self.v1.values())

    def describe(self, *, paths: bool = True) -> str:
        """E.g. "per call, in a cgroup of its own (CPU time, kill from cgroup v2; processes, memory from
        cgroup v1)", with the parent directories when `paths` (the log; /healthz leaves them out)."""
        parts = {
            "processes": "v2" if "pids" in self.v2_controllers else "v1",
            "memory": "v2" if "memory" in self.v2_controllers else "v1",
            "CPU time": "v2" if self.v2 is not None else "v1",
            "kill": "v2" if self.v2 is not None else "v1",
        }
        where = {"v2": str(self.v2), "v1": ", ".join(str(path) for path in self.v1.values())}
        sources = []
        for version in ("v2", "v1"):
            names = ", ".join(name for name, used in parts.items() if used == version)
            if names:
                sources.append(f"{names} from cgroup {version}" + (f" under {where[version]}" if paths else ""))
        return "per call, in a cgroup of its own (" + "; ".join(sources) + ")"


RLIMITS = (
    "per process, with rlimits (no writable cgroup: RLIMIT_CPU and RLIMIT_AS per process, RLIMIT_NPROC "
    "per host uid; see docs/security.md)"
)


def describe(*, paths: bool = True) -> str:
    """Which limits the sandbox applies in this process, as one sentence (log, /healthz, bench)."""
    found = layout()
    return found.describe(paths=paths) if found is not None else RLIMITS


def layout() -> Layout | None:
    """This process's cgroup layout, found once; None: no writable cgroup, so rlimits apply."""
    global _layout, _detected
    with _lock:
        if not _detected:
            _layout = _detect() if settings.CC_SANDBOX_CGROUP == "auto" else None
            _detected = True
            if _layout is not None:
                logger.info("tool sandbox limits: %s", _layout.describe())
            else:
                logger.warning("tool sandbox limits: %s", RLIMITS)
        return _layout


def reset() -> None:
    """Forget the layout found (a test that changes CC_SANDBOX_CGROUP)."""
    global _layout, _detected
    with _lock:
        _layout, _detected = None, False


def _read(path: Path) -> str:
    return path.read_text()


def _write(path: Path, value: str) -> None:
    # One write(2) per value: a cgroup file takes each write as one command.
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _mounts() -> list[tuple[Path, str, str, set[str]]]:
    """(mount point, root inside the hierarchy, fstype, super options) of every cgroup mount."""
    found = []
    for line in _read(Path("/proc/self/mountinfo")).splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            found.append((Path(fields[4]), fields[3], tail[0], set(tail[2].split(","))))
    return found


def _own() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and "" -> its v2 path."""
    own = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def _directory(mount: Path, root: str, path: str) -> Path | None:
    if root != "/":
        if path != root and not path.startswith(root.rstrip("/") + "/"):
            return None  # the cgroup is outside what this mount shows
        path = path[len(root) :] or "/"
    return mount / path.lstrip("/")


def _usable(parent: Path, needs: str) -> bool:
    """A child can be made, filled with processes and removed here (the probe leaves nothing)."""
    probe = parent / f"{PREFIX}probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        return os.access(probe / "cgroup.procs", os.W_OK) and (probe / needs).exists()
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def _detect() -> Layout | None:
    try:
        mounts, own = _mounts(), _own()
    except OSError:
        return None
    v2, v2_controllers = None, frozenset[str]()
    for mount, root, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in own and (directory := _directory(mount, root, own[""])) is not None:
            parent = directory.parent if directory.name == LEAF else directory
            if _usable(parent, "cgroup.kill") and (parent / "cpu.stat").exists():
                v2, v2_controllers = parent, _enable(parent)
            break
    v1: dict[str, Path] = {}
    needed = [name for name, wanted in (("pids", "pids"), ("memory", "memory")) if wanted not in v2_controllers]
    if v2 is None:
        needed += ["cpuacct", "freezer"]
    for controller in needed:
        for mount, root, fstype, options in mounts:
            if fstype == "cgroup" and controller in options and controller in own:
                directory = _directory(mount, root, own[controller])
                if directory is not None and _usable(directory, "cgroup.procs"):
                    v1[controller] = directory
                break
        if controller not in v1:
            return None
    found = Layout(v2, v2_controllers, v1)
    for parent in found.parents():
        _remove_stale(parent)
    return found


def _enable(parent: Path) -> frozenset[str]:
    """Enable pids and memory for the children of the v2 `parent`, moving its processes into a leaf if it must."""
    try:
        available = set(_read(parent / "cgroup.controllers").split()) & _V2_WANTED
        enabled = set(_read(parent / "cgroup.subtree_control").split()) & _V2_WANTED
    except OSError:
        return frozenset()
    for _ in range(3):
        missing = available - enabled
        if not missing:
            break
        try:
            _write(parent / "cgroup.subtree_control", " ".join(f"+{name}" for name in sorted(missing)))
            enabled |= missing
        except OSError as error:
            if error.errno != errno.EBUSY:
                logger.warning("tool sandbox: cannot enable %s in %s: %s", missing, parent, error)
                break
            _evacuate(parent)
    return frozenset(enabled)


def _evacuate(parent: Path) -> None:
    leaf = parent / LEAF
    leaf.mkdir(exist_ok=True)
    moved = 0
    for pid in _read(parent / "cgroup.procs").split():
        with contextlib.suppress(ProcessLookupError, OSError):
            _write(leaf / "cgroup.procs", pid)
            moved += 1
    logger.info("tool sandbox: moved %d processes of %s into %s so its children can have limits", moved, parent, leaf)


def _remove_stale(parent: Path) -> None:
    """Remove calls' cgroups left by a worker that died (its pid is in their name)."""
    with contextlib.suppress(OSError):
        for child in parent.iterdir():
            if not child.name.startswith(PREFIX) or not child.is_dir():
                continue
            owner = child.name[len(PREFIX) :].split("-", 1)[0]
            if owner.isdigit() and not _alive(int(owner)):
                with contextlib.suppress(OSError):
                    _kill_v1_or_v2(child)
                    _wait_empty([child], 1.0)
                    child.rmdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_v1_or_v2(directory: Path) -> None:
    if (directory / "cgroup.kill").exists():
        _write(directory / "cgroup.kill", "1")
    else:
        for pid in _read(directory / "cgroup.procs").split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def _wait_empty(directories: list[Path], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if not any(_read(directory / "cgroup.procs").strip() for directory in directories):
                return True
        except FileNotFoundError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def _counter(path: Path, key: str) -> int:
    """The value of `key` in a flat-keyed cgroup file (pids.events, memory.events, cpu.stat), 0 if absent."""
    with contextlib.suppress(OSError):
        for line in _read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


class CallCgroup:
    """The cgroup(s) of one call: one directory per hierarchy used, all of the same name."""

    def __init__(self, found: Layout, name: str) -> None:
        self.layout = found
        self.v2 = found.v2 / name if found.v2 is not None else None
        self.v1 = {controller: parent / name for controller, parent in found.v1.items()}
        self.directories = ([self.v2] if self.v2 is not None else []) + list(self.v1.values())

    @classmethod
    def create(cls, memory_bytes: int, processes: int) -> CallCgroup | None:
        """A new cgroup with the call's limits, or None when cgroups are not used here (or failed: logged)."""
        found = layout()
        if found is None:
            return None
        _retry_leftovers()
        cgroup = cls(found, f"{PREFIX}{os.getpid()}-{next(_names)}")
        try:
            for directory in cgroup.directories:
                directory.mkdir()
            cgroup._set_limits(memory_bytes, processes)
        except OSError:
            logger.warning("tool sandbox: could not set up the call's cgroup; rlimits apply to it", exc_info=True)
            cgroup.remove()
            return None
        return cgroup

    def _pids(self) -> Path:
        if "pids" in self.layout.v2_controllers and self.v2 is not None:
            return self.v2
        return self.v1["pids"]

    def _set_limits(self, memory_bytes: int, processes: int) -> None:
        _write(self._pids() / "pids.max", str(processes))
        if "memory" in self.layout.v2_controllers:
            assert self.v2 is not None
            _write(self.v2 / "memory.max", str(memory_bytes))
            if (self.v2 / "memory.swap.max").exists():
                _write(self.v2 / "memory.swap.max", "0")  # the budget is RAM and swap together
            _write(self.v2 / "memory.oom.group", "1")  # an OOM kill takes the whole call at once
        else:
            memory = self.v1["memory"]
            _write(memory / "memory.limit_in_bytes", str(memory_bytes))
            if (memory / "memory.memsw.limit_in_bytes").exists():
                _write(memory / "memory.memsw.limit_in_bytes", str(memory_bytes))

    def add(self, pid: int) -> None:
        """Put `pid` (and so everything it will start) in the call's cgroup."""
        for directory in self.directories:
            _write(directory / "cgroup.procs", str(pid))

    def cpu_seconds(self) -> float:
        if self.v2 is not None:
            return _counter(self.v2 / "cpu.stat", "usage_usec") / 1e6
        with contextlib.suppress(OSError, ValueError):
            return int(_read(self.v1["cpuacct"] / "cpuacct.usage")) / 1e9
        return 0.0

    def limit_hit(self, cpu_seconds: float) -> str | None:
        """ "processes", "memory" or "cpu" when the call ran into that limit, else None."""
        if _counter(self._pids() / "pids.events", "max"):
            return "processes"
        if "memory" in self.layout.v2_controllers:
            assert self.v2 is not None
            if _counter(self.v2 / "memory.events", "oom_kill") or _counter(self.v2 / "memory.events", "oom_group_kill"):
                return "memory"
        elif _counter(self.v1["memory"] / "memory.oom_control", "oom_kill"):
            return "memory"
        if self.cpu_seconds() > cpu_seconds:
            return "cpu"
        return None

    def kill(self) -> None:
        """SIGKILL every process of the call, one forking this instant included."""
        if self.v2 is not None:
            with contextlib.suppress(OSError):
                _write(self.v2 / "cgroup.kill", "1")
            return
        freezer = self.v1["freezer"]
        with contextlib.suppress(OSError):
            # Frozen, nothing can fork between reading the list and the kill; the kill lands on thaw.
            _write(freezer / "freezer.state", "FROZEN")
            deadline = time.monotonic() + 1
            while _read(freezer / "freezer.state").strip() != "FROZEN" and time.monotonic() < deadline:
                time.sleep(0.002)
            for pid in _read(freezer / "cgroup.procs").split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            _write(freezer / "freezer.state", "THAWED")

    def remove(self, timeout: float = 2.0) -> bool:
        """Kill what is left and remove the cgroup; kept for a later call if it does not empty in time."""
        self.kill()
        existing = [directory for directory in self.directories if directory.exists()]
        if not _wait_empty(existing, timeout):
            self.kill()
            with _lock:
                _leftovers.append(self)
            return False
        for directory in existing:
            with contextlib.suppress(FileNotFoundError):
                directory.rmdir()
        return True


def _retry_leftovers() -> None:
    with _lock:
        pending = list(_leftovers)
        _leftovers.clear()
    for cgroup in pending:
        cgroup.remove(timeout=0)
