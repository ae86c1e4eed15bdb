from __future__ import annotations

from django.db import models


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        # Paused until a person decides on a tool call (RN-4); `pending_turn` holds the partial turn.
        WAITING = "waiting"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    conversation = models.ForeignKey("conversations.Conversation", on_delete=models.CASCADE, related_name="runs")
    # The user message this turn answers; the reply is appended under it.
    trigger = models.ForeignKey("conversations.Message", on_delete=models.CASCADE, related_name="runs")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    provider = models.CharField(max_length=32)
    model = models.CharField(max_length=128)
    # The conversation's mode when the run was started (its tool filter, TD-8); none is the default.
    mode = models.ForeignKey("toolcatalog.Mode", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    worker = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    first_event_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    cancel_requested = models.BooleanField(default=False)
    # The messages this turn produced before it paused for approval (RN-4). Kept here, not in
    # the transcript, which is written only at the turn boundary (CH-5).
    pending_turn = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.status})"

    @property
    def retryable(self) -> bool:
        # A turn is written whole or not at all, so any run that ended without a reply can run again.
        return self.status in (self.Status.FAILED, self.Status.CANCELLED)

    @property
    def is_finished(self) -> bool:
        return self.status in (self.Status.SUCCEEDED, self.Status.FAILED, self.Status.CANCELLED)


class RunEvent(models.Model):
    """The run's event log, so a client that connects late can catch up."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=32)
    payload = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="run_event_seq_unique")]

    def __str__(self) -> str:
        return f"run {self.run_id} event {self.seq} {self.type}"


class ModelRequest(models.Model):
    """One request to the model, with usage as the provider reported it (RN-2)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="model_requests")
    step = models.PositiveIntegerField()
    model = models.CharField(max_length=128)
    input_tokens = models.PositiveIntegerField(default=0)
    cache_creation_input_tokens = models.PositiveIntegerField(default=0)
    cache_read_input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    # The TTL split of cache_creation_input_tokens, as the provider reports it (RN-2).
    cache_creation_5m_input_tokens = models.PositiveIntegerField(default=0)
    cache_creation_1h_input_tokens = models.PositiveIntegerField(default=0)
    request_id = models.CharField(max_length=128, blank=True)
    # "<fan-out id>/<child index>" for a subagent's request, recorded under its parent run (TD-14).
    subagent = models.CharField(max_length=64, blank=True)
    breakpoints = models.JSONField(default=list)
    # Deferred tools this request loaded for the first time (tool_reference blocks new since the last request).
    tools_loaded = models.JSONField(default=list)
    # "tool_activation": the provider has no deferred loading, so loading tools changed the cached
    # prefix and this request could not read what the previous one wrote (TD-11); "" otherwise.
    cache_miss = models.CharField(max_length=32, blank=True)
    stop_reason = models.CharField(max_length=32, blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "step"]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step}"

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens


class Approval(models.Model):
    """A person's decision on one tool call of a paused run (RN-4)."""

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        DENIED = "denied"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    tool_use_id = models.CharField(max_length=128)
    tool_name = models.CharField(max_length=128)
    input = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    decided_by = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="tool_approvals"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "tool_use_id"], name="approval_run_tool_use_unique")]

    def __str__(self) -> str:
        return f"approval {self.pk} of {self.tool_name} in run {self.run_id} ({self.status})"
