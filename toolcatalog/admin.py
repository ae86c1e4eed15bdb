from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, QueryDict

from controlcenter.admin_base import AuditAdmin, ModelAdmin
from toolcatalog.mcp_config import HIDDEN_VALUE, hidden, merged_secrets
from toolcatalog.models import McpServer, Mode, RetrievalMiss, Tool, ToolActivation, ToolGroup
from toolcatalog.services import (
    McpImportResult,
    McpServerImportFailed,
    mcp_server_apply_listing,
    mcp_server_import,
    mcp_server_listing,
    tools_set_resident,
)


@admin.register(ToolGroup)
class ToolGroupAdmin(ModelAdmin):
    list_display = ["heading", "order"]
    list_editable = ["order"]
    search_fields = ["heading"]


@admin.register(Tool)
class ToolAdmin(ModelAdmin):
    list_display = [
        "name",
        "group",
        "resident",
        "requires_approval",
        "max_calls_per_run",
        "enabled",
        "source",
        "server",
        "schema_tokens",
    ]
    list_filter = ["resident", "requires_approval", "enabled", "source", "group", "server", "server_missing"]
    search_fields = ["name", "description", "group__heading"]
    list_select_related = ["group", "server"]
    readonly_fields = ["schema_tokens", "server_missing", "updated_at"]
    actions = ["make_resident", "make_deferred"]

    def get_readonly_fields(self, request: HttpRequest, obj: Tool | None = None) -> list[str]:
        # A built-in's name and schema are its implementation's, an MCP tool's its server's (the next
        # refresh would put them back): an edit would offer the model arguments nothing takes.
        fixed: dict[str, list[str]] = {
            Tool.Source.BUILT_IN: ["name", "input_schema", "source"],
            Tool.Source.MCP: ["name", "input_schema", "server", "source"],
        }
        return [*self.readonly_fields, *fixed.get(obj.source if obj else "", [])]

    @admin.display(description="schema tokens")
    def schema_tokens(self, tool: Tool) -> int:
        return tool.schema_tokens

    @admin.action(description="Make the selected tools resident")
    def make_resident(self, request: HttpRequest, queryset: QuerySet[Tool]) -> None:
        count = tools_set_resident(tool_ids=queryset.values_list("pk", flat=True), resident=True)
        self.message_user(request, f"{count} tools are now resident.", messages.SUCCESS)

    @admin.action(description="Make the selected tools deferred (not resident)")
    def make_deferred(self, request: HttpRequest, queryset: QuerySet[Tool]) -> None:
        count = tools_set_resident(tool_ids=queryset.values_list("pk", flat=True), resident=False)
        self.message_user(request, f"{count} tools are now deferred.", messages.SUCCESS)


@admin.register(Mode)
class ModeAdmin(ModelAdmin):
    list_display = ["name", "output_action", "allow", "deny", "version"]
    search_fields = ["name", "description", "output_action"]
    # Changed only as a new version, from the resident-set recommendation (agents/admin.py, TS-3).
    readonly_fields = ["resident_add", "resident_remove", "version"]


