from __future__ import annotations

import dataclasses
import gc
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, NamedTuple

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import QuerySet

from controlcenter.errors import DomainError, NotFound
from conversations import export
from conversations.models import Checkpoint, Compaction, Conversation, Message, RewindDigest
from engine.context import treeview
from engine.request import text_block

PREVIEW_CHARS = 160


def conversations_for_user(*, user: User, search: str = "") -> QuerySet[Conversation]:
    # Newest first, ties broken by id so that pages never overlap or skip.
    queryset = Conversation.objects.filter(owner=user).order_by("-updated_at", "-id")
    if search:
        queryset = queryset.filter(title__icontains=search)
    return queryset


def models_offered() -> list[dict[str, Any]]:
    """The model picker's choices: CC_MODELS, the server default (CC_MODEL) first."""
    return [
        {"name": name, "provider": provider, "default": name == settings.CC_MODEL}
        for name, provider in settings.CC_MODELS.items()
    ]


def conversation_for_user(*, user: User, conversation_id: int) -> Conversation:
    """The conversation if `user` owns it; another user's answers exactly like a missing one."""
    try:
        return Conversation.objects.get(pk=conversation_id, owner=user)
    except Conversation.DoesNotExist:
        raise NotFound(f"Conversation {conversation_id} does not exist.") from None


class PathMessage(NamedTuple):
    """A message of a path as plain data: what the runtime, the API, export and fork read.

    A 10,000-message path is one query and one JSON decode; building model instances
    for it cost several times more, and nothing on a path needs their behaviour. A tuple,
    because building one from a decoded row is a single C call.
    """

    id: int
    parent_id: int | None
    role: str
    content: list[dict[str, Any]]
    created_at: str  # ISO 8601, UTC

    @property
    def pk(self) -> int:
        # Read like a Message's, so templates written against model instances keep working.
        return self.id


# Walks up the parents carrying each row's columns, so every level is one index lookup.
_PATH_CTE = """
WITH RECURSIVE path(id, parent_id, role, content, created_at, depth) AS (
    SELECT id, parent_id, role, content, created_at, 0 FROM {table} WHERE id = %s AND conversation_id = %s
    UNION ALL
    SELECT m.id, m.parent_id, m.role, m.content, m.created_at, p.depth + 1
    FROM {table} m JOIN path p ON m.id = p.parent_id
)
"""
# The database builds the path as one JSON array of [id, parent, role, content, created_at],
# oldest first, so Python decodes one string instead of 10,000 rows of JSON and timestamps.
_PATH_AGGREGATE = {
    "postgresql": "SELECT json_agg(json_build_array(id, parent_id, role, content, created_at)"
    " ORDER BY depth DESC)::text FROM path",
    # SQLite 3.40 has no ORDER BY inside an aggregate; it aggregates an ordered subquery in that order.
    "sqlite": "SELECT json_group_array(json_array(id, parent_id, role, json(content),"
    " replace(created_at, ' ', 'T') || '+00:00')) FROM (SELECT * FROM path ORDER BY depth DESC)",
}


def path_to(*, conversation_id: int, tip_id: int | None) -> list[PathMessage]:
    """Root-to-tip path of the tree, oldest first: the one way a path is loaded (CH-7).

    One query (a recursive CTE walking up the parents, aggregated to one JSON array by
    the database); empty when there is no tip or it is not in this conversation.
    """
    if tip_id is None:
        return []
    sql = _PATH_CTE.format(table=Message._meta.db_table) + _PATH_AGGREGATE[connection.vendor]
    with connection.cursor() as cursor:
        cursor.execute(sql, [tip_id, conversation_id])
        (aggregate,) = cursor.fetchone()
    if not aggregate:
        return []
    with _no_collection():
        return list(map(PathMessage._make, json.loads(aggregate)))


