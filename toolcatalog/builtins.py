"""The built-in tool registry and the runtime's ToolBox over one workspace.

The implementations live in `toolcatalog.tools` (one module per family); this module
keeps the names the rest of the code imports: `BUILTINS`, `BuiltinTool`,
`WorkspaceToolBox`, and the built-ins as catalog records (`builtin_records`,
`builtin_names`). Tool failures are observations (`ok: false`), never exceptions.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from django.conf import settings

from engine.catalog.surface import ToolRecord
from engine.toolbox import needs_approval
from toolcatalog.tools import BuiltinTool, Observation, ToolContext, registry

__all__ = [
    "BUILTINS",
    "BuiltinTool",
    "Observation",
    "ToolContext",
    "WorkspaceToolBox",
    "builtin_names",
    "builtin_records",
]

BUILTINS: dict[str, BuiltinTool] = registry()

# Decides whether a call of a tool that requires approval may run: (name, arguments) -> bool.
Approver = Callable[[str, dict[str, Any]], bool]


def nobody_approves(name: str, arguments: dict[str, Any]) -> bool:
    """The default: no person is asked, so a call that needs approval does not run."""
    return False


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
        self.approve = approve or nobody_approves

    def schemas(self) -> list[dict[str, Any]]:
        return [self.tools[name].definition() for name in sorted(self.tools)]

    def requires_approval(self, name: str) -> bool:
        # This toolbox settles approval itself (its `approve`), so the loop never pauses for it.
        return False

    def resident_count(self) -> int | None:
        return None  # nothing is deferred: every schema belongs to the cached block

    def restore_loaded(self, names: list[str], recency: list[str] | None = None, called: Collection[str] = ()) -> None:
        """Nothing is deferred here, so nothing needs loading again."""

    def restore_observations(self, observations: dict[int, Observation]) -> None:
        """Observations are the scratchpad layer's business; nothing is kept here."""

    def preview_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """No references are resolved here."""
        return arguments

    def execute_step(self, step: int, name: str, arguments: dict[str, Any]) -> Observation:
        return self.execute(name, arguments)

    def execute(self, name: str, arguments: dict[str, Any]) -> Observation:
        tool = self.tools.get(name)
        if tool is None:
            return {"ok": False, "error": f"There is no tool named {name!r} in this run."}
        if needs_approval(tool.requires_approval, name, settings.CC_TOOL_AUTO_APPROVE) and not self.approve(
            name, arguments
        ):
            return {
                "ok": False,
                "error": f"{name} requires approval and this call was not approved; it did not run.",
                "approval_required": True,
            }
        return tool.call(arguments, self.context)


def builtin_records() -> list[ToolRecord]:
    """The built-in tools as resident records: what a fresh installation with an empty catalog offers."""
    return [
        ToolRecord(
            name=t.name,
            group=t.group or "Files and shell",
            description=t.description,
            input_schema=t.input_schema,
            resident=True,
            requires_approval=t.requires_approval,
            side_effects=t.side_effects,
        )
        for t in BUILTINS.values()
    ]


def builtin_names() -> frozenset[str]:
    """Tools this installation implements itself; imported entries with these names are built-ins."""
    return frozenset(BUILTINS)
