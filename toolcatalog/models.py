# Models arrive with the tool-catalog issue (TD-1 … TD-10).


# ---------------------------------------------------------------------------
# Built-in tool state (branch `tools`): long-term memory and the task list.
# Kept at the end of the file so the catalog models above merge cleanly.
# ---------------------------------------------------------------------------
from django.conf import settings  # noqa: E402
from django.db import models  # noqa: E402


class Memory(models.Model):
    """One fact saved by save_memory; searched by search_memory. Always one user's own."""

    class Scope(models.TextChoices):
        USER = "user"
        PROJECT = "project"
        GLOBAL = "global"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memories")
    # The conversation it was saved from; a `project` memory is recalled by that scope label.
    conversation = models.ForeignKey(
        "conversations.Conversation", null=True, blank=True, on_delete=models.SET_NULL, related_name="memories"
    )
    scope = models.CharField(max_length=16, choices=Scope.choices, default=Scope.USER)
    content = models.TextField()
    tags = models.JSONField(default=list, blank=True)
    source = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["owner", "-created_at"]), models.Index(fields=["expires_at"])]

    def __str__(self) -> str:
        return self.content[:60]


class TodoItem(models.Model):
    """An item of a task list: a conversation's, or (conversation null) a user's MCP workspace list."""

    class Status(models.TextChoices):
        PENDING = "pending"
        IN_PROGRESS = "in_progress"
        COMPLETED = "completed"
        CANCELLED = "cancelled"

    class Priority(models.TextChoices):
        HIGH = "high"
        MEDIUM = "medium"
        LOW = "low"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="todo_items")
    conversation = models.ForeignKey(
        "conversations.Conversation", null=True, blank=True, on_delete=models.CASCADE, related_name="todo_items"
    )
    content = models.TextField()
    priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.MEDIUM)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["owner", "conversation", "id"])]

    def __str__(self) -> str:
        return f"[{self.status}] {self.content[:60]}"
