"""Finding things in the workspace: search_files (regex over contents) and glob (names)."""

from __future__ import annotations

import fnmatch
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings

from engine.patterns import PatternError, compile_pattern
from toolcatalog.tools.base import Observation, ToolContext, ToolFailure, builtin
from toolcatalog.tools.files import SKIPPED_DIRS, looks_binary
from toolcatalog.workspace import DIRECTORY_FLAGS

MAX_MATCH_LINES = 500
MAX_GLOB_RESULTS = 1000
MAX_SEARCHED_FILE_BYTES = 20 * 1024 * 1024


@dataclass(frozen=True)
class FoundFile:
    """A regular file met by `walk_files`: open it with `open()` while the walk is on it."""

    relative: str  # from the workspace root
    directory: int  # its directory, open for the time the walk is in it
    name: str

    def open(self) -> int | None:
        """Its descriptor, or None when it was replaced by a link or a non-file meanwhile."""
        try:
            fd = os.open(self.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.directory)
        except OSError:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd

    def stat(self) -> os.stat_result | None:
        try:
            return os.stat(self.name, dir_fd=self.directory, follow_symlinks=False)
        except OSError:
            return None


def walk_files(context: ToolContext, relative: str, *, max_depth: int | None = None) -> Iterator[FoundFile]:
    """Regular files under `relative` (or that file), never following links, skipping build
    and VCS folders. Every directory is opened relative to its parent (os.fwalk), so neither a
    link planted meanwhile nor a path longer than PATH_MAX can take the walk elsewhere."""
    with context.located(relative) as here:
        info = here.lstat()
        if info is None:
            raise ToolFailure(f"{relative!r} does not exist in the workspace.")
        if stat.S_ISREG(info.st_mode):
            yield FoundFile(here.relative, here.parent, here.name)
            return
        try:
            start = os.open(here.name, DIRECTORY_FLAGS, dir_fd=here.parent)
        except OSError:
            raise ToolFailure(f"{relative!r} is neither a file nor a directory in the workspace.") from None
        base = here.relative
    try:
        for directory, dirnames, filenames, fd in os.fwalk(".", dir_fd=start):
            inner = directory[2:]  # after "./"
            depth = inner.count("/") + 1 if inner else 0
            dirnames[:] = sorted(
                name for name in dirnames if name not in SKIPPED_DIRS and (max_depth is None or depth < max_depth)
            )
            prefix = "/".join(part for part in (base, inner) if part and part != ".")
            for name in sorted(filenames):
                if stat.S_ISREG(_lstat_mode(fd, name)):
                    yield FoundFile(f"{prefix}/{name}" if prefix else name, fd, name)
    finally:
        os.close(start)


def _lstat_mode(directory: int, name: str) -> int:
    try:
        return os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
    except OSError:
        return 0


def _included(found: FoundFile, include: str | None) -> bool:
    if not include:
        return True
    return fnmatch.fnmatch(found.relative if "/" in include else found.name, include)


def _read_text(found: FoundFile) -> tuple[str, int] | None:
    """The file's text and size, or None for a binary file or one replaced meanwhile; a file
    over the size limit gives its size and no text."""
    fd = found.open()
    if fd is None:
        return None
    with open(fd, "rb") as handle:
        size = os.fstat(fd).st_size
        if size > MAX_SEARCHED_FILE_BYTES:
            return "", size
        data = handle.read(MAX_SEARCHED_FILE_BYTES + 1)
    if looks_binary(data[:8192]):
        return None
    return data.decode("utf-8", errors="replace"), size


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
    include = arguments.get("include")
    around = arguments.get("context_lines", 0)
    output = arguments.get("output", "lines")
    matches: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    total = 0
    skipped_large: list[str] = []
    for found in walk_files(context, relative):
        if not _included(found, include):
            continue
        read = _read_text(found)
        if read is None:
            continue
        text, size = read
        name = found.relative
        if size > MAX_SEARCHED_FILE_BYTES:
            skipped_large.append(name)
            continue
        lines = text.splitlines()
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


def _glob_matches(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    """Path.glob's rule, on a path already found: `**` is any number of folders, other parts
    match one name each (case-sensitive, as on the workspace's file system)."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_glob_matches(pattern[1:], parts[index:]) for index in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _glob_matches(pattern[1:], parts[1:])


def glob(arguments: dict[str, Any], context: ToolContext) -> Observation:
    pattern = arguments["pattern"]
    if PurePosixPath(pattern).is_absolute() or Path(pattern).is_absolute():
        raise ToolFailure(f"pattern {pattern!r} is absolute; give a pattern relative to the workspace.")
    parts = PurePosixPath(pattern).parts
    if ".." in parts:
        raise ToolFailure(f"pattern {pattern!r} climbs out with '..'; patterns stay inside the workspace.")
    relative = arguments.get("path", ".")
    with context.located(relative) as here:
        info = here.lstat()
        base = here.relative
    if info is None or not stat.S_ISDIR(info.st_mode):
        raise ToolFailure(f"{relative!r} is not a directory in the workspace.")
    # Without `**`, no match lies deeper than the pattern's own folders.
    deepest = None if "**" in parts else len(parts) - 1
    found = []
    for file in walk_files(context, relative, max_depth=deepest):
        inside = file.relative if base == "." else file.relative[len(base) + 1 :]
        if not _glob_matches(parts, tuple(inside.split("/"))):
            continue
        info = file.stat()
        if info is not None:
            found.append((info.st_mtime, file.relative))
    found.sort(key=lambda item: (-item[0], item[1]))
    observation: Observation = {"ok": True, "pattern": pattern, "count": len(found)}
    observation["paths"] = [name for _, name in found[:MAX_GLOB_RESULTS]]
    if len(found) > MAX_GLOB_RESULTS:
        observation["paths_omitted"] = len(found) - MAX_GLOB_RESULTS
    return observation


TOOLS = [builtin("search_files", search_files), builtin("glob", glob)]
