"""Per-conversation workspace directories (RN-5): paths never leave them.

The file tools run in the worker (as root, in the usual deployment), outside the sandbox, on
files a sandboxed command can change at any moment. A path checked and then opened by name can
be swapped for a link between the two (QA read the server's SECRET_KEY and wrote a root-owned
file outside the workspace that way). So `locate` walks a path one component at a time from an
open descriptor of the workspace, each opened relative to its parent without following links,
and follows a link itself only as far as it stays inside; the tools then open the last
component relative to its directory, again without following links.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from django.conf import settings
from django.db import transaction

logger = logging.getLogger(__name__)


class PathEscapesWorkspace(ValueError):
    pass


def workspace_root(conversation_id: int) -> Path:
    root = Path(settings.CC_WORKSPACE_ROOT) / f"conversation-{conversation_id}"
    root.mkdir(parents=True, exist_ok=True)
    return root.resolve()


def remove_conversation_workspace(sender: type, instance: Any, **kwargs: Any) -> None:
    """A deleted conversation's files go with it, once the deletion is committed (QA: they stayed
    on disk for good, and out of the owner's quota, which counts live conversations: delete and
    write again, and one user filled the disk)."""
    path = Path(settings.CC_WORKSPACE_ROOT) / f"conversation-{instance.pk}"

    def remove() -> None:
        try:
            # rmtree works by descriptor here (rmtree.avoids_symlink_attacks): a link inside
            # cannot make it delete outside.
            shutil.rmtree(path)
        except FileNotFoundError:
            pass
        except Exception:  # a tree deeper than the recursion limit, a file the sandbox holds
            logger.exception("could not remove the workspace of deleted conversation %s at %s", instance.pk, path)

    transaction.on_commit(remove)


def mcp_workspace_root(user_id: int) -> Path:
    """The workspace of one user's MCP calls: outside any conversation, never shared between users."""
    root = Path(settings.CC_WORKSPACE_ROOT) / f"mcp-user-{user_id}"
    root.mkdir(parents=True, exist_ok=True)
    return root.resolve()


DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS = 40  # as the kernel's own limit on links in one path


class Located:
    """A workspace path, resolved: its directory open as `parent`, its last component `name`
    ("." for the directory itself) and the path from the workspace root. Closes its descriptors
    on exit; a descriptor opened from it outlives them."""

    def __init__(self, directories: list[tuple[int, str]], name: str) -> None:
        self._directories = directories
        self.parent = directories[-1][0]
        self.name = name
        parts = [part for _fd, part in directories[1:]] + ([] if name == "." else [name])
        self.relative = "/".join(parts) or "."

    def lstat(self) -> os.stat_result | None:
        try:
            return os.stat(self.name, dir_fd=self.parent, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def open(self, flags: int, mode: int = 0o644) -> int:
        return os.open(self.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.parent)

    def close(self) -> None:
        for fd, _part in reversed(self._directories):
            os.close(fd)
        self._directories = []

    def __enter__(self) -> Located:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def locate(root: Path, relative: str, *, make_parents: bool = False) -> Located:
    """Resolve `relative` under `root` without a name lookup an outside change could redirect.

    Raises PathEscapesWorkspace for an absolute path, a `..` above the root or a link pointing
    out (or to an absolute path); FileNotFoundError for a missing directory on the way (created
    with `make_parents`); NotADirectoryError for a file where a directory should be. The last
    component may be missing; a link there is followed as far as it stays inside.
    """
    if relative.startswith("/"):
        raise PathEscapesWorkspace(f"{relative!r} is absolute; give a path relative to the workspace.")
    if make_parents:
        root.mkdir(parents=True, exist_ok=True)  # a workspace no call has written to yet
    directories = [(os.open(root, DIRECTORY_FLAGS), "")]
    pending, links = _parts(relative), 0
    try:
        while pending:
            part = pending.pop(0)
            if part == "..":
                if len(directories) == 1:
                    raise PathEscapesWorkspace(f"{relative!r} points outside the workspace.")
                os.close(directories.pop()[0])
                continue
            parent = directories[-1][0]
            if not pending:
                info = _lstat(parent, part)
                if info is None or not stat.S_ISLNK(info.st_mode):
                    return Located(directories, part)
            try:
                directories.append((_open_directory(parent, part, make_parents), part))
                continue
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise
                target = _link_target(parent, part)
                if target is None:
                    raise NotADirectoryError(f"{part!r} in {relative!r} is not a directory.") from None
            links += 1
            if links > _MAX_LINKS or target.startswith("/"):
                raise PathEscapesWorkspace(f"{relative!r} points outside the workspace.")
            pending[:0] = _parts(target)
        return Located(directories, ".")
    except BaseException:
        Located(directories, ".").close()
        raise


def _lstat(parent: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _open_directory(parent: int, name: str, make_parents: bool) -> int:
    try:
        return os.open(name, DIRECTORY_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not make_parents:
            raise
    with contextlib.suppress(FileExistsError):  # made meanwhile: opened below like any other
        os.mkdir(name, dir_fd=parent)
    return os.open(name, DIRECTORY_FLAGS, dir_fd=parent)


def _link_target(parent: int, name: str) -> str | None:
    try:
        return os.readlink(name, dir_fd=parent)
    except OSError:
        return None


def entries_beneath(root: Path) -> Iterator[tuple[int, str, str, os.stat_result]]:
    """Every entry under `root`: its directory's descriptor (open while the entry is the current
    one), its name, its path from the root and its lstat. Links are never followed and each
    directory is opened relative to its parent, so neither a folder swapped for a link nor a tree
    deeper than PATH_MAX (QA: "File name too long" failed every later bash and write_file of the
    user) takes the walk elsewhere; an entry vanishing mid-walk is skipped."""
    try:
        root_fd = os.open(root, DIRECTORY_FLAGS)
    except OSError:
        return
    # One descriptor per level being walked; each directory's names are read at once.
    stack: list[tuple[int, str, Iterator[str]]] = [(root_fd, "", iter(_names(root_fd)))]
    try:
        while stack:
            fd, relative, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(fd)
                stack.pop()
                continue
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            path = f"{relative}/{name}" if relative else name
            yield fd, name, path, info
            if stat.S_ISDIR(info.st_mode):
                try:
                    inner = os.open(name, DIRECTORY_FLAGS, dir_fd=fd)
                except (FileNotFoundError, NotADirectoryError, PermissionError, OSError):
                    continue
                stack.append((inner, path, iter(_names(inner))))
    finally:
        for fd, _relative, _names_left in stack:
            os.close(fd)


def _names(fd: int) -> list[str]:
    try:
        with os.scandir(fd) as entries:
            return [entry.name for entry in entries]
    except OSError:
        return []
