"""Factories for conversation-history tests: whole turns written the way a run persists them."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from conversations.models import Conversation, Message

_ids = itertools.count(1)


def add_turn(
    conversation: Conversation,
    prompt: str,
    answer: str,
    *,
    tools: list[tuple[str, Any]] | tuple = (),
    error: bool = False,
) -> list[Message]:
    """Append a finished turn under the tip (prompt, tool rounds, answer) and move the tip, like _persist_turn."""
    conversation.refresh_from_db()
    created = []
    parent = conversation.tip

    def add(role: str, content: list[dict[str, Any]]) -> Message:
        nonlocal parent
        parent = Message.objects.create(conversation=conversation, parent=parent, role=role, content=content)
        created.append(parent)
        return parent

    add("user", [{"type": "text", "text": prompt}])
    for name, output in tools:
        call_id = f"toolu_test_{next(_ids)}"
        add("assistant", [{"type": "text", "text": f"Calling {name}."}, _use(call_id, name)])
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
        result["content"] = output if isinstance(output, str | list) else json.dumps(output)
        if error:
            result["is_error"] = True
        add("user", [result])
    add("assistant", [{"type": "text", "text": answer}])
    Conversation.objects.filter(pk=conversation.pk).update(tip=parent)
    conversation.refresh_from_db()
    return created


def _use(call_id: str, name: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": {"path": "."}}


@pytest.fixture
def conversation(alice) -> Conversation:
    return Conversation.objects.create(owner=alice, title="History")


@pytest.fixture
def explored(conversation) -> Conversation:
    """Two finished turns, the second with a tool call."""
    add_turn(conversation, "Plan the migration; keep the API stable.", "Here is the plan.")
    add_turn(conversation, "List the files.", "There are three files.", tools=[("list_dir", {"entries": ["a", "b"]})])
    return conversation
