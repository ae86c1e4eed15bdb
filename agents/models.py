from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

# A run or subagent in one of these holds its conversation: the one definition of "still running".
ACTIVE_STATUSES = ("queued", "running", "waiting")
FINISHED_STATUSES = ("succeeded", "failed", "cancelled")


class RunQuerySet(models.QuerySet["Run"]):
    def active(self) -> RunQuerySet:
        """Runs still holding their conversation; `conversation.runs.active()` reads the same rule."""
        return self.filter(status__in=ACTIVE_STATUSES)


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
    # Protected: a mode deleted under a queued run let it run under the default mode, every tool its
    # mode denied offered again, and a past run lost which mode it ran (QA). Runs are audit data.
    mode = models.ForeignKey("toolcatalog.Mode", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    worker = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # When it last became queued: created, its approvals decided, or its turn handed off by a
    # stopping worker (OP-2, OP-4). What "queued too long" (the sweep, /healthz) is measured from.
    queued_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    # Refreshed by the run's own worker each heartbeat (CH-5): the reaper fails a run only when its
    # worker is missing from the Redis live set AND this is a TTL old, so a live set that is wrong
    # (Redis unreachable from that one worker, another deployment's Redis) never fails a live run.
    vouched_at = models.DateTimeField(null=True, blank=True)
    first_event_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    cancel_requested = models.BooleanField(default=False)
    # The messages this turn produced before it paused for approval (RN-4). Kept here, not in
    # the transcript, which is written only at the turn boundary (CH-5).
    pending_turn = models.JSONField(null=True, blank=True)
    # A compaction run (CH-14: the summary rung asked for through the API or `/compact summary`): the
    # rungs to climb over the path to `trigger`, in a worker, since the web process never calls a
    # model (RN-1). Null for an agent turn.
    compact_rungs = models.JSONField(null=True, blank=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.status})"

    @property
    def retryable(self) -> bool:
        # A failed turn is not written and a cancelled one only up to where it stopped (every
        # call answered), so either can run again: from its prompt, or from where it stopped.
        return self.status in (self.Status.FAILED, self.Status.CANCELLED)

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES


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

    # What was paid for stays when its conversation (or the prompt its run answered) is deleted: the
    # owner's usage and costs of past days do not change after the fact. The run is then gone.
    run = models.ForeignKey(Run, null=True, on_delete=models.SET_NULL, related_name="model_requests")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    step = models.PositiveIntegerField()
    model = models.CharField(max_length=128)
    input_tokens = models.PositiveIntegerField(default=0)
    cache_creation_input_tokens = models.PositiveIntegerField(default=0)
    cache_read_input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    # The TTL split of cache_creation_input_tokens, as the provider reports it (RN-2).
    cache_creation_5m_input_tokens = models.PositiveIntegerField(default=0)
    cache_creation_1h_input_tokens = models.PositiveIntegerField(default=0)
    # Where the figures come from (LM-1): "reported" by the provider, or counted when it sent none,
    # with the model server's "tokenizer" or our "estimate"; the last two are shown as estimated.
    usage_source = models.CharField(max_length=16, default="reported")
    # False when the server reported no cache figures (llama.cpp's): the request counts in token
    # totals but in no cache ratio, which would otherwise read as a measured 0 % (`agents.usage`).
    cache_reported = models.BooleanField(default=True)
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
    # The runtime's own count of the whole request (CH-12), set beside what the provider measured,
    # so the next estimate of the conversation can be calibrated and the error audited.
    estimated_tokens = models.PositiveIntegerField(default=0)
    # The same count by part (`engine.context.transcript.RequestCount`): calibration scales the
    # heuristic parts and leaves the tool-use system prompt and images, counted by formula, alone.
    estimated_parts = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "step", "id"]  # a retried attempt before its retry

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.owner_id is None and self.run is not None:
            self.owner_id = self.run.conversation.owner_id
        super().save(*args, **kwargs)

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens

    @property
    def usage_estimated(self) -> bool:
        return self.usage_source != "reported"


class Approval(models.Model):
    """A person's decision on one tool call of a paused run (RN-4)."""

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        DENIED = "denied"
        # The run or subagent stopped waiting (cancelled, timed out) before anyone decided.
        EXPIRED = "expired"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    tool_use_id = models.CharField(max_length=128)
    tool_name = models.CharField(max_length=128)
    input = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    # Set when the call is a subagent's (TD-14): `run` is then its parent run, whose owner decides.
    subagent = models.ForeignKey("Subagent", null=True, blank=True, on_delete=models.CASCADE, related_name="approvals")
    decided_by = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="tool_approvals"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "id"]
        # Tool-use ids are unique per caller: the run itself, or one of its subagents (whose
        # model may well produce the same ids as a sibling given the same task).
        constraints = [
            models.UniqueConstraint(
                fields=["run", "tool_use_id"],
                condition=models.Q(subagent__isnull=True),
                name="approval_run_tool_use_unique",
            ),
            models.UniqueConstraint(
                fields=["subagent", "tool_use_id"],
                condition=models.Q(subagent__isnull=False),
                name="approval_subagent_tool_use_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"approval {self.pk} of {self.tool_name} in run {self.run_id} ({self.status})"


class Subagent(models.Model):
    """One child of a `spawn_agents` fan-out (TD-14), run by its own task under its parent run.

    Not a Run: it answers the parent's tool call, not a message, and writes nothing to the
    transcript. It has a run's lifecycle all the same, so it can pause for approval (RN-4)
    and be resumed by any worker: `pending_turn` holds its partial turn while it waits.
    """

    parent = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="subagents")
    fanout_id = models.CharField(max_length=32, db_index=True)
    index = models.PositiveSmallIntegerField()
    count = models.PositiveSmallIntegerField()
    shape = models.CharField(max_length=32)
    profile = models.CharField(max_length=32)
    task = models.TextField()
    status = models.CharField(max_length=16, choices=Run.Status.choices, default=Run.Status.QUEUED, db_index=True)
    worker = models.CharField(max_length=255, blank=True)
    cancel_requested = models.BooleanField(default=False)
    pending_turn = models.JSONField(null=True, blank=True)
    # The child's final text, whole; the parent decides what of it goes inline (SP-1).
    answer = models.TextField(blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # As Run.queued_at: created, or its approvals decided.
    queued_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    # As Run.vouched_at.
    vouched_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["parent", "fanout_id", "index"]
        constraints = [models.UniqueConstraint(fields=["fanout_id", "index"], name="subagent_fanout_index_unique")]

    def __str__(self) -> str:
        return f"subagent {self.fanout_id}/{self.index} of run {self.parent_id} ({self.status})"

    @property
    def label(self) -> str:
        # How its model requests are recorded under the parent run (ModelRequest.subagent).
        return f"{self.fanout_id}/{self.index}"

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES


class ConversationToolPins(models.Model):
    """The imported tools as a conversation first saw them (MC-4), taken at its first turn.

    Later turns build their surface from these definitions, so a refresh of an MCP server never
    rewrites a running conversation's tools; a new conversation takes the catalog as it is then.
    """

    conversation = models.OneToOneField(
        "conversations.Conversation", on_delete=models.CASCADE, related_name="tool_pins"
    )
    # Qualified tool name -> engine.catalog.pins.pin_of(record).
    pins = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"tool pins of conversation {self.conversation_id}"
