from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from agents.models import Approval, ModelRequest, Run, Subagent
from controlcenter.audit_admin import AuditAdmin


class ModelRequestInline(admin.TabularInline):
    model = ModelRequest
    extra = 0
    can_delete = False
    readonly_fields = [
        "step",
        "model",
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "output_tokens",
        "breakpoints",
        "stop_reason",
        "duration_ms",
    ]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class SubagentInline(admin.TabularInline):
    """A run's fan-out children (TD-14), read-only: they are written by their tasks."""

    model = Subagent
    fk_name = "parent"
    extra = 0
    can_delete = False
    fields = ["fanout_id", "index", "profile", "shape", "status", "task", "error", "started_at", "finished_at"]
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(AuditAdmin):
    list_display = ["id", "conversation", "status", "provider", "model", "created_at", "finished_at"]
    list_filter = ["status", "provider", "model"]
    raw_id_fields = ["conversation", "trigger"]
    inlines = [SubagentInline, ModelRequestInline]


@admin.register(ModelRequest)
class ModelRequestAdmin(AuditAdmin):
    list_display = ["id", "run", "step", "model", "input_tokens", "cache_read_input_tokens", "output_tokens"]
    list_filter = ["model"]
    raw_id_fields = ["run"]


@admin.register(Approval)
class ApprovalAdmin(AuditAdmin):
    """Every tool call that waited for a person, with its decision; decided on the conversation page
    or through `POST /api/approvals/<id>/approve/` (RN-4)."""

    list_display = ["id", "run", "subagent", "tool_name", "status", "decided_by", "decided_at", "created_at"]
    list_filter = ["status", "tool_name"]
    search_fields = ["tool_name"]
    raw_id_fields = ["run", "subagent"]
