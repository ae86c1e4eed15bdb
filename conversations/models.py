from __future__ import annotations

from django.conf import settings
from django.db import models


class Conversation(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=200)
    # The branch tip (CH-7): the path from the root to this message is the conversation.
    tip = models.ForeignKey("Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # Provenance of a fork (CH-8); the fork shares no rows with its source.
    forked_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks")
    # What the next run uses (the page's pickers): a name from CC_MODELS, blank for the server
    # default (CC_MODEL); a catalog mode, none for the default (the mode named `default`, if any).
    model = models.CharField(max_length=128, blank=True)
    mode = models.ForeignKey(
        "toolcatalog.Mode", null=True, blank=True, on_delete=models.SET_NULL, related_name="conversations"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["owner", "-updated_at"])]

    def __str__(self) -> str:
        return self.title


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="children")
    role = models.CharField(max_length=16, choices=Role.choices)
    # Content blocks in the Anthropic shape (text, tool_use, tool_result, image): the
    # canonical form every provider adapter translates from.
    content = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["conversation", "id"])]

    def __str__(self) -> str:
        return f"{self.role} #{self.pk}"


class Checkpoint(models.Model):
    """A label on a clean turn boundary (CH-9), persisted with the transcript so it survives restarts.

    The target cascades: a checkpoint whose message is cut away is dropped, never
    re-pointed at a neighbour, because rewinding "to the label" and landing somewhere
    else is exactly the failure a label exists to prevent.
    """

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="checkpoints")
    label = models.CharField(max_length=64)
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="checkpoints")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["conversation", "label"], name="checkpoint_label_unique")]

    def __str__(self) -> str:
        return f"{self.label} -> #{self.message_id}"


class RewindDigest(models.Model):
    """What an exploration tried before a rewind moved the tip back past it (CH-9)."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="rewinds")
    label = models.CharField(max_length=64)
    target = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="+")
    # The explored tip stays in the tree; this records where the exploration ended.
    explored_tip = models.ForeignKey(Message, null=True, on_delete=models.SET_NULL, related_name="+")
    digest = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"rewind to {self.label}"


class Compaction(models.Model):
    """One pass of the context ladder (CH-1), as a view over the path: nothing is deleted."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="compactions")
    tip = models.ForeignKey(Message, null=True, on_delete=models.SET_NULL, related_name="+")
    # The most expensive rung the pass needed; `steps` has every rung with what it freed.
    rung = models.CharField(max_length=16)
    tokens_before = models.PositiveIntegerField()
    tokens_after = models.PositiveIntegerField()
    # What the pass aimed at (0: every requested rung), so a pass can be re-run and compared (CH-11).
    target_tokens = models.PositiveIntegerField(default=0)
    steps = models.JSONField(default=list)
    # Which message blocks the pass replaced, so it can be inspected and undone.
    replaced = models.JSONField(default=list)
    trigger = models.CharField(max_length=16, default="command")
    # The run whose turn compacted (proactive or reactive); none for /compact, /shake and the API.
    run = models.ForeignKey("agents.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="compactions")
    # The compacted history up to `tip`, as later requests send it: turns after the tip
    # are appended to this view, so the prefix stays stable until the next pass (TD-11).
    view = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"compaction {self.pk} ({self.rung})"