@contextmanager
def _no_collection() -> Iterator[None]:
    """The cyclic garbage collector paused while a path is decoded.

    Decoding 10,000 messages allocates ~40,000 containers, enough to set off full
    collections that scan every live object of the process: 300-700 ms spikes on every
    few loads in a busy worker. Nothing decoded here is cyclic; reference counting frees it.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def current_path(conversation: Conversation) -> list[PathMessage]:
    return path_to(conversation_id=conversation.pk, tip_id=conversation.tip_id)


def history_view(*, conversation_id: int, tip_id: int | None) -> list[dict[str, Any]]:
    """What a request sends for the path to the tip: the latest compaction view on it, then the messages after.

    Without a compaction this is the path itself, with the rewind notes in place (CH-9).
    A view is reused until the next pass, so the requests of later turns start with the
    same bytes (CH-2, TD-11).
    """
    return view_of_path(conversation_id=conversation_id, path=path_to(conversation_id=conversation_id, tip_id=tip_id))


def view_of_path(*, conversation_id: int, path: list[PathMessage]) -> list[dict[str, Any]]:
    on_path = {message.id: index for index, message in enumerate(path)}
    # A conversation has few compactions; matching their tips here avoids an IN list of the whole path.
    candidates = Compaction.objects.filter(conversation_id=conversation_id, view__isnull=False).order_by("-id")
    latest = next((pk for pk, tip in candidates.values_list("pk", "tip_id") if tip in on_path), None) if path else None
    compaction = Compaction.objects.only("tip_id", "view").get(pk=latest) if latest is not None else None
    # The stubs see neither that the compaction was picked for its tip on the path nor its view__isnull=False.
    start = on_path[compaction.tip_id] + 1 if compaction else 0  # type: ignore[index]
    later = path[start:]
    # Notes before the compaction's tip are inside its view (it was built from this same
    # history); the tip itself may be the checkpoint the first later prompt follows.
    notes = rewind_notes(conversation_id=conversation_id, path=path[max(0, start - 1) :])
    with _no_collection():
        return [*(compaction.view if compaction else []), *(_sendable(m, notes.get(m.id)) for m in later)]  # type: ignore[misc]


def _sendable(message: PathMessage, notes: list[str] | None) -> dict[str, Any]:
    if not notes:
        return {"role": message.role, "content": message.content}
    return {"role": message.role, "content": [*(text_block(note) for note in notes), *message.content]}


def rewind_notes(*, conversation_id: int, path: list[PathMessage]) -> dict[int, list[str]]:
    """The rewind notes of a path (CH-9), by the id of the message that carries them.

    A prompt written under a checkpoint after a rewind to it carries the digest of every
    exploration rewound there before it was written. It goes in front of that prompt, after
    the checkpoint: every earlier message stays byte for byte what earlier requests sent,
    and later turns send the same note at the same place, so the prompt cache only grows.
    The explored path itself (written before the rewind) carries none.
    """
    notes: dict[int, list[str]] = {}
    for carrier, record in rewinds_on_path(conversation_id=conversation_id, path=path):
        notes.setdefault(carrier, []).append(export.rewind_note(record.label, record.digest))
    return notes


def rewinds_on_path(*, conversation_id: int, path: list[PathMessage]) -> list[tuple[int, RewindDigest]]:
    """The rewind records whose notes the path carries, oldest first, each with its carrier's id (CH-9)."""
    if len(path) < 2:
        return []
    following = {parent.id: child for parent, child in zip(path, path[1:], strict=False)}
    carried = []
    # A conversation has few rewinds: all of them, rather than an IN list of the whole path.
    for record in RewindDigest.objects.filter(conversation_id=conversation_id).order_by("id"):
        child = following.get(record.target_id)
        if child is not None and record.created_at <= datetime.fromisoformat(child.created_at):
            carried.append((child.id, record))
    return carried


def message_in_conversation(*, conversation: Conversation, message_id: int) -> Message:
    """A message of this conversation; one elsewhere (or nowhere) is a 404, as the schema says (UX-8)."""
    message = Message.objects.filter(pk=message_id, conversation=conversation).first()
    if message is None:
        raise NotFound(f"Message {message_id} is not part of conversation {conversation.pk}.")
    return message


def as_plain(message: Message | PathMessage) -> dict[str, Any]:
    """The message as the pure core takes it: Anthropic shape plus its database id."""
    return {"id": message.id, "role": message.role, "content": message.content}


def path_messages(conversation: Conversation) -> list[dict[str, Any]]:
    """The current path as the pure core takes it (ids kept), rewind notes in place: what the ladder compacts."""
    return source_of_path(conversation_id=conversation.pk, path=current_path(conversation))


