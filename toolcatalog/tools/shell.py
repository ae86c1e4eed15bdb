"""bash: run a command in the workspace with a timeout and an output cap (RN-5).

The command runs in its own process group so a timeout kills everything it started,
with a scrubbed environment (no secrets of the server leak into a model's shell),
and stdout/stderr are read concurrently and kept up to a cap; what is cut is counted
and said, never silently dropped. Large kept output goes to the scratchpad (SP-1).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import IO, Any

from django.conf import settings

from toolcatalog.tools import procgroup
from toolcatalog.tools.base import Observation, ToolContext, ToolFailure, builtin

DEFAULT_TIMEOUT_SECONDS = 120
_READ_CHUNK = 65536
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class _CappedReader(threading.Thread):
    def __init__(self, stream: IO[bytes] | Any, cap: int) -> None:
        super().__init__(daemon=True)
        self.stream, self.cap = stream, cap
        self.kept = bytearray()
        self.total = 0

    def run(self) -> None:
        while chunk := self.stream.read1(_READ_CHUNK):
            self.total += len(chunk)
            room = self.cap - len(self.kept)
            if room > 0:
                self.kept.extend(chunk[:room])

    def text(self) -> str:
        return self.kept.decode("utf-8", errors="replace")


def shell_environment(context: ToolContext) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", _DEFAULT_PATH),
        "HOME": str(context.root),
        "PWD": str(context.root),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
    }


def bash(arguments: dict[str, Any], context: ToolContext) -> Observation:
    command = arguments["command"]
    if not command.strip():
        raise ToolFailure("command is empty.")
    timeout = min(arguments.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS), settings.CC_BASH_MAX_TIMEOUT_SECONDS)
    cwd = context.path(arguments.get("cwd", "."), what="cwd")
    if not cwd.is_dir():
        raise ToolFailure(f"cwd {arguments.get('cwd')!r} is not a directory in the workspace.")
    cap = settings.CC_BASH_OUTPUT_CAP_BYTES
    started = time.monotonic()
    process = subprocess.Popen(  # noqa: S603 - running the model's command is this tool's purpose
        ["bash", "-c", command],
        cwd=cwd,
        env=shell_environment(context),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    readers = [_CappedReader(process.stdout, cap), _CappedReader(process.stderr, cap)]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        # Killed at once on cancel, and with the worker if it dies (OP-3, OP-4).
        with procgroup.tracked(process, key=context.conversation_id):
            exit_code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process)
        exit_code = process.wait()
    finally:
        # A background child that kept the pipes open is killed with the group.
        for reader in readers:
            reader.join(timeout=2)
        if any(reader.is_alive() for reader in readers):
            _kill_group(process)
            for reader in readers:
                reader.join(timeout=2)
    stdout, stderr = readers
    observation: Observation = {
        "ok": exit_code == 0 and not timed_out,
        "exit_code": exit_code,
        "stdout": stdout.text(),
        "stderr": stderr.text(),
        "duration_ms": int((time.monotonic() - started) * 1000),
        "cwd": context.relative(cwd),
    }
    for name, reader in (("stdout", stdout), ("stderr", stderr)):
        if reader.total > len(reader.kept):
            observation[f"{name}_bytes_omitted"] = reader.total - len(reader.kept)
            observation["_note"] = (
                f"Output above {cap} bytes per stream was cut; the counts of omitted bytes are given. "
                "Redirect to a file in the workspace and read it in pages to see all of it."
            )
    if procgroup.was_cancelled(process):
        observation["cancelled"] = True
        observation["error"] = "The run was cancelled; the command was killed. Its output so far is above."
    elif timed_out:
        observation["timed_out"] = True
        observation["error"] = f"The command did not finish within {timeout} s and was killed."
    elif exit_code != 0:
        observation["error"] = f"The command exited with code {exit_code}."
    return observation


def _kill_group(process: subprocess.Popen) -> None:
    procgroup.kill_group(process.pid)


TOOLS = [builtin("bash", bash)]
