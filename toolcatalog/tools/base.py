"""What every built-in tool shares: its definition, its context, and how it is called.

A tool is a plain function `(arguments, context) -> observation`. `BuiltinTool.call`
validates the arguments against the tool's JSON schema first and turns anything the
function raises into an observation, so the runtime and the MCP endpoint only ever
see `{"ok": false, "error": "..."}` for a failure, never an exception (RN-5).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from engine.catalog.schemas import arguments_problem
from toolcatalog.workspace import Located, PathEscapesWorkspace, locate

logger = logging.getLogger(__name__)

Observation = dict[str, Any]
DEFINITIONS_FILE = Path(__file__).with_name("definitions.json")


class ToolFailure(Exception):
    """Raised inside a tool for a failure the caller caused; becomes an error observation."""


def fail(message: str, **extra: Any) -> Observation:
    return {"ok": False, "error": message, **extra}


@dataclass
class ToolContext:
    """Where a tool runs: the workspace root, and whose conversation (or MCP user) it serves.

    `cancel_key` names the turn whose cancel kills this context's sandboxes (a run, or one
    child of it): a parent and its children share a conversation, and cancelling one child must
    not kill its siblings' or its parent's commands.
    """

    root: Path
    conversation_id: int | None = None
    user_id: int | None = None
    cancel_key: Hashable | None = None

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()

    @property
    def sandbox_key(self) -> Hashable:
        if self.cancel_key is not None:
            return self.cancel_key
        return self.conversation_id if self.conversation_id is not None else ("user", self.user_id)

    def located(self, relative: str, *, what: str = "path", make_parents: bool = False) -> Located:
        """`relative` resolved without following a link out (see toolcatalog.workspace), or
        ToolFailure naming why not; use it in a `with` block, which closes its directories."""
        if not isinstance(relative, str) or relative == "":
            raise ToolFailure(f"{what} must be a non-empty workspace-relative path.")
        if "\x00" in relative:
            raise ToolFailure(f"{what} contains a NUL byte.")
        try:
            return locate(self.root, relative, make_parents=make_parents)
        except PathEscapesWorkspace as exc:
            raise ToolFailure(str(exc)) from exc
        except FileNotFoundError:
            raise ToolFailure(f"{relative!r} does not exist in the workspace.") from None
        except NotADirectoryError:
            raise ToolFailure(f"{relative!r} goes through something that is not a directory.") from None

    def owner_id(self) -> int:
        """The user whose memories and task list this call touches (the toolbox builder sets it)."""
        if self.user_id is None:
            raise ToolFailure("This tool needs a conversation or a user; the toolbox was built with neither.")
        return self.user_id


ToolFunction = Callable[[dict[str, Any], ToolContext], Observation]


@dataclass(frozen=True)
class BuiltinTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    run: ToolFunction
    group: str = ""
    resident: bool = False
    requires_approval: bool = False
    side_effects: str = "none"

    def definition(self) -> dict[str, Any]:
        """The schema offered to a model (provider-neutral: name, description, input_schema)."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}

    def catalog_record(self) -> dict[str, Any]:
        """The tool in the format of shared/data/toolcatalog.json, approval flag included."""
        return {
            **self.definition(),
            "group": self.group,
            "resident": self.resident,
            "requires_approval": self.requires_approval,
            "side_effects": self.side_effects,
        }

    def validation_error(self, arguments: Any) -> str | None:
        if not isinstance(arguments, dict):
            return f"{self.name} takes an object of arguments, got {type(arguments).__name__}."
        problem = arguments_problem(self.input_schema, arguments)
        return f"Invalid arguments for {self.name}: {problem}" if problem else None

    def call(self, arguments: Any, context: ToolContext | Path) -> Observation:
        """Validate, run, and turn every failure into an observation."""
        if not isinstance(context, ToolContext):
            context = ToolContext(root=Path(context))
        problem = self.validation_error(arguments)
        if problem:
            return fail(problem)
        try:
            return self.run(arguments, context)
        except ToolFailure as exc:
            return fail(str(exc))
        except Exception as exc:
            logger.exception("built-in tool %s failed", self.name)
            return fail(f"{self.name} failed unexpectedly: {type(exc).__name__}: {exc}")


@cache
def reference_definitions() -> dict[str, dict[str, Any]]:
    """Names, groups, descriptions and schemas copied from the reference catalog."""
    data = json.loads(DEFINITIONS_FILE.read_text(encoding="utf-8"))
    return {tool["name"]: tool for tool in data["tools"]}


def builtin(name: str, run: ToolFunction) -> BuiltinTool:
    """A BuiltinTool whose definition comes from the reference catalog entry of `name`."""
    spec = reference_definitions()[name]
    return BuiltinTool(
        name=name,
        description=spec["description"],
        input_schema=spec["input_schema"],
        run=run,
        group=spec.get("group", ""),
        resident=bool(spec.get("resident", False)),
        requires_approval=bool(spec.get("requires_approval", False)),
        side_effects=spec.get("side_effects", "none"),
    )
