"""Conversations: create, send, and move around the message tree (CH-5..CH-10).

The tree never loses a message: branch, edit, rewind and compaction move a pointer
or record a view; fork copies. Slash commands are parsed here and dispatched to
these services instead of starting a run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.utils import timezone

from agents.models import Run
from agents.services import ACTIVE_STATUSES, run_start
from controlcenter.errors import Conflict, DomainError
from conversations import commands, export, selectors
from conversations.models import Checkpoint, Compaction, Conversation, Message, RewindDigest
from engine.context import ladder, transcript
from engine.context.snapshots import page_for_window
from toolcatalog.models import Mode

TITLE_MAX = 200


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

    def __iter__(self) -> Iterator[Any]:
        # Unpacks as (message, run), so callers written before slash commands keep working.
        return iter((self.message, self.run))


def conversation_create(*, owner: AbstractBaseUser, title: str = "") -> Conversation:
    title = title.strip()
    if len(title) > TITLE_MAX:
        raise DomainError(f"The title has {len(title)} characters; the limit is {TITLE_MAX}.")
    return Conversation.objects.create(owner=owner, title=title or "New conversation")


# "Not given" for conversation_update, where None means "clear".
KEEP: Any = object()


def conversation_update(*, conversation: Conversation, model: str = KEEP, mode_id: int | None = KEEP) -> Conversation:
    """Set the model and mode the conversation's next run uses (its pickers); a run already started keeps its own.

    `model` is a name from CC_MODELS, or blank for the server default; `mode_id` a catalog
    mode, or None for the default mode. Either bad value changes nothing.
    """
    changes: dict[str, Any] = {}
    if model is not KEEP:
        if model and model not in settings.CC_MODELS:
            offered = list(settings.CC_MODELS)
            raise DomainError(
                f"Model {model!r} is not offered here; choose one of {', '.join(offered)} (or blank for the default).",
                {"model": offered},
            )
        changes["model"] = model
    with transaction.atomic():
        if mode_id is not KEEP:
            # Locked, so the mode cannot be deleted between this check and the update.
            if mode_id is not None and not Mode.objects.select_for_update().filter(pk=mode_id).exists():
                raise DomainError(
                    f"Mode {mode_id} does not exist; choose one of the modes listed at /api/modes/ "
                    "(or null for the default mode).",
                    {"mode": list(Mode.objects.values_list("pk", flat=True))},
                )
            changes["mode_id"] = mode_id
        if changes:
            # Not save(): picking a model is not activity, so the conversations list keeps its order.
            Conversation.objects.filter(pk=conversation.pk).update(**changes)
    conversation.refresh_from_db()
    return conversation


def _check_text(text: str) -> None:
    if not isinstance(text, str) or not text.strip():
        raise DomainError("The message is empty; write something to send.")
    if len(text) > settings.CC_MAX_MESSAGE_CHARS:
        raise DomainError(f"The message has {len(text)} characters; the limit is {settings.CC_MAX_MESSAGE_CHARS}.")


def conversation_locked(conversation: Conversation, *, idle: bool = True) -> Conversation:
    """The conversation's row, locked for this transaction; with `idle`, refused while a run holds it.

    Every service that moves the tip or starts a run goes through here, so "one run at a
    time per conversation" is checked in one place.
    """
    locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
    if idle and Run.objects.filter(conversation=locked, status__in=ACTIVE_STATUSES).exists():
        raise Conflict("A run is still in progress in this conversation; wait for it or cancel it.")
    return locked


def message_send(*, conversation: Conversation, text: str) -> MessageSent:
    """Append a user message under the tip, move the tip, and queue the turn after commit.

    A message starting with '/' is a slash command (CH-10): it runs its service and
    starts no run; it is not stored as a message.
    """
    _check_text(text)
    if commands.is_command(text):
        return MessageSent(None, None, command_run(conversation=conversation, text=text))
    with transaction.atomic():
        locked = conversation_locked(conversation)
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
    return MessageSent(message, run)


def message_edit(*, conversation: Conversation, message_id: int, text: str) -> MessageSent:
    """Edit a prompt and re-run: a sibling under the same parent, so both answers stay reachable (CH-7)."""
    _check_text(text)
    if commands.is_command(text):
        raise DomainError("An edited prompt cannot be a slash command; send the command as a new message.")
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


def conversation_branch(*, conversation: Conversation, message_id: int) -> Conversation:
    """Move the tip to any message of the conversation: one UPDATE, nothing else written (CH-7)."""
    target = selectors.message_in_conversation(conversation=conversation, message_id=message_id)
    if transcript.tool_use_ids(selectors.as_plain(target)):
        raise DomainError(
            f"Message {message_id} stops in the middle of a turn (a tool call without its result); "
            "branch to its tool result or to the turn's final answer."
        )
    now = timezone.now()
    Conversation.objects.filter(pk=conversation.pk).update(tip=target, updated_at=now)
    conversation.tip, conversation.updated_at = target, now
    return conversation


def conversation_fork(*, conversation: Conversation, title: str = "") -> Conversation:
    """Copy the current path into a new conversation with new ids, in one bulk insert (CH-8).

    Rows are never shared: a fork must not see the other's later messages. Checkpoints
    on the copied path come along, pointing at the copies.
    """
    title = (title.strip() or f"{conversation.title} (fork)")[:TITLE_MAX]
    with transaction.atomic():
        path = selectors.current_path(conversation)
        if not path:
            raise DomainError("The conversation has no messages yet; there is nothing to fork.")
        fork = Conversation.objects.create(
            owner=conversation.owner,
            title=title,
            forked_from=conversation,
            model=conversation.model,
            mode_id=conversation.mode_id,
        )
        # Decoded fresh from the database for this fork, so the copies share no objects with anything.
        copies = [Message(conversation=fork, role=m.role, content=m.content) for m in path]
        ids = _reserve_message_ids(len(copies))
        if ids:
            for new_id, message in zip(ids, copies, strict=True):
                message.pk = new_id
            for parent, message in zip(copies, copies[1:], strict=False):
                message.parent_id = parent.pk
            Message.objects.bulk_create(copies)
        else:
            # No sequence to reserve ids from (SQLite): insert, then link the chain in one UPDATE.
            Message.objects.bulk_create(copies)
            for parent, message in zip(copies, copies[1:], strict=False):
                message.parent_id = parent.pk
            Message.objects.bulk_update(copies[1:], ["parent"])
        new_id_of = {old.id: new.pk for old, new in zip(path, copies, strict=True)}
        Checkpoint.objects.bulk_create(
            Checkpoint(conversation=fork, label=checkpoint.label, message_id=new_id_of[checkpoint.message_id])
            for checkpoint in Checkpoint.objects.filter(conversation=conversation, message_id__in=new_id_of)
        )
        Conversation.objects.filter(pk=fork.pk).update(tip=copies[-1])
    fork.refresh_from_db()
    return fork


def _reserve_message_ids(count: int) -> list[int]:
    """Ids taken from PostgreSQL's sequence up front, so parents can be set inside the one INSERT."""
    if connection.vendor != "postgresql" or count == 0:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
            [Message._meta.db_table, count],
        )
        return [row[0] for row in cursor.fetchall()]


