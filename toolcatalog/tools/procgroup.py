"""Tool process groups: killed at once on cancel (OP-3) and with their worker (OP-4).

A tool that starts processes starts each in its own session (`start_new_session=True`, so
its process group id is its pid) and holds it in `tracked()` while it runs:

    process = subprocess.Popen([...], start_new_session=True)
    with tracked(process, key=context.conversation_id):
        process.wait()
    if was_cancelled(process): ...

- Cancel: `kill_groups(key)` SIGKILLs every group tracked under the key (a conversation has
  one active run; its subagents share the key), so a sleeping command ends within the
  canceller's poll, not when it is done.
- Worker death: each process that tracks a group starts one watchdog (a few lines of Python
  in its own session) holding a pipe from it. However the worker ends, SIGKILL included, the
  kernel closes the pipe; the watchdog reads EOF and kills the groups still registered, so
  no orphan keeps writing to the workspace.

Independent of how the command is wrapped (bash, a sandbox launcher): only the group counts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import IO

_WATCHDOG = """
import os, signal, sys
groups = set()
for line in sys.stdin:
    sign, pgid = line[0], int(line[1:])
    (groups.add if sign == "+" else groups.discard)(pgid)
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""

_lock = threading.Lock()
_groups: dict[object, set[int]] = {}
_cancelled: set[int] = set()
_watchdog: tuple[int, IO[str]] | None = None  # (the pid of the process that started it, its stdin)


def _tell_watchdog(line: str) -> None:
    global _watchdog
    if _watchdog is None or _watchdog[0] != os.getpid():  # none yet, or inherited across a fork
        process = subprocess.Popen(  # noqa: S603 - our own fixed script
            [sys.executable, "-I", "-c", _WATCHDOG],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # a signal to the worker's group must not take the watchdog with it
        )
        _watchdog = (os.getpid(), process.stdin)
    with contextlib.suppress(OSError, ValueError):
        _watchdog[1].write(line + "\n")
        _watchdog[1].flush()


@contextlib.contextmanager
def tracked(process: subprocess.Popen, *, key: object) -> Iterator[None]:
    """Register `process`'s group (its pid, started with start_new_session) under `key` while it runs."""
    pgid = process.pid
    with _lock:
        _groups.setdefault(key, set()).add(pgid)
        _tell_watchdog(f"+{pgid}")
    try:
        yield
    finally:
        with _lock:
            _groups.get(key, set()).discard(pgid)
            _tell_watchdog(f"-{pgid}")


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def kill_groups(key: object) -> int:
    """SIGKILL every group tracked under `key`; their tools then report `was_cancelled`."""
    with _lock:
        pgids = list(_groups.get(key, ()))
        _cancelled.update(pgids)
    for pgid in pgids:
        kill_group(pgid)
    return len(pgids)


def was_cancelled(process: subprocess.Popen) -> bool:
    """True once for a process whose group `kill_groups` killed."""
    with _lock:
        if process.pid in _cancelled:
            _cancelled.discard(process.pid)
            return True
    return False
