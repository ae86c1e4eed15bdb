"""The task list: todo_add, todo_update, todo_list, one list per conversation.

Outside a conversation (the MCP endpoint) the list belongs to the user's MCP workspace.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from toolcatalog.models import TodoItem
from toolcatalog.tools.base import Observation, ToolContext, ToolFailure, builtin


def task_list(context: ToolContext) -> QuerySet[TodoItem]:
    # None matches the items kept outside a conversation (IS NULL); the stubs allow no None in a lookup.
    return TodoItem.objects.filter(owner_id=context.owner_id(), conversation_id=context.conversation_id)  # type: ignore[misc]


def _item(item: TodoItem) -> dict[str, Any]:
    return {"id": str(item.pk), "content": item.content, "status": item.status, "priority": item.priority}


def _listing(context: ToolContext, status: str = "all") -> Observation:
    items = task_list(context)
    if status != "all":
        items = items.filter(status=status)
    listed = [_item(item) for item in items]
    observation: Observation = {"ok": True, "count": len(listed), "items": listed}
    in_progress = task_list(context).filter(status=TodoItem.Status.IN_PROGRESS).count()
    if in_progress > 1:
        observation["_note"] = f"{in_progress} items are in_progress; keep exactly one in progress while working."
    return observation


def todo_add(arguments: dict[str, Any], context: ToolContext) -> Observation:
    items = arguments["items"]
    empty = [index for index, item in enumerate(items) if not item["content"].strip()]
    if empty:
        raise ToolFailure(f"items[{empty[0]}].content is empty; say what to do.")
    owner_id = context.owner_id()
    with transaction.atomic():
        created = [
            TodoItem.objects.create(
                owner_id=owner_id,
                conversation_id=context.conversation_id,
                content=item["content"].strip(),
                priority=item.get("priority", TodoItem.Priority.MEDIUM),
            )
            for item in items
        ]
    return {**_listing(context), "added": [str(item.pk) for item in created]}


def todo_update(arguments: dict[str, Any], context: ToolContext) -> Observation:
    if "status" not in arguments and "content" not in arguments:
        raise ToolFailure("Give a new status or new content; todo_update with only an id changes nothing.")
    raw_id = arguments["id"]
    # ASCII digits only ('²'.isdigit() is true, int('²') fails); 18 digits always fit a bigint.
    valid = re.fullmatch(r"[0-9]{1,18}", raw_id.strip()) is not None
    item = task_list(context).filter(pk=int(raw_id)).first() if valid else None
    if item is None:
        raise ToolFailure(f"There is no task-list item {raw_id!r} in this list; todo_list shows the ids.")
    if "content" in arguments:
        if not arguments["content"].strip():
            raise ToolFailure("content is empty; give the new wording.")
        item.content = arguments["content"].strip()
    if "status" in arguments:
        item.status = arguments["status"]
    item.save()
    return {**_listing(context), "updated": _item(item)}


def todo_list(arguments: dict[str, Any], context: ToolContext) -> Observation:
    return _listing(context, arguments.get("status", "all"))


TOOLS = [builtin("todo_add", todo_add), builtin("todo_update", todo_update), builtin("todo_list", todo_list)]
