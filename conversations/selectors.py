from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery, TextField
from django.db.models.functions import Cast

from agents.models import Run
from controlcenter.errors import DomainError, NotFound
from conversations import export
from conversations.models import Checkpoint, Compaction, Conversation, Message, RewindDigest

PREVIEW_CHARS = 160


def conversations_for_user(*, user: AbstractBaseUser, search: str = "") -> QuerySet[Conversation]:
    # Newest first, ties broken by id so that pages never overlap or skip.
    queryset = Conversation.objects.filter(owner=user).order_by("-updated_at", "-id")
    if search:
        queryset = queryset.filter(title__icontains=search)
    return queryset


def conversation_for_user(*, user: AbstractBaseUser, conversation_id: int) -> Conversation:
    """The conversation if `user` owns it; another user's answers exactly like a missing one."""
    try:
        return Conversation.objects.get(pk=conversation_id, owner=user)
    except Conversation.DoesNotExist:
        raise NotFound(f"Conversation {conversation_id} does not exist.") from None


_PATH_SQL = """
WITH RECURSIVE path(id, depth) AS (
    SELECT id, 0 FROM {table} WHERE id = %s AND conversation_id = %s
    UNION ALL
    SELECT m.parent_id, p.depth + 1 FROM {table} m JOIN path p ON m.id = p.id WHERE m.parent_id IS NOT NULL
)
SELECT m.* FROM {table} m JOIN path p ON m.id = p.id ORDER BY p.depth DESC
"""


def path_to(message: Message | None) -> list[Message]:
    """Root-to-`message` path of the tree, oldest first, in one query (a recursive CTE walking up the parents)."""
    if message is None:
        return []
    sql = _PATH_SQL.format(table=Message._meta.db_table)
    return list(Message.objects.raw(sql, [message.pk, message.conversation_id]))


def current_path(conversation: Conversation) -> list[Message]:
    return path_to(conversation.tip)


def history_view(*, tip: Message | None) -> list[dict[str, Any]]:
    """What a request sends for the path to `tip`: the latest compaction view on it, then the messages after.

    Without a compaction this is the path itself. A view is reused until the next pass,
    so the requests of later turns start with the same bytes (CH-2, TD-11).
    """
    path = path_to(tip)
    on_path = {message.pk: index for index, message in enumerate(path)}
    latest = (
        Compaction.objects.filter(conversation_id=tip.conversation_id, tip_id__in=on_path, view__isnull=False)
        .order_by("-id")
        .first()
        if tip is not None
        else None
    )
    later = path[on_path[latest.tip_id] + 1 :] if latest else path
    return [*(latest.view if latest else []), *({"role": m.role, "content": m.content} for m in later)]


def message_in_conversation(*, conversation: Conversation, message_id: int) -> Message:
    """A message of this conversation; a message elsewhere is bad input, not a lookup miss."""
    message = Message.objects.filter(pk=message_id, conversation=conversation).first()
    if message is None:
        raise DomainError(f"Message {message_id} is not part of conversation {conversation.pk}.")
    return message


def as_plain(message: Message) -> dict[str, Any]:
    """The message as the pure core takes it: Anthropic shape plus its database id."""
    return {"id": message.pk, "role": message.role, "content": message.content}


def path_messages(conversation: Conversation) -> list[dict[str, Any]]:
    return [as_plain(message) for message in current_path(conversation)]


def message_tree(*, conversation: Conversation) -> dict[str, Any]:
    """Every message with its parent and children, and which ones the current path holds (CH-7)."""
    rows = list(Message.objects.filter(conversation=conversation).values("id", "parent_id", "role", "content"))
    by_id = {row["id"]: row for row in rows}
    children: dict[int | None, list[int]] = {}
    for row in rows:
        children.setdefault(row["parent_id"], []).append(row["id"])
    on_path = set()
    current = conversation.tip_id
    while current is not None:
        on_path.add(current)
        current = by_id[current]["parent_id"] if current in by_id else None
    return {
        "conversation": conversation.pk,
        "tip": conversation.tip_id,
        "roots": children.get(None, []),
        "messages": [
            {
                "id": row["id"],
                "parent": row["parent_id"],
                "role": row["role"],
                "preview": _preview(row["content"]),
                "children": children.get(row["id"], []),
                "on_path": row["id"] in on_path,
            }
            for row in rows
        ],
    }


