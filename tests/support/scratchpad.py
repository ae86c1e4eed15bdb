"""Helpers shared by the scratchpad tests: a scripted provider, test-only tools, runs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agents.models import Run
from engine.actions import result_text
from engine.providers.protocol import MessageDone, ProviderEvent, TextDelta, ToolUseBlock, Usage
from engine.request import ModelRequestSpec
from engine.toolbox import ToolBoxLayer
from tests.support.factories import RunFactory
from toolcatalog.builtins import WorkspaceToolBox

Step = Callable[[ModelRequestSpec], list[dict[str, Any]]] | list[dict[str, Any]]


class ScriptedProvider:
    """Follows the Provider protocol; each request is answered by the next step of a script."""

    name = "scripted"

    def __init__(self, script: list[Step]) -> None:
        self.script = list(script)
        self.requests: list[ModelRequestSpec] = []

    def stream(self, request: ModelRequestSpec) -> Iterator[ProviderEvent]:
        self.requests.append(request)
        step = self.script.pop(0)
        content = step(request) if callable(step) else step
        for block in content:
            if block["type"] == "text":
                yield TextDelta(block["text"])
            elif block["type"] == "tool_use":
                yield ToolUseBlock(block["id"], block["name"], block["input"])
        uses_tools = any(block["type"] == "tool_use" for block in content)
        yield MessageDone(content=content, stop_reason="tool_use" if uses_tools else "end_turn", usage=Usage())


def tool_use(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def say(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


def last_results(request: ModelRequestSpec) -> list[dict[str, Any]]:
    """The observations the model sees in the last tool_result message, parsed."""
    return [
        json.loads(result_text(block)) for block in request.messages[-1]["content"] if block["type"] == "tool_result"
    ]


def _inside(root: Path, relative: str) -> Path:
    target = (root / relative).resolve()
    assert target.is_relative_to(root.resolve()), f"{relative!r} is outside the test's workspace"
    return target


def _read_file(arguments: dict[str, Any], root: Path) -> dict[str, Any]:
    target = _inside(root, arguments["path"])
    data = target.read_bytes()
    return {"ok": True, "path": arguments["path"], "bytes": len(data), "encoding": "utf-8", "content": data.decode()}


def _fetch(arguments: dict[str, Any], root: Path) -> dict[str, Any]:
    # The "network" is a file the test prepared: the body arrives as text, like an HTTP body.
    body = (root / "_served" / arguments["url"].rsplit("/", 1)[-1]).read_bytes().decode("utf-8")
    return {"ok": True, "url": arguments["url"], "status": 200, "content_type": "application/json", "content": body}


def _write_file(arguments: dict[str, Any], root: Path) -> dict[str, Any]:
    target = _inside(root, arguments["path"])
    content = arguments["content"]
    data = content if isinstance(content, bytes) else content.encode("utf-8")
    target.write_bytes(data)
    return {"ok": True, "path": arguments["path"], "bytes": len(data)}


def _schema(*props: str) -> dict[str, Any]:
    return {"type": "object", "properties": {prop: {"type": "string"} for prop in props}}


# name -> (description, input schema, function of (arguments, workspace root)).
TEST_TOOLS = {
    "read_file": ("Read a workspace file.", _schema("path"), _read_file),
    "fetch": ("GET a URL.", _schema("url"), _fetch),
    "write_file": ("Write a file.", _schema("path", "content"), _write_file),
}


class ScratchTools(ToolBoxLayer):
    """A ToolBox: the small test tools above in front of the real workspace built-ins (list_dir…)."""

    def __init__(self, root: Path) -> None:
        self.workspace = WorkspaceToolBox(root)
        super().__init__(self.workspace)
        self.root = root

    def schemas(self) -> list[dict[str, Any]]:
        own = [
            {"name": name, "description": description, "input_schema": schema}
            for name, (description, schema, _run) in TEST_TOOLS.items()
        ]
        builtin = [schema for schema in self.workspace.schemas() if schema["name"] not in TEST_TOOLS]
        return sorted(own + builtin, key=lambda schema: schema["name"])

    def execute(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if name in TEST_TOOLS:
            return TEST_TOOLS[name][2](arguments, self.root)
        return self.workspace.execute(name, arguments)

    def execute_step(self, step: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.execute(name, arguments)


def tools_in(root: Path) -> ScratchTools:
    return ScratchTools(root)


def make_run(owner: Any, text: str = "hello", status: str = Run.Status.RUNNING) -> Run:
    return RunFactory(
        conversation__owner=owner, conversation__title="t", trigger__text=text, trigger__as_tip=True, status=status
    )


def next_run(run: Run, text: str = "again") -> Run:
    """A later turn of the same conversation."""
    return RunFactory(conversation=run.conversation, trigger__parent=None, trigger__text=text, status=run.status)


def server_log(lines: int, *, errors_at_end: int = 0) -> str:
    out = [
        f"2026-12-02T10:{(i // 60) % 60:02d}:{i % 60:02d}Z INFO  [web.request] GET /api/v1/orders/{i % 977} "
        f"200 {i % 311}ms user={i % 4001}\n"
        for i in range(lines)
    ]
    out += [
        f"2026-12-02T23:59:{50 + i:02d}Z ERROR [db.pool] connection refused (attempt {i + 1})\n"
        for i in range(errors_at_end)
    ]
    return "".join(out)