def checkpoint_create(*, conversation: Conversation, label: str) -> Checkpoint:
    """Label the current tip; only a clean turn boundary (a finished answer) can carry one (CH-9)."""
    try:
        label = commands.validate_label(label if isinstance(label, str) else "")
    except commands.CommandError as exc:
        raise DomainError(str(exc)) from None
    with transaction.atomic():
        locked = conversation_locked(conversation)
        if locked.tip_id is None:
            raise DomainError("The conversation has no messages yet; there is no turn boundary to mark.")
        tip = selectors.as_plain(locked.tip)
        if not transcript.is_clean_boundary([tip]):
            raise DomainError(
                f"Message {locked.tip_id} is not a clean turn boundary (a finished answer); "
                "checkpoints mark the end of a turn."
            )
        if Checkpoint.objects.filter(conversation=locked, label=label).exists():
            raise DomainError(f"A checkpoint named {label!r} already exists here; choose another label.")
        return Checkpoint.objects.create(conversation=locked, label=label, message_id=locked.tip_id)


def conversation_rewind(*, conversation: Conversation, label: str | None = None) -> RewindDigest:
    """Move the tip back to a checkpoint and keep a digest of what was explored since (CH-9)."""
    with transaction.atomic():
        locked = conversation_locked(conversation)
        path = selectors.current_path(locked)
        position = {message.id: index for index, message in enumerate(path)}
        checkpoints = list(Checkpoint.objects.filter(conversation=locked))
        if label is None:
            behind = [c for c in checkpoints if c.message_id in position and c.message_id != locked.tip_id]
            if not behind:
                raise DomainError("There is no checkpoint behind the tip on this branch to rewind to.")
            checkpoint = max(behind, key=lambda c: (position[c.message_id], c.pk))
        else:
            checkpoint = next((c for c in checkpoints if c.label == label), None)
            if checkpoint is None:
                known = ", ".join(sorted(c.label for c in checkpoints)) or "none"
                raise DomainError(f"There is no checkpoint named {label!r}; checkpoints here: {known}.")
            if checkpoint.message_id not in position:
                raise DomainError(
                    f"Checkpoint {label!r} is not on the current branch; /branch {checkpoint.message_id} moves there."
                )
        explored = path[position[checkpoint.message_id] + 1 :]
        if not explored:
            raise DomainError(f"The tip is at checkpoint {checkpoint.label!r}; nothing was explored since.")
        digest = export.exploration_digest([selectors.as_plain(m) for m in explored])
        record = RewindDigest.objects.create(
            conversation=locked,
            label=checkpoint.label,
            target_id=checkpoint.message_id,
            explored_tip_id=locked.tip_id,
            digest=digest,
        )
        Conversation.objects.filter(pk=locked.pk).update(tip_id=checkpoint.message_id, updated_at=timezone.now())
    conversation.refresh_from_db()
    return record


