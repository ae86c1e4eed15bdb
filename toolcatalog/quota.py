"""The per-user disk quota over all of a user's workspaces (SB-3, `CC_WORKSPACE_QUOTA_MB`).

Usage is disk blocks (a sparse file counts what it really occupies). A user's workspaces are
those of their conversations plus their MCP workspace; a context with no user (a toolbox built
on a bare directory) is its own unit.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.apps import apps
from django.conf import settings

from toolcatalog.tools.base import ToolContext, ToolFailure


def quota_bytes() -> int:
    return settings.CC_WORKSPACE_QUOTA_MB * 1024 * 1024


def tree_bytes(root: Path) -> int:
    """Disk bytes under `root`, symlinks not followed; a file vanishing mid-walk counts as nothing."""
    total, stack = 0, [str(root)]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                total += info.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total


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
    return sum(tree_bytes(path) for path in other_workspaces(context))


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
