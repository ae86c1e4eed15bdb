"""Reads of scratchpad entries: scope checks and a chunk source over the database."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import NamedTuple

from django.apps import apps
from django.contrib.auth.models import User
from django.db.models import Min, Q, QuerySet, Sum
from django.utils import timezone

from engine.scratchpad.chunks import decode
from engine.scratchpad.reader import Chunk as ReadChunk
from engine.scratchpad.reader import ReadError, Shape
from scratchpad.models import Chunk, Entry

_MAX_BATCH = 8


class DbChunkSource:
    """A reader's view of one entry: locates chunks by index queries, fetches them lazily."""

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self.shape = Shape(entry.kind, entry.length, entry.newline_count, entry.line_count)
        self.fetched = 0

    def index_at_offset(self, offset: int) -> int:
        index = (
            Chunk.objects.filter(entry_id=self.entry.pk, char_start__lte=offset)
            .order_by("-char_start")
            .values_list("index", flat=True)
            .first()
        )
        return index or 0

    def index_for_line(self, newlines_before: int) -> int:
        index = (
            Chunk.objects.filter(entry_id=self.entry.pk, line_start__lt=newlines_before)
            .order_by("-line_start", "-index")
            .values_list("index", flat=True)
            .first()
        )
        return index or 0

    def chunks(self, first_index: int) -> Iterator[ReadChunk]:
        text = self.entry.kind == Entry.Kind.TEXT
        index = first_index
        # Most reads need one chunk; a longer walk (lines, grep) fetches growing batches.
        batch = 1
        while index < self.entry.chunk_count:
            rows = list(
                Chunk.objects.filter(entry_id=self.entry.pk, index__gte=index, index__lt=index + batch)
                .order_by("index")
                .values_list("index", "char_start", "line_start", "data")
            )
            expected = min(batch, self.entry.chunk_count - index)
            if len(rows) != expected:
                # Collected while we read: say so rather than return a silent hole.
                raise ReadError(f"Scratchpad entry {self.entry.pk} expired while it was being read.")
            for row_index, start, line_start, data in rows:
                self.fetched += 1
                yield ReadChunk(row_index, start, line_start, decode(bytes(data), text=text))
            index += batch
            batch = min(batch * 2, _MAX_BATCH)


def live_entries(*, now: datetime | None = None) -> QuerySet[Entry]:
    return Entry.objects.filter(expires_at__gt=now or timezone.now())


def entries_visible_to_turn(
    *, turn_id: str, conversation_id: int | None = None, now: datetime | None = None
) -> QuerySet[Entry]:
    """The turn's own live entries, plus its conversation's pinned ones (SP-11)."""
    scope = Q(turn_id=turn_id)
    if conversation_id is not None:
        scope |= Q(pinned=True, conversation_id=conversation_id)
    return live_entries(now=now).filter(scope)


def entry_for_turn(
    *, entry_id: str, turn_id: str, conversation_id: int | None = None, now: datetime | None = None
) -> Entry | None:
    if not possible_entry_id(entry_id):
        return None
    visible = entries_visible_to_turn(turn_id=turn_id, conversation_id=conversation_id, now=now)
    return visible.filter(pk=entry_id).first()


def possible_entry_id(entry_id: str) -> bool:
    """Whether an id could name an entry: PostgreSQL refuses a NUL in a query (SB-5)."""
    max_length = Entry._meta.get_field("id").max_length
    return "\x00" not in entry_id and (max_length is None or len(entry_id) <= max_length)


def entries_for_user(*, user: User, now: datetime | None = None) -> QuerySet[Entry]:
    """Live entries whose run's conversation belongs to `user` (RN-3)."""
    return live_entries(now=now).filter(conversation__owner=user)


def entry_for_user(*, user: User, entry_id: str, now: datetime | None = None) -> Entry | None:
    if not possible_entry_id(entry_id):
        return None
    return entries_for_user(user=user, now=now).filter(pk=entry_id).first()


class Usage(NamedTuple):
    """What a user's entries take: content bytes, and when the next live one expires."""

    size_bytes: int
    next_expiry: datetime | None


def owner_of(*, run_id: int | None, conversation_id: int | None) -> int | None:
    """The user an entry counts for: its conversation's owner, or its run's; None for neither."""
    # Through the app registry: scratchpad sits below conversations and agents (docs/architecture.md).
    if conversation_id is not None:
        conversations = apps.get_model("conversations", "Conversation").objects
        owner: int | None = conversations.filter(pk=conversation_id).values_list("owner_id", flat=True).first()
        return owner
    if run_id is not None:
        runs = apps.get_model("agents", "Run").objects
        owner = runs.filter(pk=run_id).values_list("conversation__owner_id", flat=True).first()
        return owner
    return None


def owner_scopes(*, owner_id: int) -> tuple[QuerySet[Entry], QuerySet[Entry]]:
    """The entries that count towards a user's scratchpad quota, expired ones included (they take
    disk until collected): those of her conversations, and those of her runs that name no
    conversation. Two querysets rather than one with an OR, so that each follows its indexes
    instead of scanning every user's entries."""
    return (
        Entry.objects.filter(conversation__owner_id=owner_id),
        Entry.objects.filter(conversation__isnull=True, run__conversation__owner_id=owner_id),
    )


def owner_usage(*, owner_id: int, now: datetime) -> Usage:
    size, next_expiry = 0, None
    for scope in owner_scopes(owner_id=owner_id):
        totals = scope.aggregate(size=Sum("size_bytes"), next_expiry=Min("expires_at", filter=Q(expires_at__gt=now)))
        size += totals["size"] or 0
        if totals["next_expiry"] is not None:
            next_expiry = min(next_expiry or totals["next_expiry"], totals["next_expiry"])
    return Usage(size, next_expiry)
