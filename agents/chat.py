"""What a person does in a conversation that starts runs: send, edit, retry, slash commands (CH-5..CH-10).

The message tree itself is `conversations`; this module adds the run that answers a
prompt, in the same transaction that moves the tip, so a message is never stored
without its run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import BooleanField, Count, F, Func, OuterRef, Q, QuerySet, Subquery

from agents.models import Run
from agents.services import compaction_start, run_start
from agents.turns import context_view
from controlcenter.errors import Conflict, DomainError
from conversations import commands, selectors
from conversations.models import Compaction, Conversation, Message
from conversations.services import (
    check_text,
    checkpoint_create,
    conversation_branch,
    conversation_compact,
    conversation_fork,
    conversation_locked,
    conversation_rewind,
)
from engine.context import ladder, transcript


class NothingToRetry(Conflict):
    code = "nothing_to_retry"


class NothingLoaded(Conflict):
    code = "nothing_loaded"


@dataclass
class CommandResult:
    """What a slash command did, in a shape the API and the UI can show."""

    command: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"command": self.command, "detail": self.detail, "data": self.data}


@dataclass
class MessageSent:
    message: Message | None
    run: Run | None
    command: CommandResult | None = None
    # Said to the person when a leading '/' was not a command and the text went out as a prompt.
    note: str = ""

    def __iter__(self) -> Iterator[Any]:
        # Unpacks as (message, run), so callers written before slash commands keep working.
        return iter((self.message, self.run))


# `message_send(after=...)` left out: the message goes under whatever the tip is.
ANY_TIP = -1


def message_send(*, conversation: Conversation, text: str, after: int | None = ANY_TIP) -> MessageSent:
    """Append a user message under the tip, move the tip, and queue the turn after commit.

    `after` is the tip the sender saw (None: no message yet). If the tip moved to another branch
    since (another tab switched answers), the message is refused with a Conflict rather than stored
    under an answer the sender never saw; a tip that only went on along the same path (the answer
    came after the page drew the conversation) is taken. A message starting with '/' is a slash
    command (CH-10): it runs its service and starts no run; it is not stored as a message.
    """
    check_text(text)
    if commands.is_command(text):
        return MessageSent(None, None, command_run(conversation=conversation, text=text))
    text, note = commands.as_prompt(text)
    with transaction.atomic():
        locked = conversation_locked(conversation)
        if after != ANY_TIP and not _went_on_from(locked, after):
            now = f"message {locked.tip_id}" if locked.tip_id is not None else "no message (it is empty)"
            saw = f"message {after}" if after is not None else "no message"
            raise Conflict(
                f"The conversation moved on since you saw it: its tip is now {now}, not {saw} (another tab or "
                "client switched branches or sent a message). Reload it, then send again."
            )
        message = Message.objects.create(
            conversation=locked,
            parent_id=locked.tip_id,
            role=Message.Role.USER,
            content=[{"type": "text", "text": text}],
        )
        if locked.title == "New conversation" and locked.tip_id is None:
            locked.title = text.strip().splitlines()[0][:80]
        locked.tip = message
        locked.save(update_fields=["tip", "title", "updated_at"])
        run = run_start(conversation=locked, trigger=message)
    conversation.refresh_from_db()
    return MessageSent(message, run, note=note)


def _went_on_from(conversation: Conversation, seen: int | None) -> bool:
    """Whether the tip is `seen` or below it: nothing moved the conversation to another branch."""
    if seen is None or seen == conversation.tip_id:
        return True
    path = selectors.path_to(conversation_id=conversation.pk, tip_id=conversation.tip_id)
    return any(message.id == seen for message in path)


def message_edit(*, conversation: Conversation, message_id: int, text: str) -> MessageSent:
    """Edit a prompt and re-run: a sibling under the same parent, so both answers stay reachable (CH-7)."""
    check_text(text)
    if commands.is_command(text):
        raise DomainError("An edited prompt cannot be a slash command; send the command as a new message.")
    text, _ = commands.as_prompt(text)
    original = selectors.message_in_conversation(conversation=conversation, message_id=message_id)
    if original.role != Message.Role.USER or transcript.tool_result_ids(selectors.as_plain(original)):
        raise DomainError(f"Message {message_id} is not a prompt you wrote; only your own prompts can be edited.")
    with transaction.atomic():
        locked = conversation_locked(conversation)
        message = Message.objects.create(
            conversation=locked,
            parent_id=original.parent_id,
            role=Message.Role.USER,
            content=[{"type": "text", "text": text}],
        )
        locked.tip = message
        locked.save(update_fields=["tip", "updated_at"])
        run = run_start(conversation=locked, trigger=message)
    conversation.refresh_from_db()
    return MessageSent(message, run)


def message_regenerate(*, conversation: Conversation, message_id: int) -> MessageSent:
    """Answer a reply's prompt again (UX-2): the tip goes back to the prompt and a new run answers
    it, so the new reply is a sibling of the old one and both stay reachable (CH-7)."""
    reply = selectors.message_in_conversation(conversation=conversation, message_id=message_id)
    if reply.role != Message.Role.ASSISTANT:
        raise DomainError(f"Message {message_id} is not a reply; regenerate a reply, or edit a prompt.")
    prompt = reply.parent
    # A turn is prompt, then replies and tool results: the prompt is the nearest person's message above.
    while prompt is not None and (
        prompt.role != Message.Role.USER or transcript.tool_result_ids(selectors.as_plain(prompt))
    ):
        prompt = prompt.parent
    if prompt is None:
        raise DomainError(f"Message {message_id} answers no prompt of yours; there is nothing to regenerate.")
    with transaction.atomic():
        locked = conversation_locked(conversation)
        locked.tip = prompt
        locked.save(update_fields=["tip", "updated_at"])
        run = run_start(conversation=locked, trigger=prompt)
    conversation.refresh_from_db()
    return MessageSent(prompt, run)


def conversation_retry(*, conversation: Conversation) -> Run:
    """Re-run the unanswered prompt at the tip (CH-5).

    The transcript is persisted at every turn boundary, so the database tells the
    two empty cases apart: "nothing loaded" (no transcript at all) is not "nothing
    to retry" (the last turn finished).
    """
    with transaction.atomic():
        locked = conversation_locked(conversation)
        tip = locked.tip
        if tip is None:
            raise NothingLoaded(
                f"Conversation {locked.pk} has no persisted transcript; there is nothing loaded to retry."
            )
        if tip.role == Message.Role.ASSISTANT:
            raise NothingToRetry(f"The last turn finished (message {tip.pk} is its answer); there is nothing to retry.")
        return run_start(conversation=locked, trigger=tip)


def command_run(*, conversation: Conversation, text: str) -> CommandResult:
    """Parse a slash command and dispatch it to its service (CH-10); bad input changes nothing."""
    try:
        command = commands.parse(text)
    except commands.CommandError as exc:
        raise DomainError(str(exc)) from None
    name = command.name
    if command.summary:
        # The web process never calls a model (RN-1): a worker climbs to the summary (CH-14).
        run = compaction_start(conversation=conversation, rungs=ladder.RUNGS)
        return CommandResult(
            name,
            f"/compact summary: compaction run {run.pk} is queued; a worker climbs to a summary by {run.model}.",
            {"run": run.pk, "status": run.status, "rungs": list(ladder.RUNGS)},
        )
    if name in ("compact", "shake"):
        # The web process never calls a model (RN-1), so /compact climbs the free rungs and snapshots.
        rungs = ladder.FREE_RUNGS if name == "shake" else ("elide", "drop_images", "snapshot")
        done = conversation_compact(conversation=conversation, rungs=rungs)
        if done.compaction is None:
            return CommandResult(name, f"/{name}: {done.reason}.", {"recorded": False, "freed": done.freed})
        compaction = done.compaction
        # An earlier pass already shortened what is sent: the rungs' steps count from the whole stored path.
        counted_from = (
            f"; each rung's figures count from the whole stored path, {compaction.tokens_before} tokens"
            if compaction.tokens_before != done.tokens_now
            else ""
        )
        return CommandResult(
            name,
            f"/{name}: {done.tokens_now} -> {compaction.tokens_after} tokens sent "
            f"(rung: {compaction.rung}{counted_from}).",
            compaction_dict(compaction),
        )
    if name == "context":
        view = context_view(conversation=conversation)
        return CommandResult(
            name,
            f"{view['calibrated_tokens']} of {view['window_tokens']} tokens used "
            f"(estimated {view['used_tokens']}, x{view['calibration']} as the provider measured the latest requests).",
            view,
        )
    if name == "tree":
        tree = selectors.message_tree(conversation=conversation)
        count = len(tree["messages"])
        if tree["tip"] is None:
            return CommandResult(name, "The conversation has no messages yet; there is no tree to show.", tree)
        return CommandResult(name, f"{count} message{'s' * (count != 1)}; the tip is message {tree['tip']}.", tree)
    if name == "branch":
        assert command.message_id is not None  # parse() refuses /branch without one
        conversation_branch(conversation=conversation, message_id=command.message_id)
        return CommandResult(name, f"The tip is now message {conversation.tip_id}.", {"tip": conversation.tip_id})
    if name == "fork":
        fork = conversation_fork(conversation=conversation)
        return CommandResult(
            name, f"Forked into conversation {fork.pk}.", {"conversation": fork.pk, "tip": fork.tip_id}
        )
    if name == "checkpoint":
        assert command.label is not None  # parse() refuses /checkpoint without one
        checkpoint = checkpoint_create(conversation=conversation, label=command.label)
        return CommandResult(
            name,
            f"Checkpoint {checkpoint.label!r} at message {checkpoint.message_id}.",
            {"label": checkpoint.label, "message": checkpoint.message_id},
        )
    record = conversation_rewind(conversation=conversation, label=command.label)
    return CommandResult(
        name,
        f"Rewound to {record.label!r} (message {record.target_id}); the explored path is kept.",
        {"label": record.label, "tip": record.target_id, "digest": record.digest},
    )


def compaction_dict(compaction: Compaction) -> dict[str, Any]:
    return {
        "id": compaction.pk,
        "rung": compaction.rung,
        "tokens_before": compaction.tokens_before,
        "tokens_after": compaction.tokens_after,
        "steps": compaction.steps,
        "replaced": compaction.replaced,
        "trigger": compaction.trigger,
    }


# The text blocks of a message's content, what the page shows, not the JSON around them: the
# stored JSON as text matched its keys ("type", "text") and missed quotes and backslashes, which
# JSON escapes. A correlated subquery over the blocks, in each database's JSON functions.
_TEXT_BLOCKS_CONTAIN = {
    # A lax path, not jsonb_array_elements: content that is not an array reads as one block, not an error.
    "postgresql": "EXISTS (SELECT 1 FROM jsonb_path_query({content}, 'lax $[*]') AS block"
    " WHERE block ->> 'type' = 'text' AND block ->> 'text' ILIKE %s ESCAPE '\\')",
    # LIKE ignores case for ASCII letters only, as SQLite's icontains does.
    "sqlite": "EXISTS (SELECT 1 FROM json_each({content}) AS block WHERE json_extract(block.value, '$.type') = 'text'"
    " AND json_extract(block.value, '$.text') LIKE %s ESCAPE '\\')",
}


class TextBlocksContain(Func):
    """Whether a message's text blocks contain `search`, ignoring case: a condition to filter by."""

    output_field = BooleanField()

    def __init__(self, content: F, *, search: str) -> None:
        super().__init__(content)
        self.search = search

    # Func's signature carries its template keywords, which this hand-written SQL has no use for.
    def as_sql(self, compiler: Any, connection: Any, **extra_context: Any) -> tuple[str, list[Any]]:  # type: ignore[override]
        content, params = compiler.compile(self.source_expressions[0])
        pattern = f"%{connection.ops.prep_for_like_query(self.search)}%"
        sql = _TEXT_BLOCKS_CONTAIN[connection.vendor].format(content=content)
        return sql, [*params, pattern]


def conversations_with_activity(*, user: User, search: str = "") -> QuerySet[Conversation]:
    """The user's conversations, most recently active first, each with its message count and
    its latest run; `search` matches titles and the text of the user's own messages (the words
    the page shows, not their JSON)."""
    latest_run = Run.objects.filter(conversation=OuterRef("pk")).order_by("-id")
    queryset = Conversation.objects.filter(owner=user)
    if search:
        matching = (
            Message.objects.filter(conversation__owner=user, role=Message.Role.USER)
            .filter(TextBlocksContain(F("content"), search=search))
            .values("conversation_id")
        )
        queryset = queryset.filter(Q(title__icontains=search) | Q(pk__in=matching))
    return queryset.annotate(
        message_count=Count("messages"),
        last_run_id=Subquery(latest_run.values("id")[:1]),
        last_run_status=Subquery(latest_run.values("status")[:1]),
    ).order_by("-updated_at")
