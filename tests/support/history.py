"""Building message trees in tests: one turn (prompt, tool calls, their results, an answer) at a time."""

from __future__ import annotations

import itertools
import json
from typing import Any

from conversations.models import Conversation, Message
from tests.support.factories import MessageFactory

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
        parent = MessageFactory(conversation=conversation, parent=parent, role=role, content=content)
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