def conversation_compact(
    *,
    conversation: Conversation,
    rungs: Sequence[str] = ladder.RUNGS,
    target_tokens: int = 0,
    summarize: Callable[[str], str] | None = None,
    trigger: str = "command",
) -> tuple[Compaction, ladder.LadderResult]:
    """Run the ladder over the current path and record the pass (CH-1, CH-10 /compact and /shake).

    Nothing is deleted: the row records what the pass replaced, the tree keeps
    every original message.
    """
    unknown = [rung for rung in rungs if rung not in ladder.RUNGS]
    if unknown or not rungs:
        raise DomainError(f"Unknown or no rungs {unknown}; choose from {', '.join(ladder.RUNGS)}.")
    path = selectors.path_messages(conversation)
    if not path:
        raise DomainError("The conversation has no messages yet; there is nothing to compact.")
    result = ladder.compact(
        path,
        rungs=rungs,
        target_tokens=target_tokens,
        tail_tokens=settings.CC_COMPACT_TAIL_TOKENS,
        summarize=summarize,
        shape=page_for_window(settings.CC_SNAPSHOT_PAGE_PIXELS),
    )
    compaction = Compaction.objects.create(
        conversation=conversation,
        tip_id=conversation.tip_id,
        rung=result.rung,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
        steps=[step.as_dict() for step in result.steps],
        replaced=result.replaced,
        trigger=trigger,
        view=_sendable(result.messages),
    )
    return compaction, result


