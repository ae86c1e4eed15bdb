from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from agents.models import Approval, ModelRequest, Run, Subagent
from agents.resident import MIN_RUNS, resident_recommendation
from controlcenter.admin_base import AuditAdmin
from toolcatalog.admin import ModeAdmin
from toolcatalog.models import Mode, ModeVersion
from toolcatalog.services import ResidentChangeRefused, mode_resident_apply


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
        "cache_reported",
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
    readonly_fields = fields  # type: ignore[assignment]  # flat names, which the stubs' field groups hide

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(AuditAdmin):
    list_display = ["id", "conversation", "status", "provider", "model", "created_at", "finished_at"]
    list_filter = ["status", "provider", "model"]
    raw_id_fields = ["conversation", "trigger"]
    inlines = [SubagentInline, ModelRequestInline]


# The mode page gains the resident-set recommendation (TS-3). It reads runs, so it lives
# here: agents depends on toolcatalog, never the other way round.
admin.site.unregister(Mode)


@admin.register(Mode)
class ModeResidentAdmin(ModeAdmin):
    actions = ["recommend_resident"]

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.resident_view)
        return [path("<int:mode_id>/resident/", view, name="toolcatalog_mode_resident"), *super().get_urls()]

    @admin.action(description="Recommend resident-set changes from recorded use")
    def recommend_resident(self, request: HttpRequest, queryset: QuerySet[Mode]) -> HttpResponse | None:
        if queryset.count() != 1:
            self.message_user(request, "Choose exactly one mode.", messages.ERROR)
            return None
        return HttpResponseRedirect(reverse("admin:toolcatalog_mode_resident", args=[queryset.get().pk]))

    def resident_view(self, request: HttpRequest, mode_id: int) -> HttpResponse:
        mode = get_object_or_404(Mode, pk=mode_id)
        if not self.has_view_permission(request, mode):
            return HttpResponse(status=403)
        recommendation = resident_recommendation(mode=mode)
        if request.method == "POST":
            if not self.has_change_permission(request, mode):
                return HttpResponse(status=403)
            given_version = request.POST.get("version", "")
            try:
                if not given_version.isascii() or not given_version.isdigit():
                    raise ResidentChangeRefused("The form carries no version number; reload the recommendation.")
                version = mode_resident_apply(
                    mode_id=mode.pk,
                    make_resident=request.POST.getlist("make_resident"),
                    make_deferred=request.POST.getlist("make_deferred"),
                    expected_version=int(given_version),
                    applied_by=request.user.get_username(),
                    effect=resident_recommendation(
                        mode=mode,
                        applying=(request.POST.getlist("make_resident"), request.POST.getlist("make_deferred")),
                    ).as_dict(),
                )
            except ResidentChangeRefused as exc:
                self.message_user(request, str(exc), messages.ERROR)
            else:
                self.message_user(request, f"Mode {mode.name} is now at version {version.version}.", messages.SUCCESS)
            return HttpResponseRedirect(request.path)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Resident set of {mode.name}",
            "mode": mode,
            "rec": recommendation,
            "min_runs": MIN_RUNS,
            "next_version": mode.version + 1,
            "versions": ModeVersion.objects.filter(mode=mode)[:20],
        }
        return TemplateResponse(request, "admin/toolcatalog/mode/resident.html", context)


@admin.register(ModelRequest)
class ModelRequestAdmin(AuditAdmin):
    list_display = ["id", "owner", "run", "step", "model", "input_tokens", "cache_read_input_tokens", "output_tokens"]
    list_filter = ["model"]
    raw_id_fields = ["run", "owner"]


@admin.register(Approval)
class ApprovalAdmin(AuditAdmin):
    """Every tool call that waited for a person, with its decision; decided on the conversation page
    or through `POST /api/approvals/<id>/approve/` (RN-4)."""

    list_display = ["id", "run", "subagent", "tool_name", "status", "decided_by", "decided_at", "created_at"]
    list_filter = ["status", "tool_name"]
    search_fields = ["tool_name"]
    raw_id_fields = ["run", "subagent"]
