"""Shared test data for the tool-catalog tests: the reference catalog and a scripted model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.catalog.surface import ToolRecord
from engine.providers.protocol import MessageDone, ProviderEvent, ToolUseBlock, Usage
from engine.request import ModelRequestSpec
from toolcatalog.catalogfile import records_from_catalog

# A copy of shared/data/toolcatalog.json, so the tests do not depend on where shared/ is.
CATALOG_PATH = Path(__file__).resolve().parent.parent / "data" / "toolcatalog.json"


def reference_catalog() -> dict[str, Any]:
    return json.loads(CATALOG_PATH.read_text(encoding="utf-8"))


def reference_records() -> list[ToolRecord]:
    return records_from_catalog(reference_catalog())


class ScriptedModel:
    """A model that plays a fixed list of replies and keeps every request it was sent."""

    name = "scripted"

    def __init__(self, replies: list[list[dict[str, Any]]]) -> None:
        self.replies = list(replies)
        self.requests: list[ModelRequestSpec] = []

    def stream(self, request: ModelRequestSpec) -> Iterator[ProviderEvent]:
        self.requests.append(request)
        content = self.replies.pop(0)
        for block in content:
            if block["type"] == "tool_use":
                yield ToolUseBlock(id=block["id"], name=block["name"], input=block["input"])
        has_tools = any(block["type"] == "tool_use" for block in content)
        yield MessageDone(content=content, stop_reason="tool_use" if has_tools else "end_turn", usage=Usage(1, 0, 0, 1))


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "tool_use", "id": call_id, "name": name, "input": arguments}]


def final(text: str = "done") -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]
