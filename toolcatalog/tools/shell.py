"""bash: run a command in the workspace's OS sandbox, with limits and an output cap (RN-5, SB-1..3).

The command runs under bubblewrap (toolcatalog/sandbox.py): the workspace at /workspace, the
system read-only, no network by default, an allow-listed environment, per-call CPU, memory,
process, file-size and wall-clock limits, and nothing left running when the call ends.
stdout/stderr are kept up to a cap; what is cut is counted and said, never silently dropped.
Large kept output goes to the scratchpad (SP-1).
"""

from __future__ import annotations

import signal
import stat
from typing import Any

from django.conf import settings

from toolcatalog import quota, sandbox
from toolcatalog.tools.base import Observation, ToolContext, ToolFailure, builtin

DEFAULT_TIMEOUT_SECONDS = 120
# A per-call limit (the call's cgroup) the call was killed for, and what to tell the model about it.
_LIMITS = {
    "processes": "it hit the process limit of {processes} (CC_SANDBOX_PROCESSES), counted over all its processes "
    "and threads",
    "memory": "it hit the memory limit of {memory} MB (CC_SANDBOX_MEMORY_MB), counted over all its processes",
    "cpu": "it used more than its CPU-time limit of {cpu} s (CC_SANDBOX_CPU_SECONDS), summed over all its processes",
}
# What a per-process limit (rlimit) looks like from outside, and what to tell the model about it.
_SIGNALS = {
    signal.SIGXCPU: "it used more than its CPU-time limit of {cpu} s (CC_SANDBOX_CPU_SECONDS)",
    signal.SIGXFSZ: "it wrote a file past the file-size limit ({fsize} bytes)",
}
# Linux's MAX_ARG_STRLEN: the most bytes one argument of a program may have, its NUL included.
MAX_ARGUMENT_BYTES = 131_072
# bash's own words for a limit it hit; a command that shrugged them off still failed at something.
_BASH_LIMIT_WORDS = ("fork: retry", "fork: Resource temporarily unavailable", "File size limit exceeded")
_STDERR_HINTS = {
    "bwrap: ": "the sandbox itself could not start on this host; an operator must see docs/security.md",
    "fork: retry": "it hit the process limit of {processes} (CC_SANDBOX_PROCESSES)",
    "Resource temporarily unavailable": "it hit the process limit of {processes} (CC_SANDBOX_PROCESSES)",
    "MemoryError": "it hit the memory limit of {memory} MB (CC_SANDBOX_MEMORY_MB)",
    "Cannot allocate memory": "it hit the memory limit of {memory} MB (CC_SANDBOX_MEMORY_MB)",
    "memory exhausted": "it hit the memory limit of {memory} MB (CC_SANDBOX_MEMORY_MB)",
    "File size limit exceeded": "it wrote a file past the file-size limit ({fsize} bytes)",
    "No space left on device": "it filled the sandbox's /tmp ({tmp} MB, CC_SANDBOX_TMP_MB)",
}


