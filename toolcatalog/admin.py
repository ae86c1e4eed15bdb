from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from controlcenter.audit_admin import AuditAdmin
from toolcatalog.models import McpServer, Mode, RetrievalMiss, Tool, ToolActivation, ToolGroup
from toolcatalog.services import McpServerImportFailed, mcp_server_import, tools_set_resident


@admin.register(ToolGroup)
class ToolGroupAdmin(admin.ModelAdmin):
    list_display = ["heading", "order"]
    list_editable = ["order"]
    search_fields = ["heading"]


@admin.register(Tool)
class ToolAdmin(admin.ModelAdmin):
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
class ModeAdmin(admin.ModelAdmin):
    list_display = ["name", "output_action", "allow", "deny"]
    search_fields = ["name", "description", "output_action"]


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin):
    list_display = ["name", "transport", "command", "url", "enabled"]
    list_filter = ["transport", "enabled"]
    search_fields = ["name", "command", "url"]
    actions = ["import_tools"]

    @admin.action(description="Import the tools of the selected servers")
    def import_tools(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset:
            try:
                result = mcp_server_import(server=server)
            except McpServerImportFailed as exc:
                self.message_user(request, exc.message, messages.ERROR)
                continue
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
