"""Scratchpad writes and reads: put, read, list_for_turn, gc, pin (SP-2, SP-10, SP-11).

Entries are rows in the project database, so every worker sees the same scratchpad
(SP-12). The clock is a parameter (`now`) so TTL behaviour can be tested exactly.
An offloaded observation is stored only within its owner's quota (`CC_SCRATCHPAD_QUOTA_MB`).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from controlcenter.errors import Conflict, DomainError, NotFound
from engine.scratchpad.chunks import EncodedChunk, chunk_size_for, encode_iter
from engine.scratchpad.offload import (
    Payload,
    rebuild_observation,
    scratchpad_full,
    split_observation,
    synthetic_observation,
    unstored_observation,
)
from engine.scratchpad.read_tool import DEFAULT_GREP_TIMEOUT_SECONDS, DEFAULT_READ_MAX_CHARS, run_read
from engine.scratchpad.reader import shape_of
from engine.scratchpad.summary import binary_summary, text_summary
from scratchpad import selectors
from scratchpad.models import Chunk, Entry

T = TypeVar("T")
logger = logging.getLogger(__name__)
DEFAULT_TTL_SECONDS = 3600
DEFAULT_PINNED_TTL_SECONDS = 7 * 24 * 3600
_GC_BATCH = 200
_INSERT_BATCH = 32


def _retry_when_locked(action: Callable[[], T]) -> T:
    """SQLite (embedded mode) answers a busy table with an error instead of waiting: retry briefly."""
    for attempt in range(60):
        try:
            return action()
        except OperationalError as exc:
            if connection.vendor != "sqlite" or "locked" not in str(exc) or attempt == 59:
                raise
            time.sleep(0.02 * (1 + attempt % 5))
    raise AssertionError("unreachable")


def default_ttl_seconds() -> int:
    return int(getattr(settings, "SCRATCHPAD_TTL_SECONDS", DEFAULT_TTL_SECONDS))


def read_max_chars() -> int:
    return int(getattr(settings, "SCRATCHPAD_READ_MAX_CHARS", DEFAULT_READ_MAX_CHARS))


def quota_bytes() -> int:
    return int(settings.CC_SCRATCHPAD_QUOTA_MB) * 1024 * 1024


def _new_id() -> str:
    return secrets.token_hex(8)


# Ten years: a later expiry is "forever" in practice, and 3.2e11 s overflowed the date (SB-5).
MAX_TTL_SECONDS = 10 * 365 * 24 * 3600


def _check_ttl(ttl_seconds: int | None) -> int:
    if ttl_seconds is None:
        return default_ttl_seconds()
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or not 0 < ttl_seconds <= MAX_TTL_SECONDS:
        raise DomainError(
            f"ttl_seconds must be a positive integer up to {MAX_TTL_SECONDS} (ten years); got {ttl_seconds!r}."
        )
    return ttl_seconds


def put(
    *,
    turn_id: str,
    content: str | bytes,
    kind: str | None = None,
    step_num: int | None = None,
    executor_name: str = "",
    ttl_seconds: int | None = None,
    run_id: int | None = None,
    conversation_id: int | None = None,
    pinned: bool = False,
    summary: str | None = None,
    metadata: dict[str, Any] | None = None,
    payload_field: str = "",
    payload_encoding: str = "",
    envelope: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Entry:
    """Store `content` for the turn, chunked and compressed, in one transaction."""
    if not turn_id:
        raise DomainError("turn_id is required.")
    ttl = _check_ttl(ttl_seconds)
    if pinned and conversation_id is None:
        raise DomainError("Only an entry that belongs to a conversation can be pinned.")
    if kind not in (None, Entry.Kind.TEXT, Entry.Kind.BINARY):
        raise DomainError(f"kind must be 'text' or 'binary'; got {kind!r}.")
    content = _normalise(content, kind)
    now = now or timezone.now()
    shape = shape_of(content)
    if summary is None:
        summary = _summary(content)
    fields = {
        "turn_id": str(turn_id),
        "run_id": run_id,
        "conversation_id": conversation_id,
        "pinned": pinned,
        "step_num": step_num,
        "executor_name": executor_name[:200],
        "kind": shape.kind,
        "size_bytes": 0,
        "length": shape.length,
        "newline_count": shape.newline_count,
        "line_count": shape.line_count,
        "chunk_count": -(-shape.length // chunk_size_for(content)),
        "summary": summary,
        "metadata": metadata or {},
        "payload_field": payload_field,
        "payload_encoding": payload_encoding,
        "envelope": envelope or {},
        "created_at": now,
        "expires_at": now + timedelta(seconds=ttl),
    }

    def store() -> Entry:
        with transaction.atomic():
            entry = Entry.objects.create(id=_new_id(), **fields)
            entry.stored_bytes, entry.size_bytes = _insert_chunks(entry.pk, encode_iter(content))
            Entry.objects.filter(pk=entry.pk).update(stored_bytes=entry.stored_bytes, size_bytes=entry.size_bytes)
            return entry

    for _attempt in range(3):
        try:
            return _retry_when_locked(store)
        except IntegrityError:
            # Two random 64-bit ids collided; draw again.
            continue
    raise DomainError("Could not allocate a scratchpad id.")


def _summary(content: str | bytes) -> str:
    if isinstance(content, bytes):
        return binary_summary(content)
    chars = settings.SCRATCHPAD_SUMMARY_CHARS  # scaled to the window (LM-2)
    return text_summary(content, head=chars, tail=chars)


def _insert_chunks(entry_id: str, chunks: Iterator[EncodedChunk]) -> tuple[int, int]:
    """Write the chunks as they are compressed; returns (bytes stored, bytes of content)."""
    stored = raw = 0
    if connection.vendor == "postgresql":
        # Binary COPY: the ORM would send each blob as escaped text, which costs more than compressing it.
        connection.ensure_connection()
        columns = "entry_id, index, char_start, char_count, line_start, line_count, data"
        with (
            connection.connection.cursor() as cursor,
            cursor.copy(f"COPY {Chunk._meta.db_table} ({columns}) FROM STDIN (FORMAT BINARY)") as copy,
        ):
            copy.set_types(["text", "int4", "int8", "int4", "int8", "int4", "bytea"])
            for chunk in chunks:
                stored += len(chunk.data)
                raw += chunk.raw_size
                copy.write_row(
                    (
                        entry_id,
                        chunk.index,
                        chunk.char_start,
                        chunk.char_count,
                        chunk.line_start,
                        chunk.line_count,
                        chunk.data,
                    )
                )
        return stored, raw
    batch: list[Chunk] = []
    for chunk in chunks:
        stored += len(chunk.data)
        raw += chunk.raw_size
        batch.append(
            Chunk(
                entry_id=entry_id,
                index=chunk.index,
                char_start=chunk.char_start,
                char_count=chunk.char_count,
                line_start=chunk.line_start,
                line_count=chunk.line_count,
                data=chunk.data,
            )
        )
        if len(batch) == _INSERT_BATCH:
            Chunk.objects.bulk_create(batch)
            batch = []
    Chunk.objects.bulk_create(batch)
    return stored, raw


def _normalise(content: str | bytes, kind: str | None) -> str | bytes:
    """Text stays text only if it is valid UTF-8; anything else is kept as exact bytes."""
    if isinstance(content, bytearray | memoryview):
        content = bytes(content)
    if isinstance(content, bytes):
        if kind == Entry.Kind.TEXT:
            try:
                return content.decode("utf-8")
            except UnicodeDecodeError:
                return content
        return content
    if not isinstance(content, str):
        raise DomainError(f"content must be text or bytes; got {type(content).__name__}.")
    try:
        content.encode("utf-8")
    except UnicodeEncodeError:
        return content.encode("utf-8", "surrogateescape")
    return content.encode("utf-8") if kind == Entry.Kind.BINARY else content


def put_observation(
    *,
    turn_id: str,
    step_num: int,
    executor_name: str,
    observation: dict[str, Any],
    threshold: int,
    run_id: int | None = None,
    conversation_id: int | None = None,
    ttl_seconds: int | None = None,
    now: datetime | None = None,
) -> tuple[Entry | None, dict[str, Any]]:
    """Offload one large observation (SP-1); returns the entry and the synthetic observation (SP-3).

    When the owner's scratchpad has no room for it, even once their expired entries are collected,
    nothing is stored: the entry is None and the observation is its summary with a note saying so.
    """
    payload: Payload = split_observation(observation, threshold=threshold)
    ok = observation.get("ok") is not False
    stored = put_within_quota(
        turn_id=turn_id,
        content=payload.content,
        kind=payload.kind,
        step_num=step_num,
        executor_name=executor_name,
        ttl_seconds=ttl_seconds,
        run_id=run_id,
        conversation_id=conversation_id,
        metadata=payload.metadata,
        payload_field=payload.field,
        payload_encoding=payload.encoding,
        envelope=payload.envelope,
        now=now,
    )
    if isinstance(stored, Entry):
        return stored, synthetic_observation(
            entry_id=stored.pk, step=step_num, payload=payload, summary=stored.summary, ok=ok
        )
    return None, unstored_observation(
        step=step_num,
        payload=payload,
        summary=_summary(payload.content),
        full=full_scratchpad_note(stored),
        ok=ok,
    )


def put_within_quota(*, now: datetime | None = None, **fields: Any) -> Entry | selectors.Usage:
    """`put(**fields)` when the entry's owner has room for it, once her expired entries are collected;
    else nothing is stored and her usage says why. An entry that belongs to no user is not bounded."""
    now = now or timezone.now()
    owner = selectors.owner_of(run_id=fields.get("run_id"), conversation_id=fields.get("conversation_id"))
    if owner is None:
        return put(now=now, **fields)
    content = _normalise(fields["content"], fields.get("kind"))
    needed = len(content) if isinstance(content, bytes) else len(content.encode("utf-8", "surrogatepass"))
    return _within_quota(owner, needed, now, lambda: put(now=now, **fields))


def full_scratchpad_note(usage: selectors.Usage) -> str:
    """How full the owner's scratchpad is and what frees it, for a result that could not be kept."""
    return scratchpad_full(
        used_bytes=usage.size_bytes,
        quota_bytes=quota_bytes(),
        next_expiry=None if usage.next_expiry is None else f"{usage.next_expiry.astimezone(UTC):%Y-%m-%d %H:%M} UTC",
    )