def source_of_path(*, conversation_id: int, path: list[PathMessage]) -> list[dict[str, Any]]:
    """The stored messages of a path with their ids and rewind notes: every compaction pass starts here (CH-11)."""
    notes = rewind_notes(conversation_id=conversation_id, path=path)
    return [{"id": m.id, **_sendable(m, notes.get(m.id))} for m in path]


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
    path = current_path(conversation)
    notes = rewind_notes(conversation_id=conversation.pk, path=path)
    # The stored content as it is, and the rewind notes the model reads in front of it beside it (CH-9).
    messages = [{**as_plain(m), **({"rewind_notes": notes[m.id]} if m.id in notes else {})} for m in path]
    if kind == "json":
        return export.export_json(meta, messages)
    if kind in ("markdown", "md"):
        return export.export_markdown(meta, messages)
    raise DomainError(f"Unknown export format {kind!r}; use 'json' or 'markdown'.")


def tree_window(*, conversation: Conversation) -> dict[str, Any]:
    """The tree navigator's page (CH-7): the path around the tip, small branches beside it, folds for
    the rest (`engine.context.treeview`), so the page stays small however long the conversation is."""
    tree = _tree_layout(conversation)
    items = treeview.window(tree)
    return {"items": _tree_items(conversation, tree, items), "total": len(tree.order), "on_path": tree.on_path}


def tree_slice(*, conversation: Conversation, first: int, count: int, keep: str) -> list[dict[str, Any]]:
    """The rows of one fold of the navigator (`count` messages from `first` in its order), opened on demand."""
    tree = _tree_layout(conversation)
    if first not in tree.index:
        raise NotFound(f"Message {first} is not part of conversation {conversation.pk}.")
    if count < 1 or keep not in ("start", "end"):
        raise DomainError("A fold is opened with count >= 1 and keep 'start' or 'end'.")
    return _tree_items(conversation, tree, treeview.expand(tree, first, count, keep))  # type: ignore[arg-type]


def _tree_layout(conversation: Conversation) -> treeview.Layout:
    # Ids and parents only: cheap for 10,000 messages; content is read for the drawn rows alone.
    structure: list[tuple[int, int | None]] = list(
        Message.objects.filter(conversation=conversation).order_by("id").values_list("id", "parent_id")
    )
    return treeview.layout(structure, conversation.tip_id)


def _tree_items(
    conversation: Conversation, tree: treeview.Layout, items: list[treeview.Row | treeview.Fold]
) -> list[dict[str, Any]]:
    """Rows as the navigator draws them, and folds with what they hold. Rows say whether the tip may
    move there (not an assistant message that stops on a tool call) and whether the message is a
    prompt that can be edited and re-run."""
    ids = [item.id for item in items if isinstance(item, treeview.Row)]
    messages = {row["id"]: row for row in Message.objects.filter(pk__in=ids).values("id", "role", "content")}
    labels: dict[int, list[str]] = {}
    for message_id, label in Checkpoint.objects.filter(conversation=conversation, message_id__in=ids).values_list(
        "message_id", "label"
    ):
        labels.setdefault(message_id, []).append(label)
    out: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, treeview.Fold):
            out.append({"fold": True, **dataclasses.asdict(item)})
            continue
        message_id = item.id
        row = messages[message_id]
        content = row["content"] or []
        kinds = {block.get("type") for block in content}
        out.append(
            {
                "fold": False,
                "id": message_id,
                "parent": tree.parent[message_id],
                "role": row["role"],
                "preview": _preview(content) or "(empty)",
                "level": tree.level[message_id],
                "branch_start": tree.branch_start[message_id],
                "children": tree.children[message_id],
                "on_path": message_id in tree.on_path,
                "tip": message_id == tree.tip,
                "checkpoints": labels.get(message_id, []),
                "branchable": "tool_use" not in kinds,
                "editable": row["role"] == Message.Role.USER and "tool_result" not in kinds,
                "text": "\n".join(b.get("text", "") for b in content if b.get("type") == "text")
                if row["role"] == Message.Role.USER
                else "",
            }
        )
    return out