def bash(arguments: dict[str, Any], context: ToolContext) -> Observation:
    command = arguments["command"]
    if not command.strip():
        raise ToolFailure("command is empty.")
    if "\x00" in command:
        raise ToolFailure("command contains a NUL byte.")
    if len(command.encode()) >= MAX_ARGUMENT_BYTES:
        # Linux refuses one argument of 128 KiB or more (MAX_ARG_STRLEN); a {{stepN.text}} reference
        # to a large result made one, and the start failed with "Argument list too long".
        raise ToolFailure(
            f"command is {len(command.encode()):,} bytes; a command line takes at most {MAX_ARGUMENT_BYTES - 1:,}. "
            "Write large values to a file (write_file accepts {{stepN.text}} references) and read the file "
            "in the command."
        )
    timeout = min(arguments.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS), settings.CC_BASH_MAX_TIMEOUT_SECONDS)
    with context.located(arguments.get("cwd", "."), what="cwd") as cwd:
        found = cwd.lstat()
        if found is None or not stat.S_ISDIR(found.st_mode):
            raise ToolFailure(f"cwd {arguments.get('cwd')!r} is not a directory in the workspace.")
        working_directory = cwd.relative
    if sandbox.bwrap_path() is None:
        raise ToolFailure(
            "The sandbox is not available: bubblewrap (bwrap) is not installed on the worker, and no "
            "command runs outside it. An operator must install Debian's `bubblewrap` package."
        )
    limits = sandbox.Limits.from_settings(wall_seconds=timeout)
    others = quota.others_bytes(context)
    before = quota.Before.take(context.root)
    used_before = others + before.usage
    # Past the quota a command still runs (to delete files) but cannot grow any file.
    fsize = max(0, min(limits.file_size_mb * 1024 * 1024, quota.quota_bytes() - used_before))
    quota_bound = fsize < limits.file_size_mb * 1024 * 1024

    def over_quota() -> str | None:
        used = others + quota.tree_bytes(context.root)
        if used > quota.quota_bytes() and used > used_before:
            return f"{quota.describe(used)} and it was killed"
        return None

    cap = settings.CC_BASH_OUTPUT_CAP_BYTES
    result = sandbox.run(
        context.root,
        ["bash", "-c", command],
        limits=limits,
        output_cap=cap,
        cwd=working_directory,
        key=context.sandbox_key,
        file_size_bytes=fsize,
        watchdog=over_quota,
    )
    if result.stopped_by is None and (late := over_quota()):
        result.stopped_by = late
    undone: list[str] = []
    if result.stopped_by is not None or (quota_bound and _cut_by_file_size(result)):
        # Nothing of the call past the quota stays (docs/security.md, The disk quota).
        excess = others + quota.tree_bytes(context.root) - max(quota.quota_bytes(), used_before)
        # A file cut short at 0 bytes (no quota left) holds nothing to undo.
        undone = quota.undo_growth(context.root, before, excess=excess, cut_at=fsize if quota_bound and fsize else None)
    observation: Observation = {
        "ok": result.exit_code == 0 and not result.timed_out and result.stopped_by is None,
        "exit_code": result.exit_code,
        "stdout": result.stdout.text(),
        "stderr": result.stderr.text(),
        "duration_ms": result.duration_ms,
        "cwd": working_directory,
    }
    for name, reader in (("stdout", result.stdout), ("stderr", result.stderr)):
        if reader.total > len(reader.kept):
            observation[f"{name}_bytes_omitted"] = reader.total - len(reader.kept)
            observation["_note"] = (
                f"Output above {cap} bytes per stream was cut; the counts of omitted bytes are given. "
                "Redirect to a file in the workspace and read it in pages to see all of it."
            )
    if result.timed_out:
        observation["timed_out"] = True
        observation["error"] = (
            f"The command did not finish within {timeout} s and was killed, with every process it started"
            f"{_limit_hit(result, limits, fsize)}."
        )
    elif result.killed:
        observation["ok"] = False  # whatever status was left to read (none, if it was reaped elsewhere)
        observation["cancelled"] = True  # the partial output above is what it wrote until then (OP-3)
        observation["error"] = "The command was cancelled and killed, with every process it started."
    elif result.stopped_by is not None:
        observation["error"] = f"The command went past the disk quota: {result.stopped_by}."
    elif result.limit is not None:
        observation["ok"] = False
        observation["error"] = (
            f"The command was killed, with every process it started{_limit_hit(result, limits, fsize)}."
        )
    elif result.exit_code != 0 or any(words in observation["stderr"] for words in _BASH_LIMIT_WORDS):
        observation["ok"] = False
        observation["error"] = f"The command exited with code {result.exit_code}{_limit_hit(result, limits, fsize)}."
    if undone:
        observation["ok"] = False
        observation["quota_undone"] = undone
        observation["error"] = (
            observation.get("error", "The command reached your disk quota (CC_WORKSPACE_QUOTA_MB).")
            + f" What it wrote past the quota was undone ({_listing(undone)}). "
            + f"{quota.describe(others + quota.tree_bytes(context.root))}."
        )
    return observation


def _cut_by_file_size(result: sandbox.Result) -> bool:
    """The program met the file-size limit: SIGXFSZ, or EFBIG where it ignores the signal (Python does)."""
    stderr = result.stderr.text()
    return result.signal == signal.SIGXFSZ or "File size limit exceeded" in stderr or "File too large" in stderr


def _listing(undone: list[str]) -> str:
    shown = "; ".join(undone[:10])
    return shown if len(undone) <= 10 else f"{shown}; and {len(undone) - 10} more"


def _limit_hit(result: sandbox.Result, limits: sandbox.Limits, fsize: int) -> str:
    values = {
        "cpu": limits.cpu_seconds,
        "memory": limits.memory_mb,
        "processes": limits.processes,
        "fsize": fsize,
        "tmp": limits.tmp_mb,
    }
    if result.limit is not None:
        return "; " + _LIMITS[result.limit].format(**values)
    quota_bound = fsize < limits.file_size_mb * 1024 * 1024
    if quota_bound and _cut_by_file_size(result):
        return "; it reached your disk quota (CC_WORKSPACE_QUOTA_MB) and could not grow a file; delete files"
    if result.signal in _SIGNALS:
        return "; " + _SIGNALS[signal.Signals(result.signal)].format(**values)
    stderr = result.stderr.text()
    for needle, hint in _STDERR_HINTS.items():
        if needle in stderr:
            return "; " + hint.format(**values)
    return ""


TOOLS = [builtin("bash", bash)]
