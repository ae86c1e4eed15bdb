"""Conversations: create, send, and move around the message tree (CH-5..CH-10).

The tree never loses a message: branch, edit, rewind and compaction move a pointer
or record a view; fork copies. Slash commands are parsed here and dispatched to
these services instead of starting a run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.utils import timezone

from controlcenter.errors import Conflict, DomainError, NotFound, RunInProgress
from conversations import commands, export, selectors
from conversations.compaction import CompactionPass, compaction_pass
from conversations.models import Checkpoint, Conversation, Message, RewindDigest
from conversations.signals import announce_on_commit
from engine.context import ladder, transcript
from toolcatalog.models import Mode

TITLE_MAX = 200


def conversation_create(*, owner: User, title: str = "", model: str = "") -> Conversation:
    """A new conversation; `model` as conversation_update takes it, checked before anything is stored."""
    title = title.strip()
    if len(title) > TITLE_MAX:
        raise DomainError(f"The title has {len(title)} characters; the limit is {TITLE_MAX}.")
    _check_model(model)
    return Conversation.objects.create(owner=owner, title=title or "New conversation", model=model)


def _check_model(model: str) -> None:
    """A name from CC_MODELS, or blank for the server default."""
    if model and model not in settings.CC_MODELS:
        offered = list(settings.CC_MODELS)
        raise DomainError(
            f"Model {model!r} is not offered here; choose one of {', '.join(offered)} (or blank for the default).",
            {"model": offered},
        )


# "Not given" for conversation_update, where None means "clear".
KEEP: Any = object()


def conversation_update(
    *, conversation: Conversation, model: str = KEEP, mode_id: int | None = KEEP, title: str = KEEP
) -> Conversation:
    """Set the model and mode the conversation's next run uses (its pickers); a run already started keeps its own.

    `model` is a name from CC_MODELS, or blank for the server default; `mode_id` a catalog
    mode, or None for the default mode. Either bad value changes nothing.
    """
    changes: dict[str, Any] = {}
    if title is not KEEP:
        # A rename (UX-2): a title is shown in lists and tabs, so a blank one is refused.
        if not title.strip():
            raise DomainError("The title is empty; write a title.")
        changes["title"] = title.strip()
    if model is not KEEP:
        _check_model(model)
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
            # The other tabs show the title and the pickers; theirs would send the next prompt believing the old ones.
            announce_on_commit(conversation_id=conversation.pk, reason="updated")
    conversation.refresh_from_db()
    return conversation


def conversation_delete(*, conversation: Conversation) -> None:
    """Delete a conversation with its messages and runs (UX-2); refused while a run works in it."""
    with transaction.atomic():
        conversation_locked(conversation).delete()


def check_text(text: str) -> None:
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
    # Through the reverse relation: runs are a layer above this app, which never imports them.
    if idle and locked.runs.active().exists():
        raise RunInProgress("A run is still in progress in this conversation; wait for it or cancel it.")
    return locked


@transaction.atomic
def conversation_branch(*, conversation: Conversation, message_id: int) -> Conversation:
    """Move the tip to any message of the conversation: one UPDATE, nothing else written, and
    nothing at all when the tip is already there (CH-7).

    Refused while a run works, as every other move of the tip is: its answer is written under its
    prompt when the turn ends, and would land off the path the person moved to, unannounced."""
    target = selectors.message_in_conversation(conversation=conversation, message_id=message_id)
    if _mid_turn(target):
        raise DomainError(
            f"Message {message_id} stops in the middle of a turn (a tool call without its result); "
            "branch to its tool result or to the turn's final answer."
        )
    locked = conversation_locked(conversation)
    if locked.tip_id == target.pk:
        # Already there: touching updated_at would lift the conversation to the top of the list.
        conversation.tip, conversation.updated_at = target, locked.updated_at
        return conversation
    now = timezone.now()
    Conversation.objects.filter(pk=conversation.pk).update(tip=target, updated_at=now)
    conversation.tip, conversation.updated_at = target, now
    announce_on_commit(conversation_id=conversation.pk, reason="branch")
    return conversation


def conversation_fork(*, conversation: Conversation, title: str = "") -> Conversation:
    """Copy the current path into a new conversation with new ids, in one bulk insert (CH-8).

    Rows are never shared: a fork must not see the other's later messages. Checkpoints
    on the copied path come along, pointing at the copies, and so do the rewind records whose
    notes the path carries, so the fork's model reads the same path, notes included (CH-9).
    """
    title = (title.strip() or f"{conversation.title} (fork)")[:TITLE_MAX]
    with transaction.atomic():
        path = selectors.current_path(conversation)
        if not path:
            raise Conflict("The conversation has no messages yet; there is nothing to fork.")
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
        carried = [record for _, record in selectors.rewinds_on_path(conversation_id=conversation.pk, path=path)]
        if carried:
            RewindDigest.objects.bulk_create(
                RewindDigest(
                    conversation=fork,
                    label=record.label,
                    target_id=new_id_of[record.target_id],
                    # A note is carried because the path left the exploration at the checkpoint, so
                    # none of the explored messages were copied.
                    explored_tip=None,
                    digest=record.digest,
                )
                for record in carried
            )
            # A note goes on a prompt written after its rewind; the copies were all written just now,
            # so the copied records take the fork's own creation time, which precedes every copy.
            RewindDigest.objects.filter(conversation=fork).update(created_at=fork.created_at)
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
        if locked.tip is None:
            raise Conflict("The conversation has no messages yet; there is no turn boundary to mark.")
        tip = selectors.as_plain(locked.tip)
        if not transcript.is_clean_boundary([tip]):
            raise Conflict(
                f"Message {locked.tip_id} is not a clean turn boundary (a finished answer); "
                "checkpoints mark the end of a turn."
            )
        check_label_free(conversation_id=locked.pk, label=label)
        checkpoint = Checkpoint.objects.create(conversation=locked, label=label, message=locked.tip)
        # For whatever shows checkpoints (the tree page lists them; the conversation page shows none).
        announce_on_commit(conversation_id=locked.pk, reason="checkpoint")
        return checkpoint


def check_label_free(*, conversation_id: int, label: str, renaming: Checkpoint | None = None) -> None:
    """Refuse a label another checkpoint of the conversation has (409): rewinding by it must name one place."""
    others = Checkpoint.objects.filter(conversation_id=conversation_id, label=label)
    if renaming is not None:
        others = others.exclude(pk=renaming.pk)
    if others.exists():
        raise Conflict(f"A checkpoint named {label!r} already exists here; choose another label.")


def conversation_rewind(*, conversation: Conversation, label: str | None = None) -> RewindDigest:
    """Move the tip back to a checkpoint and keep a digest of what was explored since (CH-9)."""
    with transaction.atomic():
        locked = conversation_locked(conversation)
        path = selectors.current_path(locked)
        position = {message.id: index for index, message in enumerate(path)}
        checkpoints = list(Checkpoint.objects.filter(conversation=locked))
        checkpoint: Checkpoint | None
        if label is None:
            behind = [c for c in checkpoints if c.message_id in position and c.message_id != locked.tip_id]
            if not behind:
                raise Conflict("There is no checkpoint behind the tip on this branch to rewind to.")
            checkpoint = max(behind, key=lambda c: (position[c.message_id], c.pk))
        else:
            checkpoint = next((c for c in checkpoints if c.label == label), None)
            if checkpoint is None:
                known = ", ".join(sorted(c.label for c in checkpoints)) or "none"
                raise NotFound(f"There is no checkpoint named {label!r}; checkpoints here: {known}.")
            if checkpoint.message_id not in position:
                raise Conflict(
                    f"Checkpoint {label!r} is not on the current branch; /branch {checkpoint.message_id} moves there."
                )
        explored = path[position[checkpoint.message_id] + 1 :]
        if not explored:
            raise Conflict(f"The tip is at checkpoint {checkpoint.label!r}; nothing was explored since.")
        digest = export.exploration_digest([selectors.as_plain(m) for m in explored])
        record = RewindDigest.objects.create(
            conversation=locked,
            label=checkpoint.label,
            target_id=checkpoint.message_id,
            explored_tip_id=locked.tip_id,
            digest=digest,
        )
        Conversation.objects.filter(pk=locked.pk).update(tip_id=checkpoint.message_id, updated_at=timezone.now())
        announce_on_commit(conversation_id=locked.pk, reason="rewind")
    conversation.refresh_from_db()
    return record


def check_rungs(rungs: Sequence[str]) -> None:
    """Refuse an empty or unknown list of compaction rungs (400), before anything is stored."""
    unknown = [rung for rung in rungs if rung not in ladder.RUNGS]
    if unknown or not rungs:
        raise DomainError(f"Unknown or no rungs {unknown}; choose from {', '.join(ladder.RUNGS)}.")


def conversation_compact(
    *,
    conversation: Conversation,
    rungs: Sequence[str] = ladder.RUNGS,
    target_tokens: int = 0,
    trigger: str = "command",
) -> CompactionPass:
    """Run the ladder over the current path and record the pass (CH-1, CH-10 /compact and /shake).

    Nothing is deleted: the row records what the pass replaced, the tree keeps every
    original message. A pass that frees too little records nothing (CH-11), so a no-op
    `/shake` changes nothing.
    """
    check_rungs(rungs)
    with transaction.atomic():
        # A run in flight holds the conversation (409): its turn compacts on its own (CH-2).
        locked = conversation_locked(conversation)
        if locked.tip_id is None:
            raise Conflict("The conversation has no messages yet; there is nothing to compact.")
        # Images counted as the provider of the conversation's model bills them (CH-12).
        provider = settings.CC_MODELS.get(locked.model or settings.CC_MODEL, "")
        return compaction_pass(
            conversation_id=locked.pk,
            tip_id=locked.tip_id,
            rungs=rungs,
            target_tokens=target_tokens,
            trigger=trigger,
            image_rule=transcript.provider_image_rule(provider),
        )


def _mid_turn(message: Message) -> bool:
    """A tip here would send a tool call without its result, which every provider refuses (CH-5)."""
    return bool(transcript.tool_use_ids(selectors.as_plain(message)))


def message_delete(*, message: Message) -> Conversation:
    """Delete a message and the messages under it (the admin's delete), keeping a tip (CH-7).

    A tip inside the deleted subtree moves to the nearest ancestor a branch could move to: the
    parent, or above it when the parent is a tool call whose result is being deleted (a tip
    there failed every later run with the provider's 400, CH-5). Deleting the root of the
    current path while other messages remain is refused: no tip would be left to stand on.
    """
    with transaction.atomic():
        locked = conversation_locked(message.conversation)
        subtree = _subtree_ids(message)
        if locked.tip_id in subtree:
            others = Message.objects.filter(conversation=locked).exclude(pk__in=subtree).exists()
            if message.parent_id is None and others:
                raise Conflict(
                    f"Message {message.pk} is the root of the current path and other messages remain; "
                    "branch to another message first, then delete this one."
                )
            tip = message.parent
            while tip is not None and _mid_turn(tip):
                tip = tip.parent
            Conversation.objects.filter(pk=locked.pk).update(tip=tip, updated_at=timezone.now())
        Message.objects.filter(pk__in=subtree).delete()
        # Off the path too: the sibling arrows of the messages shown count the deleted ones.
        announce_on_commit(conversation_id=locked.pk, reason="message_deleted")
    locked.refresh_from_db()
    return locked


def tip_back_to_latest_answer(*, conversation_id: int, prompt_id: int) -> int | None:
    """After a run stopped before it stored anything (a Regenerate stopped), the tip, left at the
    prompt, goes back to where the prompt's latest answer leads: the page shows that answer again
    instead of a bare prompt, with the earlier answer reachable only from the tree. Only if the tip
    is still at the prompt and the prompt has an answer; the new tip, or None."""
    latest = (
        Message.objects.filter(conversation_id=conversation_id, parent_id=prompt_id, role=Message.Role.ASSISTANT)
        .order_by("-id")
        .first()
    )
    if latest is None:
        return None
    # The newest message of that answer's subtree is a leaf (a child would be newer): its latest end.
    leaf = max(_subtree_ids(latest))
    moved = Conversation.objects.filter(pk=conversation_id, tip_id=prompt_id).update(
        tip_id=leaf, updated_at=timezone.now()
    )
    return leaf if moved else None


def _subtree_ids(message: Message) -> set[int]:
    # Ids and parents of the conversation only: a cheap walk even for 10,000 messages.
    children: dict[int | None, list[int]] = {}
    for pk, parent in Message.objects.filter(conversation_id=message.conversation_id).values_list("id", "parent_id"):
        children.setdefault(parent, []).append(pk)
    found, stack = set(), [message.pk]
    while stack:
        current = stack.pop()
        found.add(current)
        stack.extend(children.get(current, []))
    return found