class HttpsByDefaultURLField(forms.URLField):
    """An endpoint typed without a scheme is https: assuming http would send the server's headers,
    bearer tokens included, in clear text. Django's own guess (`assume_scheme`) reads the host of
    `mcp.example.com:8443/mcp` as a scheme and refuses the address; it is set only because Django 5
    warns on every form built without a choice."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(assume_scheme="https", **kwargs)

    def to_python(self, value: Any) -> str | None:
        text = str(value or "").strip()
        return super().to_python(f"https://{text}" if text and "://" not in text else text)


class McpServerForm(forms.ModelForm):
    """env and headers are write-only (MC-3): shown as "***" (or their ${VAR} reference); "***" keeps a value."""

    url = HttpsByDefaultURLField(
        required=False,
        max_length=McpServer._meta.get_field("url").max_length,
        help_text=McpServer._meta.get_field("url").help_text,
    )

    class Meta:
        model = McpServer
        fields = ["name", "transport", "command", "args", "env", "cwd", "url", "headers", "network", "enabled"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.initial["env"] = hidden(self.instance.env)
            self.initial["headers"] = hidden(self.instance.headers)
        for field in ("args", "env", "headers"):
            if field in self.fields:  # a view-only user's form has none
                self.fields[field].required = False

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        assert data is not None  # ModelForm.clean returns cleaned_data; the stubs allow None for overrides
        stored = McpServer.objects.filter(pk=self.instance.pk).first() if self.instance.pk else None
        for field, what in (("env", "environment variable"), ("headers", "header")):
            given = data.get(field) or {}
            if isinstance(given, dict):
                try:
                    data[field] = merged_secrets(getattr(stored, field, None) or {}, given, what)
                except ValueError as exc:
                    self.add_error(field, str(exc))
        for field, default in (("args", []), ("env", {}), ("headers", {})):
            if data.get(field) in (None, ""):
                data[field] = default
        return data

    def full_clean(self) -> None:
        super().full_clean()
        if self.is_bound and self.errors:
            self._hide_typed_secrets()

    def _hide_typed_secrets(self) -> None:
        """A refused form is drawn again from what was typed: its env and headers values go back as
        "***" (names and ${VAR} references kept), as a password field is never drawn with its value.

        "***" keeps a value already stored, so the form says which values it did not keep: sent back
        as drawn, a rotated token would silently stay the old one. Text that is not a JSON object
        cannot be shown in part, so none of it is shown."""
        # A QueryDict from a request (immutable, so copied); a plain dict from code.
        data = self.data.copy() if isinstance(self.data, QueryDict) else dict(self.data)
        for field in ("env", "headers"):
            typed = data.get(self.add_prefix(field))
            if not typed:
                continue
            try:
                values = json.loads(typed)
            except (ValueError, RecursionError):  # nesting beyond the parser's depth is refused too
                values = None
            if not isinstance(values, dict):
                data[self.add_prefix(field)] = ""
                continue
            strings = {name: value if isinstance(value, str) else "" for name, value in values.items()}
            shown = hidden(strings)
            data[self.add_prefix(field)] = json.dumps(shown)
            if retype := [name for name, value in shown.items() if value == HIDDEN_VALUE != strings[name]]:
                self.add_error(field, f"Not kept, type again: {', '.join(retype)} (a value typed is never drawn back).")
        self.data = data

    def _post_clean(self) -> None:
        # The model's clean sees the merged secrets, not the "***" the form showed.
        for field in ("env", "headers", "args"):
            if field in self.cleaned_data:
                setattr(self.instance, field, self.cleaned_data[field])
        super()._post_clean()  # type: ignore[misc]  # a private hook of Django's forms the stubs leave out
        # All or nothing, as the API (MC-1): an enabled server is saved only once it has listed its
        # tools, and the form says why it could not.
        self.listing = None
        if not self.errors and self.instance.enabled:
            try:
                self.listing = mcp_server_listing(self.instance)
            except McpServerImportFailed as exc:
                self.add_error(None, exc.message)


@admin.register(McpServer)
class McpServerAdmin(ModelAdmin):
    form = McpServerForm
    list_display = ["name", "transport", "command", "enabled", "tool_count"]
    list_filter = ["transport", "enabled"]
    search_fields = ["name", "command"]
    actions = ["import_tools"]

    @admin.display(description="tools")
    def tool_count(self, server: McpServer) -> int:
        return server.tools.filter(enabled=True).count()

    def get_fields(self, request: HttpRequest, obj: McpServer | None = None) -> Any:
        fields = list(super().get_fields(request, obj))
        if obj is not None and not self.has_change_permission(request, obj):
            # Drawn read-only from the row itself, env and headers would show every secret (MC-3).
            hidden_as = {"env": "env_names", "headers": "header_names"}
            return [hidden_as.get(name, name) if isinstance(name, str) else name for name in fields]
        return fields

    @admin.display(description="env")
    def env_names(self, server: McpServer) -> str:
        return json.dumps(hidden(server.env))

    @admin.display(description="headers")
    def header_names(self, server: McpServer) -> str:
        return json.dumps(hidden(server.headers))

    def save_model(self, request: HttpRequest, obj: McpServer, form: Any, change: bool) -> None:
        # The admin saves inside one transaction: the server and its tools are stored together.
        super().save_model(request, obj, form, change)
        if form.listing is not None:
            self._report(request, obj, mcp_server_apply_listing(server=obj, listed=form.listing))

    @admin.action(description="Import (refresh) the tools of the selected servers")
    def import_tools(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset:
            self._import(request, server)

    def _import(self, request: HttpRequest, server: McpServer) -> None:
        try:
            result = mcp_server_import(server=server)
        except McpServerImportFailed as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return
        self._report(request, server, result)

    def _report(self, request: HttpRequest, server: McpServer, result: McpImportResult) -> None:
        level = messages.WARNING if result.refused else messages.SUCCESS
        self.message_user(request, f"{server.name}: {result.summary()}", level)


@admin.register(ToolActivation)
class ToolActivationAdmin(AuditAdmin):
    list_display = ["run", "tool_name", "trigger", "query", "created_at"]
    list_filter = ["trigger"]
    search_fields = ["tool_name", "query"]
    raw_id_fields = ["run"]


@admin.register(RetrievalMiss)
class RetrievalMissAdmin(AuditAdmin):
    list_display = ["run", "query", "created_at"]
    search_fields = ["query"]
    raw_id_fields = ["run"]
