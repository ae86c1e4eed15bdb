"""File tools: read_file, write_file, edit_file, list_dir (all inside the workspace)."""

from __future__ import annotations

import difflib
import errno
import fnmatch
import mimetypes
import os
import stat
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any, BinaryIO

from toolcatalog import quota
from toolcatalog.tools.base import Observation, ToolContext, ToolFailure, builtin
from toolcatalog.workspace import DIRECTORY_FLAGS, Located

DEFAULT_READ_LIMIT = 2000
# A line longer than this is cut (minified code, a one-line JSON dump): one line must not fill a page.
MAX_LINE_CHARS = 2000
_LINE_READ_BYTES = 4 * MAX_LINE_CHARS  # a UTF-8 character is at most 4 bytes
_SNIFF_BYTES = 8192
_DIFF_MAX_LINES = 60
# Build output and version-control folders: listed by name in `skipped`, never descended.
SKIPPED_DIRS = frozenset(
    {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", ".mypy_cache", ".pytest_cache",
     ".ruff_cache", ".tox", "dist", "build"}
)  # fmt: skip


def looks_binary(head: bytes) -> bool:
    """Whether the first bytes of a file say it is not text."""
    if b"\x00" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut at the sniff boundary is still text.
        return exc.start < len(head) - 4
    return False


def _describe_binary(relative: str, size: int) -> str:
    name = PurePosixPath(relative).name
    mime = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return f"{name} is a binary file ({size} bytes, {mime}); read_file reads text only."


def open_regular(here: Located, relative: str, flags: int) -> int:
    """A descriptor of the regular file at `here`; a link planted there since, a directory, a
    FIFO or a device is refused (non-blocking, so a FIFO cannot hold the call)."""
    try:
        fd = here.open(flags | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ToolFailure(f"{relative!r} does not exist in the workspace.") from None
    except FileExistsError:
        raise ToolFailure(f"{relative!r} already exists and mode is create_only.") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ENOTDIR):
            raise ToolFailure(f"{relative!r} is not a regular file.") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ToolFailure(f"{relative!r} is not a regular file.")
    return fd


def _open_file(context: ToolContext, relative: str, flags: int) -> tuple[int, str]:
    with context.located(relative) as here:
        return open_regular(here, relative, flags), here.relative


def _shown_line(line: bytes, rest: int) -> str:
    """One line as read_file shows it: decoded, without its end, cut at MAX_LINE_CHARS."""
    text = line.decode("utf-8", errors="replace").rstrip("\n").rstrip("\r")
    if len(text) <= MAX_LINE_CHARS and not rest:
        return text
    more = len(text[MAX_LINE_CHARS:].encode("utf-8")) + rest
    return f"{text[:MAX_LINE_CHARS]} [... {more} more bytes on this line]"


def _page(handle: BinaryIO, offset: int, limit: int) -> tuple[list[str], int]:
    """Lines offset..offset+limit-1 as shown, and the file's line count. Memory stays bounded
    whatever the file: a long line is read in pieces and only its start kept, and the lines past
    the page are counted in blocks, not decoded (QA: a 500 MB one-line file took 1.7 GB)."""
    selected: list[str] = []
    number = 0
    while number < offset + limit - 1:
        line = handle.readline(_LINE_READ_BYTES)
        if not line:
            return selected, number
        number += 1
        rest = 0
        while not line.endswith(b"\n"):
            more = handle.readline(_LINE_READ_BYTES)
            if not more:
                break
            rest += len(more) - more.endswith(b"\n")
            if more.endswith(b"\n"):
                break
        if number >= offset:
            selected.append(_shown_line(line, rest))
    last = b"\n"
    while block := handle.read(1 << 20):
        number += block.count(b"\n")
        last = block
    return selected, number + (not last.endswith(b"\n"))


def read_file(arguments: dict[str, Any], context: ToolContext) -> Observation:
    relative = arguments["path"]
    fd, shown = _open_file(context, relative, os.O_RDONLY)
    offset = arguments.get("offset", 1)
    limit = arguments.get("limit", DEFAULT_READ_LIMIT)
    with open(fd, "rb") as handle:
        if looks_binary(handle.read(_SNIFF_BYTES)):
            raise ToolFailure(_describe_binary(shown, os.fstat(fd).st_size))
        handle.seek(0)
        selected, total = _page(handle, offset, limit)
    if total and offset > total:
        raise ToolFailure(f"offset {offset} is past the end of {relative!r}, which has {total} lines.")
    last = offset + len(selected) - 1
    observation: Observation = {
        "ok": True,
        "path": shown,
        "total_lines": total,
        "offset": offset,
        "lines_returned": len(selected),
        "content": "\n".join(f"{offset + index:6}\t{line}" for index, line in enumerate(selected)),
    }
    if last < total:
        observation["next_offset"] = last + 1
    return observation


def _existing_size(context: ToolContext, relative: str) -> int | None:
    """The size of the regular file at `relative`, None when there is none yet."""
    try:
        here = context.located(relative)
    except ToolFailure:
        # A directory on the way is missing: the write makes it. Any other refusal is said again
        # by the resolution that writes.
        return None
    with here:
        info = here.lstat()
    if info is None:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise ToolFailure(f"{relative!r} exists and is not a regular file.")
    return info.st_size


