"""File tools: read_file, write_file, edit_file, list_dir (all inside the workspace)."""

from __future__ import annotations

import difflib
import fnmatch
import mimetypes
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from toolcatalog import quota
from toolcatalog.tools.base import Observation, ToolContext, ToolFailure, builtin

DEFAULT_READ_LIMIT = 2000
_SNIFF_BYTES = 8192
_DIFF_MAX_LINES = 60
# Build output and version-control folders: listed by name in `skipped`, never descended.
SKIPPED_DIRS = frozenset(
    {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", ".mypy_cache", ".pytest_cache",
     ".ruff_cache", ".tox", "dist", "build"}
)  # fmt: skip


def is_binary(path: Path) -> bool:
    with path.open("rb") as handle:
        head = handle.read(_SNIFF_BYTES)
    if b"\x00" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut at the sniff boundary is still text.
        return exc.start < len(head) - 4
    return False


def _describe_binary(path: Path) -> str:
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"{path.name} is a binary file ({path.stat().st_size} bytes, {mime}); read_file reads text only."


def _existing_file(context: ToolContext, relative: str) -> Path:
    target = context.path(relative)
    if not target.exists():
        raise ToolFailure(f"{relative!r} does not exist in the workspace.")
    if not target.is_file():
        raise ToolFailure(f"{relative!r} is not a regular file.")
    return target


def read_file(arguments: dict[str, Any], context: ToolContext) -> Observation:
    relative = arguments["path"]
    target = _existing_file(context, relative)
    if is_binary(target):
        raise ToolFailure(_describe_binary(target))
    offset = arguments.get("offset", 1)
    limit = arguments.get("limit", DEFAULT_READ_LIMIT)
    selected: list[str] = []
    total = 0
    # Stream the file: a page of a huge file costs the page plus one pass, not a copy of the file.
    with target.open(encoding="utf-8", errors="replace", newline="") as handle:
        for total, line in enumerate(handle, start=1):  # noqa: B007 - total is the line count after the loop
            if offset <= total < offset + limit:
                selected.append(f"{total:6}\t{line.rstrip(chr(10)).rstrip(chr(13))}")
    if total and offset > total:
        raise ToolFailure(f"offset {offset} is past the end of {relative!r}, which has {total} lines.")
    last = offset + len(selected) - 1
    observation: Observation = {
        "ok": True,
        "path": context.relative(target),
        "total_lines": total,
        "offset": offset,
        "lines_returned": len(selected),
        "content": "\n".join(selected),
    }
    if last < total:
        observation["next_offset"] = last + 1
    return observation


def write_file(arguments: dict[str, Any], context: ToolContext) -> Observation:
    relative = arguments["path"]
    content = arguments["content"]
    mode = arguments.get("mode", "overwrite")
    target = context.path(relative)
    if target.exists() and not target.is_file():
        raise ToolFailure(f"{relative!r} exists and is not a regular file.")
    if mode == "create_only" and target.exists():
        raise ToolFailure(f"{relative!r} already exists and mode is create_only.")
    existed = target.exists()
    data = content.encode("utf-8")
    quota.check_write(context, len(data) - (target.stat().st_size if existed and mode != "append" else 0))
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("ab" if mode == "append" else "wb") as handle:
        handle.write(data)
    return {
        "ok": True,
        "path": context.relative(target),
        "mode": mode,
        "created": not existed,
        "bytes_written": len(data),
        "size": target.stat().st_size,
    }


def edit_file(arguments: dict[str, Any], context: ToolContext) -> Observation:
    relative = arguments["path"]
    old, new = arguments["old_string"], arguments["new_string"]
    replace_all = arguments.get("replace_all", False)
    if old == "":
        raise ToolFailure("old_string is empty; give the exact text to replace.")
    if old == new:
        raise ToolFailure("new_string is identical to old_string; nothing would change.")
    target = _existing_file(context, relative)
    if is_binary(target):
        raise ToolFailure(_describe_binary(target))
    with target.open(encoding="utf-8", newline="") as handle:
        text = handle.read()
    count = text.count(old)
    if count == 0:
        raise ToolFailure(f"old_string was not found in {relative!r}; it must match byte for byte, indentation too.")
    if count > 1 and not replace_all:
        raise ToolFailure(
            f"old_string occurs {count} times in {relative!r}; add surrounding lines to make it unique "
            "or set replace_all."
        )
    updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
    quota.check_write(context, len(updated.encode("utf-8")) - len(text.encode("utf-8")))
    with target.open("w", encoding="utf-8", newline="") as handle:
        handle.write(updated)
    diff = list(
        difflib.unified_diff(
            text.splitlines(), updated.splitlines(), f"a/{relative}", f"b/{relative}", lineterm="", n=1
        )
    )
    observation: Observation = {
        "ok": True,
        "path": context.relative(target),
        "replacements": count if replace_all else 1,
        "diff": "\n".join(diff[:_DIFF_MAX_LINES]),
    }
    if len(diff) > _DIFF_MAX_LINES:
        observation["diff_lines_omitted"] = len(diff) - _DIFF_MAX_LINES
    return observation


def _entry(path: Path) -> dict[str, Any]:
    # lstat: a symlink is reported as one and never followed, wherever it points.
    info = path.lstat()
    kind = "symlink" if path.is_symlink() else "dir" if path.is_dir() else "file"
    return {
        "name": path.name,
        "type": kind,
        "size": info.st_size if kind == "file" else None,
        "modified": datetime.fromtimestamp(info.st_mtime, tz=UTC).isoformat(timespec="seconds"),
    }


def _list(directory: Path, depth: int, ignore: list[str], skipped: list[str], context: ToolContext) -> list[dict]:
    entries = []
    for child in sorted(directory.iterdir(), key=lambda p: p.name):
        if any(fnmatch.fnmatch(child.name, pattern) for pattern in ignore):
            continue
        if child.name in SKIPPED_DIRS and child.is_dir() and not child.is_symlink():
            skipped.append(context.relative(child))
            continue
        entry = _entry(child)
        if depth > 1 and entry["type"] == "dir":
            entry["entries"] = _list(child, depth - 1, ignore, skipped, context)
        entries.append(entry)
    return entries


def list_dir(arguments: dict[str, Any], context: ToolContext) -> Observation:
    relative = arguments.get("path", ".")
    target = context.path(relative)
    if not target.is_dir():
        raise ToolFailure(f"{relative!r} is not a directory in the workspace.")
    skipped: list[str] = []
    entries = _list(target, arguments.get("depth", 1), arguments.get("ignore", []), skipped, context)
    observation: Observation = {"ok": True, "path": context.relative(target), "entries": entries}
    if skipped:
        observation["skipped"] = skipped
    return observation


TOOLS = [
    builtin("read_file", read_file),
    builtin("write_file", write_file),
    builtin("edit_file", edit_file),
    builtin("list_dir", list_dir),
]
