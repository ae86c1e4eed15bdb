"""One place where domain errors become API errors (STYLE #10).

Every error has one shape: `{"error": {"code", "message", "details"}}`, where
`message` is one readable sentence and `details` carries per-field errors when
there are any.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from rest_framework import status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from controlcenter.errors import DomainError, NotFound


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details if details is not None else {}}}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, NotFound | ObjectDoesNotExist):
        return Response(error_body("not_found", str(exc) or "Not found."), status=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, DomainError):
        return Response(error_body(exc.code, exc.message), status=exc.status)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, ValidationError):
        response.data = error_body("invalid", _flatten(response.data), response.data)
    elif isinstance(exc, APIException):
        detail = response.data.get("detail", exc.detail) if isinstance(response.data, dict) else exc.detail
        response.data = error_body(str(getattr(detail, "code", exc.default_code)), str(detail))
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


def error_schema() -> Any:
    """The OpenAPI description of the error shape, for `extend_schema(responses=...)`."""
    from drf_spectacular.utils import inline_serializer
    from rest_framework import serializers

    return inline_serializer(
        "Error",
        {
            "error": inline_serializer(
                "ErrorBody",
                {
                    "code": serializers.CharField(),
                    "message": serializers.CharField(),
                    "details": serializers.JSONField(),
                },
            )
        },
    )
