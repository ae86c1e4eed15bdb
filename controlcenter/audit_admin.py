"""The admin for audit data, shared by the apps that record it."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest


class AuditAdmin(admin.ModelAdmin):
    """Audit data (UX-7): what ran, what it cost, who decided. Readable, never edited or removed
    here: the runtime writes it, and the figures on the run page and dashboard come from it."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