def write_file(arguments: dict[str, Any], context: ToolContext) -> Observation:
    relative = arguments["path"]
    content = arguments["content"]
    mode = arguments.get("mode", "overwrite")
    size = _existing_size(context, relative)
    if mode == "create_only" and size is not None:
        raise ToolFailure(f"{relative!r} already exists and mode is create_only.")
    data = content.encode("utf-8")
    quota.check_write(context, len(data) - (size if size is not None and mode != "append" else 0))
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "append" else os.O_TRUNC)
    if mode == "create_only":
        flags |= os.O_EXCL
    with context.located(relative, make_parents=True) as here:
        fd, shown = open_regular(here, relative, flags), here.relative
    with open(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        written = os.fstat(fd).st_size
    return {
        "ok": True,
        "path": shown,
        "mode": mode,
        "created": size is None,
        "bytes_written": len(data),
        "size": written,
    }


def edit_file(arguments: dict[str, Any], context: ToolContext) -> Observation:
    relative = arguments["path"]
    old, new = arguments["old_string"], arguments["new_string"]
    replace_all = arguments.get("replace_all", False)
    if old == "":
        raise ToolFailure("old_string is empty; give the exact text to replace.")
    if old == new:
        raise ToolFailure("new_string is identical to old_string; nothing would change.")
    fd, shown = _open_file(context, relative, os.O_RDWR)
    with open(fd, "r+b") as handle:
        data = handle.read()
        if looks_binary(data[:_SNIFF_BYTES]):
            raise ToolFailure(_describe_binary(shown, len(data)))
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ToolFailure(
                f"{relative!r} is not valid UTF-8 (at byte {exc.start}); edit_file edits text only."
            ) from None
        count = text.count(old)
        if count == 0:
            raise ToolFailure(
                f"old_string was not found in {relative!r}; it must match byte for byte, indentation too."
            )
        if count > 1 and not replace_all:
            raise ToolFailure(
                f"old_string occurs {count} times in {relative!r}; add surrounding lines to make it unique "
                "or set replace_all."
            )
        updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
        encoded = updated.encode("utf-8")
        quota.check_write(context, len(encoded) - len(data))
        handle.seek(0)
        handle.write(encoded)
        handle.truncate()
    diff = list(
        difflib.unified_diff(
            text.splitlines(), updated.splitlines(), f"a/{relative}", f"b/{relative}", lineterm="", n=1
        )
    )
    observation: Observation = {
        "ok": True,
        "path": shown,
        "replacements": count if replace_all else 1,
        "diff": "\n".join(diff[:_DIFF_MAX_LINES]),
    }
    if len(diff) > _DIFF_MAX_LINES:
        observation["diff_lines_omitted"] = len(diff) - _DIFF_MAX_LINES
    return observation


def _entry(name: str, info: os.stat_result) -> dict[str, Any]:
    # lstat: a symlink is reported as one and never followed, wherever it points.
    kind = "symlink" if stat.S_ISLNK(info.st_mode) else "dir" if stat.S_ISDIR(info.st_mode) else "file"
    return {
        "name": name,
        "type": kind,
        "size": info.st_size if kind == "file" else None,
        "modified": datetime.fromtimestamp(info.st_mtime, tz=UTC).isoformat(timespec="seconds"),
    }


def _joined(directory: str, name: str) -> str:
    return name if directory == "." else f"{directory}/{name}"


def _list(fd: int, directory: str, depth: int, ignore: list[str], skipped: list[str]) -> list[dict]:
    """The entries of the open directory `fd` (shown as `directory`), opened below it one by one."""
    entries = []
    with os.scandir(fd) as found:
        children = sorted(found, key=lambda child: child.name)
    for child in children:
        if any(fnmatch.fnmatch(child.name, pattern) for pattern in ignore):
            continue
        try:
            info = child.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if child.name in SKIPPED_DIRS and stat.S_ISDIR(info.st_mode):
            skipped.append(_joined(directory, child.name))
            continue
        entry = _entry(child.name, info)
        if depth > 1 and entry["type"] == "dir":
            try:
                inner = os.open(child.name, DIRECTORY_FLAGS, dir_fd=fd)
            except OSError:
                inner = None  # replaced or removed since it was listed
            if inner is not None:
                try:
                    entry["entries"] = _list(inner, _joined(directory, child.name), depth - 1, ignore, skipped)
                finally:
                    os.close(inner)
        entries.append(entry)
    return entries


def open_directory(context: ToolContext, relative: str) -> tuple[int, str]:
    """A descriptor of the workspace directory `relative`, opened without following links."""
    with context.located(relative) as here:
        try:
            return os.open(here.name, DIRECTORY_FLAGS, dir_fd=here.parent), here.relative
        except OSError:
            raise ToolFailure(f"{relative!r} is not a directory in the workspace.") from None


def list_dir(arguments: dict[str, Any], context: ToolContext) -> Observation:
    relative = arguments.get("path", ".")
    fd, shown = open_directory(context, relative)
    skipped: list[str] = []
    try:
        entries = _list(fd, shown, arguments.get("depth", 1), arguments.get("ignore", []), skipped)
    finally:
        os.close(fd)
    observation: Observation = {"ok": True, "path": shown, "entries": entries}
    if skipped:
        observation["skipped"] = skipped
    return observation


TOOLS = [
    builtin("read_file", read_file),
    builtin("write_file", write_file),
    builtin("edit_file", edit_file),
    builtin("list_dir", list_dir),
]
