from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from controlcenter.admin_base import ModelAdmin
from engine.scratchpad.reader import read_slice
from scratchpad import selectors
from scratchpad.models import Entry

PREVIEW_CHARS = 300


@admin.register(Entry)
class EntryAdmin(ModelAdmin):
    """Metadata and a short preview; the blob itself never renders inline."""

    list_display = ["id", "turn_id", "step_num", "executor_name", "kind", "size_bytes", "pinned", "expires_at"]
    list_filter = ["kind", "pinned"]
    search_fields = ["id", "turn_id", "executor_name"]
    exclude = ["envelope"]
    readonly_fields = [field.name for field in Entry._meta.fields if field.name != "envelope"] + ["preview"]

    @admin.display(description="preview")
    def preview(self, entry: Entry) -> str:
        if entry.kind == Entry.Kind.BINARY:
            return entry.summary
        source = selectors.DbChunkSource(entry)
        text = read_slice(source, 0, min(PREVIEW_CHARS, entry.length))
        more = entry.length - len(text)
        # Text, not bytes: a binary entry returned its summary above.
        return f"{text}\n[... {more} more characters]" if more > 0 else str(text)  # type: ignore[str-bytes-safe]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Entry | None = None) -> bool:
        return False