def _preview(content: list[dict[str, Any]]) -> str:
    parts = []
    for block in content or []:
        kind = block.get("type")
        if kind == "text":
            parts.append(block.get("text", ""))
        elif kind == "tool_use":
            parts.append(f"[tool call {block.get('name')}]")
        elif kind == "tool_result":
            parts.append("[tool result]")
        else:
            parts.append(f"[{kind}]")
    return " ".join(parts)[:PREVIEW_CHARS]


def checkpoints_for(*, conversation: Conversation) -> QuerySet[Checkpoint]:
    return Checkpoint.objects.filter(conversation=conversation)


def rewinds_for(*, conversation: Conversation) -> QuerySet[RewindDigest]:
    return RewindDigest.objects.filter(conversation=conversation)


def compactions_for(*, conversation: Conversation) -> QuerySet[Compaction]:
    return Compaction.objects.filter(conversation=conversation)


def conversation_export(*, conversation: Conversation, kind: str) -> dict[str, Any] | str:
    meta = {
        "id": conversation.pk,
        "title": conversation.title,
        "tip": conversation.tip_id,
        "forked_from": conversation.forked_from_id,
    }
    messages = path_messages(conversation)
    if kind == "json":
        return export.export_json(meta, messages)
    if kind in ("markdown", "md"):
        return export.export_markdown(meta, messages)
    raise DomainError(f"Unknown export format {kind!r}; use 'json' or 'markdown'.")


def conversation_context(*, conversation: Conversation) -> dict[str, Any]:
    """The Context view (TD-15, CH-10 /context): what the next request of this conversation holds.

    The one composition of the window: the page, `GET /api/conversations/<id>/context`
    and the `/context` command all call it. The request is built with the parts a run
    uses (`agents.services.run_execute`): the system prompt plus the deferred-name index
    as system blocks, the catalog surface (mode filter, then deferral) wrapped by the
    scratchpad's turn toolbox for the tool block, and the stored path after the runtime's
    pruning of stale tool output. The turn is the conversation's latest run, so its live
    scratchpad entries are the ones `scratchpad_read` would be offered for.
    """
    # Imported here: agents.services and toolcatalog.selectors import this module.
    from agents.runtime.request import ModelRequestSpec
    from agents.services import turn_pruned, turn_system, turn_toolboxes
    from scratchpad.selectors import entries_visible_to_turn
    from toolcatalog.selectors import surface_context

    latest_run = Run.objects.filter(conversation=conversation).order_by("-id").first()
    turn_id = latest_run.pk if latest_run else 0
    # The very functions run_execute builds its requests with (TD-15).
    catalog, toolbox = turn_toolboxes(run_id=turn_id, conversation_id=conversation.pk)
    pruning = turn_pruned(history_view(tip=conversation.tip))
    request = ModelRequestSpec(
        model=latest_run.model if latest_run else settings.CC_MODEL,
        system=turn_system(catalog),
        tools=toolbox.schemas(),
        messages=pruning.messages,
    )
    view = export.context_breakdown(
        request, window_tokens=settings.CC_CONTEXT_WINDOW_TOKENS, tool_index_text=catalog.surface.index_text
    )
    entries = entries_visible_to_turn(turn_id=str(turn_id), conversation_id=conversation.pk).order_by("created_at")
    resident_names = {tool.name for tool in catalog.surface.resident}
    return {
        "conversation": conversation.pk,
        "model": request.model,
        **view,
        "tools": surface_context(catalog.surface),
        # Offered beyond the resident set in this request (scratchpad_read while entries are live).
        "extra_tools": [schema["name"] for schema in request.tools if schema["name"] not in resident_names],
        "pruned": {"results": pruning.results_pruned, "tokens_freed": pruning.tokens_freed},
        "turn": {"run": latest_run.pk if latest_run else None, "status": latest_run.status if latest_run else None},
        "scratchpad": [
            {
                "id": entry.pk,
                "tool": entry.executor_name,
                "step": entry.step_num,
                "kind": entry.kind,
                "size_bytes": entry.size_bytes,
                "lines": entry.line_count,
                "pinned": entry.pinned,
                "summary": entry.summary,
                "expires_at": entry.expires_at.isoformat(),
            }
            for entry in entries
        ],
    }


