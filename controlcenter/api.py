"""One place where domain errors become API errors (STYLE #10)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from controlcenter.errors import DomainError, NotFound


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, NotFound | ObjectDoesNotExist):
        return Response({"error": "not_found", "detail": str(exc) or "Not found."}, status=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, DomainError):
        return Response({"error": exc.code, "detail": exc.message}, status=exc.status)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code = getattr(exc, "default_code", "error")
    if isinstance(exc, ValidationError):
        response.data = {"error": "invalid", "detail": _flatten(response.data), "fields": response.data}
    elif isinstance(response.data, dict) and "detail" in response.data:
        response.data = {"error": code, "detail": str(response.data["detail"])}
    return response


def _flatten(errors: Any, prefix: str = "") -> str:
    """One readable sentence out of DRF's nested field errors."""
    if isinstance(errors, dict):
        return " ".join(
            _flatten(value, f"{prefix}{key}: " if key != "non_field_errors" else prefix)
            for key, value in errors.items()
        )
    if isinstance(errors, list):
        return " ".join(_flatten(item, prefix) for item in errors)
    return f"{prefix}{errors}"
