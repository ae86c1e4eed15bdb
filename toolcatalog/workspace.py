"""Per-conversation workspace directories (RN-5): paths never leave them."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings


class PathEscapesWorkspace(ValueError):
    pass


def workspace_root(conversation_id: int) -> Path:
    root = Path(settings.CC_WORKSPACE_ROOT) / f"conversation-{conversation_id}"
    root.mkdir(parents=True, exist_ok=True)
    return root.resolve()


def resolve_inside(root: Path, relative: str) -> Path:
    """The real path of `relative` under `root`; refuses absolute paths, `..` and symlinks out."""
    if Path(relative).is_absolute():
        raise PathEscapesWorkspace(f"{relative!r} is absolute; give a path relative to the workspace.")
    candidate = (root / relative).resolve()
    if candidate != root and root not in candidate.parents:
        raise PathEscapesWorkspace(f"{relative!r} points outside the workspace.")
    return candidate


def mcp_workspace_root(user_id: int) -> Path:
    """The workspace of one user's MCP calls: outside any conversation, never shared between users."""
    root = Path(settings.CC_WORKSPACE_ROOT) / f"mcp-user-{user_id}"
    root.mkdir(parents=True, exist_ok=True)
    return root.resolve()