def conversations_with_activity(*, user: AbstractBaseUser, search: str = "") -> QuerySet[Conversation]:
    """The user's conversations, most recently active first, each with its message count and
    its latest run; `search` matches titles and the text of the user's own messages."""
    latest_run = Run.objects.filter(conversation=OuterRef("pk")).order_by("-id")
    queryset = Conversation.objects.filter(owner=user)
    if search:
        # The stored JSON as text: portable across PostgreSQL and SQLite, and a person's
        # conversations are few enough that a scan is fine.
        matching = (
            Message.objects.filter(conversation__owner=user, role=Message.Role.USER)
            .annotate(as_text=Cast("content", TextField()))
            .filter(as_text__icontains=search)
            .values("conversation_id")
        )
        queryset = queryset.filter(Q(title__icontains=search) | Q(pk__in=matching))
    return queryset.annotate(
        message_count=Count("messages"),
        last_run_id=Subquery(latest_run.values("id")[:1]),
        last_run_status=Subquery(latest_run.values("status")[:1]),
    ).order_by("-updated_at")


def tree_rows(*, conversation: Conversation) -> list[dict[str, Any]]:
    """The message tree as the navigator draws it: depth-first, one row per message (CH-7).

    A chain of single children stays at one level; each fork indents its branches, so a
    1,000-message conversation with two branches is two columns deep, not a thousand.
    Rows say whether the tip may move there (not an assistant message that stops on a tool
    call) and whether the message is a prompt that can be edited and re-run.
    """
    rows = list(
        Message.objects.filter(conversation=conversation).values("id", "parent_id", "role", "content").order_by("id")
    )
    children: dict[int | None, list[dict[str, Any]]] = {}
    for row in rows:
        children.setdefault(row["parent_id"], []).append(row)
    by_id = {row["id"]: row for row in rows}
    on_path = set()
    current = conversation.tip_id
    while current is not None and current in by_id:
        on_path.add(current)
        current = by_id[current]["parent_id"]
    labels: dict[int, list[str]] = {}
    for message_id, label in Checkpoint.objects.filter(conversation=conversation).values_list("message_id", "label"):
        labels.setdefault(message_id, []).append(label)
    out: list[dict[str, Any]] = []
    # Iterative, so depth is bounded by memory, not by Python's recursion limit.
    stack: list[tuple[dict[str, Any], int, bool]] = [(row, 0, False) for row in reversed(children.get(None, []))]
    if len(children.get(None, [])) > 1:
        stack = [(row, 1, True) for row in reversed(children[None])]
    while stack:
        row, level, branch_start = stack.pop()
        content = row["content"] or []
        kids = children.get(row["id"], [])
        kinds = {block.get("type") for block in content}
        out.append(
            {
                "id": row["id"],
                "parent": row["parent_id"],
                "role": row["role"],
                "preview": _preview(content) or "(empty)",
                "level": level,
                "branch_start": branch_start,
                "children": len(kids),
                "on_path": row["id"] in on_path,
                "tip": row["id"] == conversation.tip_id,
                "checkpoints": labels.get(row["id"], []),
                "branchable": "tool_use" not in kinds,
                "editable": row["role"] == Message.Role.USER and "tool_result" not in kinds,
                "text": "\n".join(b.get("text", "") for b in content if b.get("type") == "text")
                if row["role"] == Message.Role.USER
                else "",
            }
        )
        if len(kids) == 1:
            stack.append((kids[0], level, False))
        else:
            stack.extend((kid, level + 1, True) for kid in reversed(kids))
    return out
