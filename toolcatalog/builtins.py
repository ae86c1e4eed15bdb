"""The built-in tool registry and the runtime's ToolBox over one workspace.

The implementations live in `toolcatalog.tools` (one module per family); this module
keeps the names the rest of the code imports: `BUILTINS`, `BuiltinTool`,
`WorkspaceToolBox`. Tool failures are observations (`ok: false`), never exceptions.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings

from toolcatalog.tools import BuiltinTool, Observation, ToolContext, registry

__all__ = ["BUILTINS", "BuiltinTool", "Observation", "ToolContext", "WorkspaceToolBox"]

BUILTINS: dict[str, BuiltinTool] = registry()

# Decides whether a call of a tool that requires approval may run: (name, arguments) -> bool.
Approver = Callable[[str, dict[str, Any]], bool]


def auto_approved(name: str, arguments: dict[str, Any]) -> bool:
    """The default approver: only tools an operator listed in CC_TOOL_AUTO_APPROVE."""
    return name in settings.CC_TOOL_AUTO_APPROVE


class WorkspaceToolBox:
    """The runtime's ToolBox over the built-in tools of one conversation workspace.

    `conversation_id` (or `user_id`, for the MCP workspace) scopes memory and the task
    list. A tool that requires approval (bash by default) runs only if `approve` says
    yes; until approvals pause runs (RN-4) the refusal is an observation that says so.
    """

    def __init__(
        self,
        root: Path,
        tools: dict[str, BuiltinTool] | None = None,
        *,
        conversation_id: int | None = None,
        user_id: int | None = None,
        approve: Approver | None = None,
    ) -> None:
        self.root = Path(root)
        self.tools = BUILTINS if tools is None else tools
        self.context = ToolContext(root=self.root, conversation_id=conversation_id, user_id=user_id)
        self.approve = approve or auto_approved

    def schemas(self) -> list[dict[str, Any]]:
        return [self.tools[name].definition() for name in sorted(self.tools)]

    def execute(self, name: str, arguments: dict[str, Any]) -> Observation:
        tool = self.tools.get(name)
        if tool is None:
            return {"ok": False, "error": f"There is no tool named {name!r} in this run."}
        if tool.requires_approval and not self.approve(name, arguments):
            return {
                "ok": False,
                "error": f"{name} requires approval and this call was not approved; it did not run.",
                "approval_required": True,
            }
        return tool.call(arguments, self.context)