def _within_quota(owner: int, needed: int, now: datetime, store: Callable[[], Entry]) -> Entry | selectors.Usage:
    """`store()` if the owner's entries leave room for `needed` more bytes, else the owner's usage.

    The owner's expired entries are collected first when they are in the way; nobody else's.
    One owner's check and write are serialised, so parallel tool calls cannot all pass the
    check and overshoot together; other owners do not wait.
    """
    limit = quota_bytes()

    def attempt() -> Entry | selectors.Usage:
        with transaction.atomic():
            if connection.vendor == "postgresql":
                key = f"scratchpad-quota:{owner}"
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [key])
            # SQLite: the transaction is IMMEDIATE (controlcenter/settings.py), which serialises writers already.
            usage = selectors.owner_usage(owner_id=owner, now=now)
            if usage.size_bytes + needed > limit and gc(now=now, owner_id=owner):
                usage = selectors.owner_usage(owner_id=owner, now=now)
            if usage.size_bytes + needed > limit:
                logger.warning(
                    "scratchpad quota: user %s holds %d of %d bytes; an observation of %d bytes was not stored",
                    owner,
                    usage.size_bytes,
                    limit,
                    needed,
                )
                return usage
            return store()

    return _retry_when_locked(attempt)


def read(
    *,
    entry_id: str,
    turn_id: str,
    arguments: dict[str, Any],
    conversation_id: int | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """One `scratchpad_read` within a turn's scope; bad input is an error observation."""
    arguments = {**arguments, "scratchpad_id": entry_id}

    def open_entry(requested: str) -> selectors.DbChunkSource | None:
        entry = selectors.entry_for_turn(entry_id=requested, turn_id=turn_id, conversation_id=conversation_id, now=now)
        return None if entry is None else selectors.DbChunkSource(entry)

    return run_read(
        arguments, open_entry, max_chars=read_max_chars(), grep_timeout_seconds=DEFAULT_GREP_TIMEOUT_SECONDS
    )


_INT_PARAMS = ("n", "start", "end", "context", "max_matches")


def slice_arguments(params: Mapping[str, str], entry_id: str) -> dict[str, Any]:
    """`scratchpad_read` arguments from query parameters (strings); a bad value is a DomainError."""
    arguments: dict[str, Any] = {"scratchpad_id": entry_id}
    for name, raw in params.items():
        if name in _INT_PARAMS:
            try:
                arguments[name] = int(raw)
            except ValueError:
                raise DomainError(f"{name} must be an integer; got {raw!r}.") from None
        elif name == "ignore_case":
            if raw.lower() not in ("true", "false", "1", "0"):
                raise DomainError(f"ignore_case must be true or false; got {raw!r}.")
            arguments[name] = raw.lower() in ("true", "1")
        elif name in ("limit", "offset", "format"):
            continue
        else:
            arguments[name] = raw
    return arguments


def read_slice(*, entry: Entry, params: Mapping[str, str]) -> dict[str, Any]:
    """A slice of `entry` a person asked for (REST API, viewer page), with the tool's modes and no turn
    scope: the caller has checked that the entry is theirs. Bad input is a DomainError."""
    source = selectors.DbChunkSource(entry)
    result = run_read(slice_arguments(params, entry.pk), lambda requested: source if requested == entry.pk else None)
    if not result["ok"]:
        raise DomainError(result["error"])
    return result


def list_for_turn(*, turn_id: str, conversation_id: int | None = None, now: datetime | None = None) -> list[Entry]:
    """The live entries the turn may see: its own, plus its conversation's pinned ones (SP-11)."""
    return list(selectors.entries_visible_to_turn(turn_id=turn_id, conversation_id=conversation_id, now=now))


def full_content(entry: Entry) -> str | bytes:
    source = selectors.DbChunkSource(entry)
    parts = [chunk.value for chunk in source.chunks(0)]
    # A binary entry's chunks are bytes, any other's str: one kind per entry.
    return (b"" if entry.kind == Entry.Kind.BINARY else "").join(parts)  # type: ignore[arg-type]


def full_observation(entry: Entry) -> Any:
    """The observation exactly as the tool returned it, rebuilt from storage (SP-9)."""
    content = full_content(entry)
    if not entry.payload_encoding:
        return content
    return rebuild_observation(
        content=content, field=entry.payload_field, encoding=entry.payload_encoding, envelope=entry.envelope
    )


def gc(*, now: datetime | None = None, owner_id: int | None = None) -> int:
    """Delete expired entries (only `owner_id`'s, given one); safe to run from several workers at once (SP-10).

    Expired rows are locked with SKIP LOCKED, so two collectors split the work
    instead of waiting on each other, and a live entry (a fresh put, a pin that just
    extended one) never matches `expires_at <= now`.
    """
    now = now or timezone.now()
    expired = Entry.objects.filter(expires_at__lte=now)
    if owner_id is None:
        return _collect(expired, now)
    # By id: locking the rows of a join would lock the user's conversations and runs as well.
    scopes = selectors.owner_scopes(owner_id=owner_id)
    return sum(_collect(expired.filter(pk__in=scope.values("pk")), now) for scope in scopes)


def _collect(expired: QuerySet[Entry], now: datetime) -> int:
    def collect_batch() -> int | None:
        with transaction.atomic():
            ids = list(expired.select_for_update(skip_locked=True).values_list("id", flat=True)[:_GC_BATCH])
            if not ids:
                return None
            Chunk.objects.filter(entry_id__in=ids).delete()
            return Entry.objects.filter(id__in=ids, expires_at__lte=now).delete()[1].get(Entry._meta.label, 0)

    deleted = 0
    while (count := _retry_when_locked(collect_batch)) is not None:
        deleted += count
    return deleted


def pin(*, entry: Entry, ttl_seconds: int | None = None, now: datetime | None = None) -> Entry:
    """Keep an entry for later turns of its conversation, with a longer TTL (SP-11)."""
    now = now or timezone.now()
    ttl = DEFAULT_PINNED_TTL_SECONDS if ttl_seconds is None else _check_ttl(ttl_seconds)
    if entry.conversation_id is None:
        raise Conflict(f"Scratchpad entry {entry.pk} belongs to no conversation and cannot be pinned.")
    with transaction.atomic():
        locked = Entry.objects.select_for_update().filter(pk=entry.pk, expires_at__gt=now).first()
        if locked is None:
            raise NotFound(f"Scratchpad entry {entry.pk} does not exist.")
        locked.pinned = True
        locked.expires_at = max(locked.expires_at, now + timedelta(seconds=ttl))
        locked.save(update_fields=["pinned", "expires_at"])
    return locked
