"""The tool catalog (TD-1): groups, tools, modes, MCP servers, and what runs loaded (TD-15)."""

from __future__ import annotations

from fnmatch import fnmatchcase

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from engine.catalog.schemas import (
    NAMESPACE_SEPARATOR,
    catalog_name_problem,
    description_problem,
    name_problem,
    qualified_name,
    schema_problem,
)
from engine.tokens import estimate_json_tokens
from toolcatalog.mcp_config import config_problems


class ToolGroup(models.Model):
    heading = models.CharField(max_length=100, unique=True)
    order = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["order", "heading"]

    def __str__(self) -> str:
        return self.heading


class McpServer(models.Model):
    """An external MCP server, configured the way Claude Desktop's `mcpServers` entries are (MC-1).

    `env` and `headers` values are write-only (MC-3): the admin and the API show their
    names only. A value may be a reference to the worker's environment, `${GITHUB_TOKEN}`,
    so that no secret needs to be stored here at all.
    """

    class Transport(models.TextChoices):
        STDIO = "stdio"
        HTTP = "http"

    # Part of the qualified names of its tools, so it follows the tool-name alphabet.
    name = models.SlugField(max_length=40, unique=True)
    transport = models.CharField(max_length=8, choices=Transport.choices)
    command = models.TextField(blank=True, help_text="stdio: the executable that starts the server.")
    args = models.JSONField(default=list, blank=True, help_text='stdio: its arguments, e.g. ["mcp-server-git"].')
    env = models.JSONField(default=dict, blank=True, help_text="stdio: extra environment variables (write-only).")
    cwd = models.CharField(max_length=500, blank=True, help_text="stdio: the working directory (optional).")
    url = models.URLField(blank=True, help_text="http: the Streamable HTTP endpoint.")
    headers = models.JSONField(default=dict, blank=True, help_text="http: request headers (write-only).")
    network = models.BooleanField(
        default=False, help_text="stdio: outbound network for the sandboxed server (off: no network at all)."
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors = config_problems(
            name=self.name,
            transport=self.transport,
            command=self.command,
            args=self.args,
            env=self.env,
            cwd=self.cwd,
            url=self.url,
            headers=self.headers,
            network=self.network,
        )
        if errors:
            raise ValidationError(errors)


class Tool(models.Model):
    class Source(models.TextChoices):
        BUILT_IN = "built-in"
        IMPORTED = "imported"
        MCP = "mcp"

    name = models.CharField(max_length=64)
    group = models.ForeignKey(ToolGroup, on_delete=models.PROTECT, related_name="tools")
    description = models.TextField()
    input_schema = models.JSONField(default=dict)
    resident = models.BooleanField(default=False, db_index=True)
    requires_approval = models.BooleanField(default=False)
    max_calls_per_run = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: no limit.")
    enabled = models.BooleanField(default=True, db_index=True)
    side_effects = models.CharField(max_length=16, blank=True)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.IMPORTED)
    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, null=True, blank=True, related_name="tools")
    # Set by the MCP import when the server stopped listing the tool (it is disabled, not
    # deleted); cleared, and the tool enabled again, when the server lists it again.
    server_missing = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["group__order", "group__heading", "name"]
        constraints = [
            models.UniqueConstraint(fields=["server", "name"], name="tool_name_unique_per_server"),
            models.UniqueConstraint(
                fields=["name"],
                condition=models.Q(server__isnull=True),
                name="tool_name_unique_outside_servers",
                violation_error_message="There is already a tool with this name (outside MCP servers).",
            ),
        ]

    def __str__(self) -> str:
        return self.qualified_name

    def save(self, *args, **kwargs) -> None:
        # The refusal holds for every writer, not just forms: a broken schema would
        # break every request that carries it.
        if problem := schema_problem(self.input_schema):
            raise ValidationError({"input_schema": f"Tool {self.name!r}: {problem}"})
        if self.server_id is None and NAMESPACE_SEPARATOR in self.name:
            raise ValidationError({"name": catalog_name_problem(self.name)})
        super().save(*args, **kwargs)

    @property
    def qualified_name(self) -> str:
        return qualified_name(self.name, self.server.name if self.server is not None else None)

    @property
    def schema_tokens(self) -> int:
        return estimate_json_tokens(self.definition())

    def definition(self) -> dict:
        return {"name": self.qualified_name, "description": self.description, "input_schema": self.input_schema}

    def clean(self) -> None:
        errors = {}
        # An empty name is the form field's own error (required, or too long and dropped).
        check = name_problem if self.server_id else catalog_name_problem
        if self.name and (problem := check(self.name)):
            errors["name"] = problem
        if problem := schema_problem(self.input_schema):
            errors["input_schema"] = problem
        if problem := description_problem(self.description or ""):
            errors["description"] = problem
        if (self.source == self.Source.MCP) != bool(self.server_id):
            errors["server"] = "MCP tools, and only they, belong to an MCP server."
        if errors:
            raise ValidationError(errors)


