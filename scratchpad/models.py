"""Scratchpad entries: large observations parked for the turn (SP-2, SP-12).

An Entry holds the metadata and the envelope of the observation; its content lives
in Chunk rows, compressed one by one, each with its character offset and newline
counts so that reads touch only the chunks they need.
"""

from __future__ import annotations

from django.db import models


class Entry(models.Model):
    class Kind(models.TextChoices):
        TEXT = "text"
        BINARY = "binary"

    id = models.CharField(primary_key=True, max_length=16, editable=False)
    # The run's id: one run is one agent turn.
    turn_id = models.CharField(max_length=64, db_index=True)
    run = models.ForeignKey("agents.Run", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    conversation = models.ForeignKey(
        "conversations.Conversation", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    # Pinned entries stay readable in later turns of their conversation (SP-11).
    pinned = models.BooleanField(default=False)
    step_num = models.PositiveIntegerField(null=True, blank=True)
    executor_name = models.CharField(max_length=200, blank=True)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    size_bytes = models.BigIntegerField()
    # Characters for text, bytes for binary.
    length = models.BigIntegerField()
    newline_count = models.BigIntegerField(default=0)
    line_count = models.BigIntegerField(default=0)
    chunk_count = models.PositiveIntegerField(default=0)
    stored_bytes = models.BigIntegerField(default=0)
    summary = models.TextField(blank=True)
    # How to rebuild the full observation for references (SP-9): the value's field,
    # how it maps back, and the rest of the observation.
    payload_field = models.CharField(max_length=200, blank=True)
    payload_encoding = models.CharField(max_length=16, blank=True)
    envelope = models.JSONField(default=dict, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name_plural = "entries"
        indexes = [models.Index(fields=["conversation", "pinned"], name="scratchpad_conv_pinned")]

    def __str__(self) -> str:
        return f"{self.id} ({self.kind}, {self.size_bytes} bytes)"


class Chunk(models.Model):
    entry = models.ForeignKey(Entry, on_delete=models.CASCADE, related_name="chunks")
    index = models.PositiveIntegerField()
    char_start = models.BigIntegerField()
    char_count = models.PositiveIntegerField()
    line_start = models.BigIntegerField()
    line_count = models.PositiveIntegerField()
    data = models.BinaryField()

    class Meta:
        ordering = ["entry", "index"]
        constraints = [models.UniqueConstraint(fields=["entry", "index"], name="scratchpad_chunk_unique")]
        indexes = [
            models.Index(fields=["entry", "char_start"], name="scratchpad_chunk_char"),
            models.Index(fields=["entry", "line_start", "index"], name="scratchpad_chunk_line"),
        ]

    def __str__(self) -> str:
        return f"{self.entry_id}#{self.index}"
