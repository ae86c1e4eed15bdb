"""The per-user disk quota over all of a user's workspaces (SB-3, `CC_WORKSPACE_QUOTA_MB`).

Usage is disk blocks (a sparse file counts what it really occupies). A user's workspaces are
those of their conversations plus their MCP workspace; a context with no user (a toolbox built
on a bare directory) is its own unit.

A bash call that reaches the quota is stopped, and what it wrote past the quota is undone
(`undo_growth`): the files it created are removed and the files it grew are cut back to their
size before the call, the most recently changed first, until the user is within the quota
again; a file the per-call file-size limit (what was left of the quota) cut short is always
undone, since it is half-written. Paths that existed before the call are never removed.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from django.apps import apps
from django.conf import settings

from controlcenter.db import reconnecting
from toolcatalog.tools.base import ToolContext, ToolFailure
from toolcatalog.workspace import entries_beneath


def quota_bytes() -> int:
    return settings.CC_WORKSPACE_QUOTA_MB * 1024 * 1024


def tree_bytes(root: Path) -> int:
    """Disk bytes under `root`, symlinks not followed; a file vanishing mid-walk counts as nothing."""
    return sum(info.st_blocks * 512 for _directory, _name, _path, info in entries_beneath(root))


def owner_id(context: ToolContext) -> int | None:
    if context.user_id is not None:
        return context.user_id
    if context.conversation_id is None:
        return None
    conversation = apps.get_model("conversations", "Conversation")
    return conversation.objects.filter(id=context.conversation_id).values_list("owner_id", flat=True).first()


def other_workspaces(context: ToolContext) -> list[Path]:
    """The owner's workspaces other than this context's own."""
    user_id = owner_id(context)
    if user_id is None:
        return []
    root = Path(settings.CC_WORKSPACE_ROOT)
    conversation = apps.get_model("conversations", "Conversation")
    ids = conversation.objects.filter(owner_id=user_id).values_list("id", flat=True)
    paths = [root / f"conversation-{i}" for i in ids] + [root / f"mcp-user-{user_id}"]
    return [p for p in paths if p.resolve() != context.root]


def others_bytes(context: ToolContext) -> int:
    # A read, so safe to repeat on a new connection: a drop just after the tool's connection
    # check (CH-5) must not fail a bash call before its command has even started.
    return sum(tree_bytes(path) for path in reconnecting(lambda: other_workspaces(context)))


def remaining_bytes(context: ToolContext) -> int:
    return quota_bytes() - others_bytes(context) - tree_bytes(context.root)


def describe(used: int) -> str:
    mb = 1024 * 1024
    return (
        f"Your workspaces use {used / mb:.1f} MB of the {settings.CC_WORKSPACE_QUOTA_MB} MB quota "
        "(CC_WORKSPACE_QUOTA_MB)"
    )


def check_write(context: ToolContext, adding: int) -> None:
    """Refuse, before anything is written, a write that would take the owner past the quota."""
    if adding <= 0:
        return
    used = others_bytes(context) + tree_bytes(context.root)
    # Rounded up to whole 4 KiB blocks, as the file system will store it.
    needed = -(-adding // 4096) * 4096
    if used + needed > quota_bytes():
        raise ToolFailure(
            f"{describe(used)}; this write needs {needed} more bytes, so nothing was written. "
            "Delete files you no longer need and try again."
        )


@dataclass
class Before:
    """A workspace as a call found it: its disk bytes, and (inode, size) of each file and directory."""

    usage: int
    entries: dict[str, tuple[int, int]] = field(default_factory=dict)
    since_ns: int = 0  # a file changed (ctime) since then may be the call's

    @classmethod
    def take(cls, root: Path) -> Before:
        """One walk (the one that measures the usage anyway), before the call starts."""
        # File times come from a coarse clock that can lag this one by a tick: a margin, so a file
        # the call writes at once is not taken for an old one.
        before = cls(0, {}, time.time_ns() - 1_000_000_000)
        for _directory, _name, path, info in entries_beneath(root):
            before.usage += info.st_blocks * 512
            before.entries[path] = (info.st_ino, info.st_size)
        return before


@dataclass(order=True)
class _Change:
    ctime_ns: int
    path: str
    size: int
    old_size: int | None  # None: created by the call


def undo_growth(root: Path, before: Before, *, excess: int, cut_at: int | None) -> list[str]:
    """Undo the call's writes, newest first, until `excess` bytes are freed; says what it did.

    Files at `cut_at` bytes or more (the call's file-size limit, when what was left of the quota
    set it) were cut short by it and are undone first. A new file is removed, a grown file (the
    same inode) is cut back to its old size; a path that existed before the call is never
    removed. The walk opens every directory relative to its parent without following links,
    so a link the call planted cannot steer it outside the workspace.
    """
    changes: list[_Change] = []
    new_directories: list[str] = []
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        _changes(root_fd, "", before, changes, new_directories)
        cut_short = [change for change in changes if cut_at is not None and change.size >= cut_at]
        rest = sorted((change for change in changes if cut_at is None or change.size < cut_at), reverse=True)
        done: list[str] = []
        for number, change in enumerate([*cut_short, *rest]):
            if excess <= 0 and number >= len(cut_short):
                break
            freed = _undo(root_fd, change)
            if freed is not None:
                excess -= freed
                done.append(
                    f"removed {change.path}"
                    if change.old_size is None
                    else f"cut {change.path} back to {change.old_size} bytes"
                )
        # Directories the call made and left empty (deepest first) hold a block each.
        for path in sorted(new_directories, key=lambda name: name.count("/"), reverse=True):
            if excess <= 0:
                break
            with contextlib.suppress(OSError), _parent(root_fd, path) as (parent, name):
                freed = os.stat(name, dir_fd=parent, follow_symlinks=False).st_blocks * 512
                os.rmdir(name, dir_fd=parent)
                excess -= freed
                done.append(f"removed {path}/")
        return done
    finally:
        os.close(root_fd)


def _changes(fd: int, relative: str, before: Before, changes: list[_Change], new_directories: list[str]) -> None:
    with contextlib.suppress(OSError), os.scandir(fd) as entries:
        for entry in entries:
            path = f"{relative}/{entry.name}" if relative else entry.name
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            old = before.entries.get(path)
            if stat.S_ISDIR(info.st_mode):
                if old is None:
                    new_directories.append(path)
                with contextlib.suppress(OSError):
                    child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                    try:
                        _changes(child, path, before, changes, new_directories)
                    finally:
                        os.close(child)
            elif stat.S_ISREG(info.st_mode) and info.st_ctime_ns >= before.since_ns:
                if old is None:
                    changes.append(_Change(info.st_ctime_ns, path, info.st_size, None))
                elif old[0] == info.st_ino and info.st_size > old[1]:
                    changes.append(_Change(info.st_ctime_ns, path, info.st_size, old[1]))


@contextlib.contextmanager
def _parent(root_fd: int, path: str) -> Iterator[tuple[int, str]]:
    """The directory fd holding `path` (opened without following links) and the entry's name."""
    *directories, name = path.split("/")
    fds: list[int] = []
    try:
        current = root_fd
        for directory in directories:
            current = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
            fds.append(current)
        yield current, name
    finally:
        for fd in fds:
            os.close(fd)


def _undo(root_fd: int, change: _Change) -> int | None:
    """Remove or cut back one file; the bytes freed, or None when it could not be done."""
    try:
        with _parent(root_fd, change.path) as (parent, name):
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                return None
            if change.old_size is None:
                os.unlink(name, dir_fd=parent)
                return info.st_blocks * 512
            fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent)
            try:
                os.ftruncate(fd, change.old_size)
                return info.st_blocks * 512 - os.fstat(fd).st_blocks * 512
            finally:
                os.close(fd)
    except OSError:
        return None