def _sendable(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as a provider takes them: role and content only (the ladder keeps database ids)."""
    return [{"role": message["role"], "content": message["content"]} for message in messages]


@dataclass(frozen=True)
class TurnContext:
    """The history a turn sends, and the compaction that produced it, if one ran now."""

    messages: list[dict[str, Any]]
    compaction: Compaction | None


def turn_context(*, trigger: Message, overhead_tokens: int, run: Run | None = None) -> TurnContext:
    """The history for a turn answering `trigger`: the latest compaction view on the path plus what came after.

    Compaction runs proactively (CH-2) when the history and `overhead_tokens` (system and
    tools) pass CC_COMPACT_AT_PERCENT of the context window, down to CC_COMPACT_TO_PERCENT,
    with the rungs that need no model call. Its view is stored and reused by later turns,
    so a pass is one rewrite, not a different prefix at every turn.
    """
    history = selectors.history_view(conversation_id=trigger.conversation_id, tip_id=trigger.pk)
    window = settings.CC_CONTEXT_WINDOW_TOKENS
    if transcript.transcript_tokens(history) + overhead_tokens <= window * settings.CC_COMPACT_AT_PERCENT // 100:
        return TurnContext(history, None)
    target = max(1, window * settings.CC_COMPACT_TO_PERCENT // 100 - overhead_tokens)
    view, compaction = _compact_view(trigger, history, target, trigger_name="proactive", run=run)  # type: ignore[misc]
    return TurnContext(view, compaction)


def reactive_compaction(
    *, trigger: Message, history: list[dict[str, Any]], limit_tokens: int, run: Run | None = None
) -> tuple[list[dict[str, Any]], Compaction] | None:
    """After the provider refused the prompt as too long (CH-2): one pass, no model call; None if it cannot fit."""
    return _compact_view(trigger, history, limit_tokens, trigger_name="reactive", must_fit=True, run=run)


# Overflow recovery never depends on a model call (CH-2): snapshots are always available.
NO_CALL_RUNGS = ("elide", "drop_images", "snapshot")


def _compact_view(
    trigger: Message,
    history: list[dict[str, Any]],
    target: int,
    *,
    trigger_name: str,
    must_fit: bool = False,
    run: Run | None = None,
) -> tuple[list[dict[str, Any]], Compaction] | None:
    result = ladder.compact(
        history,
        rungs=NO_CALL_RUNGS,
        target_tokens=target,
        tail_tokens=settings.CC_COMPACT_TAIL_TOKENS,
        shape=page_for_window(settings.CC_SNAPSHOT_PAGE_PIXELS),
    )
    if must_fit and result.tokens_after > target:
        return None
    view = _sendable(result.messages)
    compaction = Compaction.objects.create(
        conversation_id=trigger.conversation_id,
        tip=trigger,
        rung=result.rung,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
        steps=[step.as_dict() for step in result.steps],
        replaced=result.replaced,
        trigger=trigger_name,
        view=view,
        run=run,
    )
    return view, compaction


def conversation_retry(*, conversation: Conversation) -> Run:
    """Re-run the unanswered prompt at the tip (CH-5).

    The transcript is persisted at every turn boundary, so the database tells the
    two empty cases apart: "nothing loaded" (no transcript at all) is not "nothing
    to retry" (the last turn finished).
    """
    with transaction.atomic():
        locked = conversation_locked(conversation)
        if locked.tip_id is None:
            raise NothingLoaded(
                f"Conversation {locked.pk} has no persisted transcript; there is nothing loaded to retry."
            )
        tip = locked.tip
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
    if name in ("compact", "shake"):
        # The web process never calls a model (RN-1), so /compact climbs the free rungs and snapshots.
        rungs = ladder.FREE_RUNGS if name == "shake" else ("elide", "drop_images", "snapshot")
        compaction, _ = conversation_compact(conversation=conversation, rungs=rungs)
        return CommandResult(
            name,
            f"/{name}: {compaction.tokens_before} -> {compaction.tokens_after} tokens (rung: {compaction.rung}).",
            compaction_dict(compaction),
        )
    if name == "context":
        view = selectors.conversation_context(conversation=conversation)
        return CommandResult(name, f"{view['used_tokens']} of {view['window_tokens']} tokens used.", view)
    if name == "tree":
        tree = selectors.message_tree(conversation=conversation)
        return CommandResult(name, f"{len(tree['messages'])} messages; the tip is {tree['tip']}.", tree)
    if name == "branch":
        conversation_branch(conversation=conversation, message_id=command.message_id)
        return CommandResult(name, f"The tip is now message {conversation.tip_id}.", {"tip": conversation.tip_id})
    if name == "fork":
        fork = conversation_fork(conversation=conversation)
        return CommandResult(
            name, f"Forked into conversation {fork.pk}.", {"conversation": fork.pk, "tip": fork.tip_id}
        )
    if name == "checkpoint":
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
