"""Built-in tool implementations, run inside a conversation's workspace.

Each tool takes its validated arguments and the workspace root and returns an
observation dict; a failure is an observation with `ok: false` and an `error`
that says what was wrong, never an exception that reaches the runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolcatalog.workspace import PathEscapesWorkspace, resolve_inside

Observation = dict[str, Any]


@dataclass(frozen=True)
class BuiltinTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    run: Callable[[dict[str, Any], Path], Observation]

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}


def _list_dir(arguments: dict[str, Any], root: Path) -> Observation:
    relative = arguments.get("path", ".")
    if not isinstance(relative, str):
        return {"ok": False, "error": "path must be a string."}
    try:
        target = resolve_inside(root, relative)
    except PathEscapesWorkspace as exc:
        return {"ok": False, "error": str(exc)}
    if not target.is_dir():
        return {"ok": False, "error": f"{relative!r} is not a directory in the workspace."}
    entries = [
        {
            "name": child.name,
            "type": "dir" if child.is_dir() else "file",
            "size": child.stat().st_size if child.is_file() else None,
        }
        for child in sorted(target.iterdir(), key=lambda p: p.name)
    ]
    return {"ok": True, "path": relative, "entries": entries}


BUILTINS: dict[str, BuiltinTool] = {
    tool.name: tool
    for tool in [
        BuiltinTool(
            name="list_dir",
            description="List the entries of a directory in the conversation workspace, with their type and size.",
            input_schema={
                "type": "object",
                "properties": {"path": {"type": "string", "description": "Workspace-relative directory. Default '.'."}},
            },
            run=_list_dir,
        ),
    ]
}


class WorkspaceToolBox:
    """The runtime's ToolBox over the built-in tools of one conversation workspace."""

    def __init__(self, root: Path, tools: dict[str, BuiltinTool] | None = None) -> None:
        self.root = root
        self.tools = BUILTINS if tools is None else tools

    def schemas(self) -> list[dict[str, Any]]:
        return [self.tools[name].definition() for name in sorted(self.tools)]

    def execute(self, name: str, arguments: dict[str, Any]) -> Observation:
        tool = self.tools.get(name)
        if tool is None:
            return {"ok": False, "error": f"There is no tool named {name!r} in this run."}
        return tool.run(arguments, self.root)
