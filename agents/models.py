from __future__ import annotations

from django.db import models


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    conversation = models.ForeignKey("conversations.Conversation", on_delete=models.CASCADE, related_name="runs")
    # The user message this turn answers; the reply is appended under it.
    trigger = models.ForeignKey("conversations.Message", on_delete=models.CASCADE, related_name="runs")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    provider = models.CharField(max_length=32)
    model = models.CharField(max_length=128)
    worker = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    first_event_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    cancel_requested = models.BooleanField(default=False)

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
    breakpoints = models.JSONField(default=list)
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
