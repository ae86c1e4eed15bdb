from django.contrib import admin

from agents.models import ModelRequest, Run, Subagent


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


class SubagentInline(admin.TabularInline):
    """A run's fan-out children (TD-14), read-only: they are written by their tasks."""

    model = Subagent
    fk_name = "parent"
    extra = 0
    can_delete = False
    fields = ["fanout_id", "index", "profile", "shape", "status", "task", "error", "started_at", "finished_at"]
    readonly_fields = fields


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "conversation", "status", "provider", "model", "created_at", "finished_at"]
    list_filter = ["status", "provider", "model"]
    raw_id_fields = ["conversation", "trigger"]
    inlines = [SubagentInline, ModelRequestInline]
