"""Finding things in the workspace: search_files (regex over contents) and glob (names)."""

from __future__ import annotations

import fnmatch
import os
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings

from engine.patterns import PatternError, compile_pattern
from toolcatalog.tools.base import Observation, ToolContext, ToolFailure, builtin
from toolcatalog.tools.files import SKIPPED_DIRS, is_binary

MAX_MATCH_LINES = 500
MAX_GLOB_RESULTS = 1000
MAX_SEARCHED_FILE_BYTES = 20 * 1024 * 1024


def walk_files(context: ToolContext, start: Path) -> Iterator[Path]:
    """Regular files under `start`, never following symlinks, skipping build and VCS folders."""
    if start.is_file():
        yield start
        return
    for directory, dirnames, filenames in os.walk(start, followlinks=False):
        dirnames[:] = sorted(name for name in dirnames if name not in SKIPPED_DIRS)
        for name in sorted(filenames):
            path = Path(directory) / name
            if not path.is_symlink() and path.is_file():
                yield path


def _included(context: ToolContext, path: Path, include: str | None) -> bool:
    if not include:
        return True
    target = context.relative(path) if "/" in include else path.name
    return fnmatch.fnmatch(target, include)


def search_files(arguments: dict[str, Any], context: ToolContext) -> Observation:
    # The `regex` engine, like the scratchpad's grep: a time budget for the whole call and the GIL
    # released while matching, so a catastrophic pattern such as `(a+)+$` cannot hold the process
    # that runs it (the web process, for /mcp calls) (SB-4).
    try:
        pattern = compile_pattern(arguments["pattern"])
    except PatternError as exc:
        raise ToolFailure(f"pattern is not a valid regular expression: {exc}") from exc
    budget = settings.CC_REGEX_TIMEOUT_SECONDS
    deadline = time.monotonic() + budget
    relative = arguments.get("path", ".")
    start = context.path(relative)
    if not start.exists():
        raise ToolFailure(f"{relative!r} does not exist in the workspace.")
    include = arguments.get("include")
    around = arguments.get("context_lines", 0)
    output = arguments.get("output", "lines")
    matches: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    total = 0
    skipped_large: list[str] = []
    for path in walk_files(context, start):
        if not _included(context, path, include):
            continue
        if path.stat().st_size > MAX_SEARCHED_FILE_BYTES:
            skipped_large.append(context.relative(path))
            continue
        if is_binary(path):
            continue
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        name = context.relative(path)
        for index, line in enumerate(lines):
            try:
                found = pattern.search(line, timeout=max(deadline - time.monotonic(), 0.001), concurrent=True)
            except TimeoutError as exc:
                raise ToolFailure(
                    f"The pattern took more than {budget} s (CC_REGEX_TIMEOUT_SECONDS) and was stopped at "
                    f"{name}:{index + 1}; it probably backtracks catastrophically (alternatives that overlap under a "
                    "repeat, such as `(a|aa)+`). Simplify it or narrow path/include."
                ) from exc
            if not found:
                continue
            total += 1
            counts[name] = counts.get(name, 0) + 1
            if output == "lines" and len(matches) < MAX_MATCH_LINES:
                match: dict[str, Any] = {"path": name, "line": index + 1, "text": line}
                if around:
                    match["before"] = lines[max(0, index - around) : index]
                    match["after"] = lines[index + 1 : index + 1 + around]
                matches.append(match)
    observation: Observation = {"ok": True, "pattern": arguments["pattern"], "total_matches": total}
    if output == "lines":
        observation["matches"] = matches
        if total > len(matches):
            observation["matches_omitted"] = total - len(matches)
            observation["_note"] = f"Only the first {MAX_MATCH_LINES} matches are listed; narrow path or include."
    elif output == "files":
        observation["files"] = list(counts)
    else:
        observation["counts"] = counts
    if skipped_large:
        observation["skipped_large_files"] = skipped_large
    return observation


def glob(arguments: dict[str, Any], context: ToolContext) -> Observation:
    pattern = arguments["pattern"]
    if PurePosixPath(pattern).is_absolute() or Path(pattern).is_absolute():
        raise ToolFailure(f"pattern {pattern!r} is absolute; give a pattern relative to the workspace.")
    if ".." in PurePosixPath(pattern).parts:
        raise ToolFailure(f"pattern {pattern!r} climbs out with '..'; patterns stay inside the workspace.")
    relative = arguments.get("path", ".")
    start = context.path(relative)
    if not start.is_dir():
        raise ToolFailure(f"{relative!r} is not a directory in the workspace.")
    found = []
    for path in start.glob(pattern):
        # Path.glob may step through a symlinked directory: keep only what really lies inside.
        if path.is_symlink() or not path.is_file():
            continue
        real = path.resolve()
        if real != context.root and context.root not in real.parents:
            continue
        if any(part in SKIPPED_DIRS for part in path.relative_to(start).parts[:-1]):
            continue
        found.append((path.stat().st_mtime, context.relative(path)))
    found.sort(key=lambda item: (-item[0], item[1]))
    observation: Observation = {"ok": True, "pattern": pattern, "count": len(found)}
    observation["paths"] = [name for _, name in found[:MAX_GLOB_RESULTS]]
    if len(found) > MAX_GLOB_RESULTS:
        observation["paths_omitted"] = len(found) - MAX_GLOB_RESULTS
    return observation


TOOLS = [builtin("search_files", search_files), builtin("glob", glob)]
