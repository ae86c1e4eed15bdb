"""The bases of our admin pages: JSON fields bounded as the API bounds them (SB-5), and audit data read-only.

Django's JSON form field parses with `json.loads`, which recurses once per level: a field of
3,000 nested `[` raised RecursionError, a 500, on the tool, mode and MCP server forms.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import models
from django.forms.fields import InvalidJSONInput
from django.http import HttpRequest

from engine.nesting import nesting_depth


class BoundedJSONField(forms.JSONField):
    def to_python(self, value: Any) -> Any:
        try:
            converted = super().to_python(value)
        except RecursionError:
            raise self._too_deep() from None
        if nesting_depth(converted, settings.CC_MAX_JSON_DEPTH) > settings.CC_MAX_JSON_DEPTH:
            raise self._too_deep()
        return converted

    def bound_data(self, data: Any, initial: Any) -> Any:
        # Shown again as typed when the form is redisplayed with its error.
        try:
            return super().bound_data(data, initial)
        except RecursionError:
            return InvalidJSONInput(data)

    @staticmethod
    def _too_deep() -> ValidationError:
        limit = settings.CC_MAX_JSON_DEPTH
        return ValidationError(f"This JSON nests deeper than {limit} levels (CC_MAX_JSON_DEPTH).", code="too_deep")


class ModelAdmin(admin.ModelAdmin):
    formfield_overrides = {models.JSONField: {"form_class": BoundedJSONField}}


class AuditAdmin(ModelAdmin):
    """Audit data (UX-7): what ran, what it cost, who decided. Readable, never edited or removed
    here: the runtime writes it, and the figures on the run page and dashboard come from it."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