class Mode(models.Model):
    """Which tools a run may use (fnmatch patterns on qualified names) and what it must call to finish."""

    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    allow = models.JSONField(default=list, blank=True, help_text='fnmatch patterns, e.g. ["*"] or ["git_*"].')
    deny = models.JSONField(default=list, blank=True, help_text="fnmatch patterns; deny wins over allow.")
    output_action = models.CharField(
        max_length=130, blank=True, help_text="Qualified name of the tool that produces the mode's output."
    )
    # The mode's resident set differs from the catalog's flags by these names (TS-3). Changed
    # only through toolcatalog.resident.mode_resident_apply, which records a new ModeVersion.
    resident_add = models.JSONField(default=list, blank=True, help_text="Tools resident in this mode.")
    resident_remove = models.JSONField(default=list, blank=True, help_text="Tools deferred in this mode.")
    version = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        for field in ("allow", "deny"):
            value = getattr(self, field)
            if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
                raise ValidationError({field: 'A list of non-empty fnmatch patterns, e.g. ["git_*"].'})
        if self.output_action and any(fnmatchcase(self.output_action, p) for p in self.deny):
            raise ValidationError({"output_action": "The mode denies its own output action."})
        if self.output_action and not _tool_named(self.output_action):
            # Its runs would be told to finish with a tool nobody can call (QA: 'bogus' was saved).
            missing = f"There is no tool named {self.output_action!r} in the catalog (an MCP tool: SERVER__tool)."
            raise ValidationError({"output_action": missing})


def _tool_named(qualified: str) -> bool:
    server, separator, name = qualified.partition(NAMESPACE_SEPARATOR)
    if separator and Tool.objects.filter(server__name=server, name=name).exists():
        return True
    return Tool.objects.filter(server=None, name=qualified).exists()


class ModeVersion(models.Model):
    """One applied change of a mode's resident set (TS-3): what changed, why, and its measured effect."""

    mode = models.ForeignKey(Mode, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    added = models.JSONField(default=list)
    removed = models.JSONField(default=list)
    effect = models.JSONField(default=dict, help_text="The recommendation's figures when it was applied.")
    applied_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["mode", "-version"]
        constraints = [models.UniqueConstraint(fields=["mode", "version"], name="mode_version_unique")]

    def __str__(self) -> str:
        return f"{self.mode.name} v{self.version}"


class ToolActivation(models.Model):
    """A deferred tool a run loaded, and why (TD-15)."""

    class Trigger(models.TextChoices):
        DIRECT = "direct"
        SEARCH = "search"

    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="tool_activations")
    tool_name = models.CharField(max_length=130)
    trigger = models.CharField(max_length=8, choices=Trigger.choices)
    query = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "id"]

    def __str__(self) -> str:
        return f"run {self.run_id} loaded {self.tool_name} ({self.trigger})"


class RetrievalMiss(models.Model):
    """A search_tools query that activated nothing (TD-15)."""

    run = models.ForeignKey("agents.Run", on_delete=models.CASCADE, related_name="retrieval_misses")
    query = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "id"]
        verbose_name_plural = "retrieval misses"

    def __str__(self) -> str:
        return f"run {self.run_id} found nothing for {self.query[:40]!r}"


class McpCallCount(models.Model):
    """Calls of one limited tool in one MCP session: the MCP endpoint's per-run action limit."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    session_key = models.CharField(max_length=64)
    tool_name = models.CharField(max_length=130)
    count = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "session_key", "tool_name"], name="mcp_call_count_unique")
        ]
        indexes = [models.Index(fields=["updated_at"])]

    def __str__(self) -> str:
        return f"{self.tool_name} x{self.count} in MCP session {self.session_key[:8]}"


# ---------------------------------------------------------------------------
# Built-in tool state (branch `tools`): long-term memory and the task list.
#
# ---------------------------------------------------------------------------


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
