"""One place where domain errors become API errors (STYLE #10).

Every error has one shape: `{"error": {"code", "message", "details"}}`, where
`message` is one readable sentence and `details` carries per-field errors when
there are any.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any, overload

from django.contrib.auth.models import User
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import DataError
from django.http import Http404, HttpRequest
from drf_spectacular.extensions import OpenApiSerializerExtension
from rest_framework import exceptions, serializers, status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from controlcenter.errors import DomainError, NotFound


class StrictCharField(serializers.CharField):
    """A string field that takes only strings: DRF's CharField stores 42 as "42", which a
    generated client reading the schema (type: string) never sends (UX-8)."""

    default_error_messages = {"not_a_string": "Must be a string, not {kind}."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("not_a_string", kind=type(data).__name__)
        return super().to_internal_value(data)


class RefusingUnknownFields(serializers.Serializer):
    """A body with a field the endpoint does not take is refused, naming it: silently dropped, a
    misspelt or unsupported field looked accepted while the server did something else (UX-8)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping) and (unknown := sorted(set(data) - set(self.fields))):
            takes = ", ".join(self.fields)
            raise serializers.ValidationError(
                {str(name): [f"Unknown field; this endpoint takes {takes}."] for name in unknown}
            )
        return super().to_internal_value(data)


class RefusingUnknownFieldsSchema(OpenApiSerializerExtension):
    """The schema says what the serializer refuses: no properties but its own (UX-8)."""

    target_class = RefusingUnknownFields
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> Any:
        return {
            **auto_schema._map_serializer(self.target, direction, bypass_extensions=True),
            "additionalProperties": False,
        }


# ASCII digits only: str.isdigit() takes '²', which int() refuses; 18 digits always fit a bigint.
_ID_PATTERN = re.compile(r"[0-9]{1,18}")
# The largest value `query_int` takes, for the schema's `maximum` (UX-8).
MAX_QUERY_INT = 10**18 - 1


@overload
def query_int(params: Any, name: str, default: int) -> int: ...
@overload
def query_int(params: Any, name: str, default: None = None) -> int | None: ...
def query_int(params: Any, name: str, default: int | None = None) -> int | None:
    """A non-negative integer query parameter, or a 400 that names it and what was sent."""
    raw = params.get(name)
    if raw is None:
        return default
    if not _ID_PATTERN.fullmatch(raw):
        raise ValidationError({name: f"{raw!r} is not a non-negative integer (at most 18 digits)."})
    return int(raw)


def request_user(request: Request | HttpRequest) -> User:
    """The signed-in user of a view that requires one: DRF's default IsAuthenticated, or a page
    behind `login_required`. The stubs type `request.user` as `User | AnonymousUser`; this narrows it
    once instead of a cast in every view (a view without a login gets a 403, never an anonymous user)."""
    user = request.user
    if not isinstance(user, User):
        raise DjangoPermissionDenied("Sign in first.")
    return user


logger = logging.getLogger(__name__)
SERVER_ERROR_MESSAGE = "Something went wrong on the server; the error was logged for the operator."


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details if details is not None else {}}}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, NotFound | ObjectDoesNotExist):
        return Response(error_body("not_found", str(exc) or "Not found."), status=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, DomainError):
        return Response(error_body(exc.code, exc.message, exc.details), status=exc.status)
    if isinstance(exc, DataError):
        # A value the database cannot hold (a NUL, an out-of-range number) that validation let
        # through: the input's fault, so a 400, and nothing was stored (SB-5).
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else "a value cannot be stored"
        return Response(error_body("invalid", f"A value cannot be stored: {message}."), status=400)
    if isinstance(exc, RequestDataTooBig):
        return Response(error_body("request_too_large", str(exc)), status=413)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "Not found.")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or "You do not have permission to do this.")
    response = drf_exception_handler(exc, context)
    if response is None:
        # A bug, not bad input: logged with its traceback, answered in the error shape (SB-5).
        logger.exception("Unexpected error in %s", context.get("view").__class__.__name__, exc_info=exc)
        return Response(error_body("server_error", SERVER_ERROR_MESSAGE), status=500)
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


_ERROR_STATUSES = {
    "400": "The request is malformed or a value is invalid.",
    "401": "No valid credentials were sent.",
    "403": "The credentials do not allow this.",
    "404": "The object does not exist or belongs to someone else.",
    "405": "The method is not allowed here.",
    "406": "The requested format is not available.",
    "409": "The object's state does not allow this now.",
    "413": "The request body is too large.",
    "415": "The body's media type is not supported.",
    "429": "Too many failed sign-in attempts from this address: locked out for a while.",
    "500": "An unexpected error; it was logged.",
}


def document_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular hook: every operation may answer with the one error shape."""
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components["ErrorResponse"] = {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "details"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "details": {}},
            }
        },
    }
    reference = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
    for path_item in result.get("paths", {}).values():
        for operation in path_item.values():
            responses = operation.setdefault("responses", {})
            for status_code, description in _ERROR_STATUSES.items():
                responses.setdefault(status_code, {"description": description, **reference})
    return result


# PostgreSQL text cannot hold a NUL, so every string a request body carries refuses one (DRF's
# ProhibitNullCharactersValidator, or the DataError above): a 400. drf-spectacular writes no rule for
# that validator, and a client generated from the schema would send a NUL believing it valid (UX-8).
# Bodies only: a response may repeat a refused value ('"\x00elide" is not a rung'), and a query
# parameter with a NUL matches nothing rather than being refused.
NO_NUL_PATTERN = "^[^\\u0000]*$"
# Values in a schema that are data, not schemas: a {"type": "string"} inside them is left alone.
_NOT_SCHEMAS = frozenset({"example", "examples", "default", "enum", "const", "not"})


def document_no_nul_strings(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular hook: every free-text string of a request body says it takes no NUL character."""
    components = result.get("components", {}).get("schemas", {})
    seen: set[str] = set()
    for path_item in result.get("paths", {}).values():
        for operation in path_item.values():
            body = operation.get("requestBody", {}) if isinstance(operation, dict) else {}
            for media in body.get("content", {}).values():
                _add_no_nul_pattern(media.get("schema"), components, seen)
    return result


def _add_no_nul_pattern(node: Any, components: dict[str, Any], seen: set[str]) -> None:
    if isinstance(node, list):
        for item in node:
            _add_no_nul_pattern(item, components, seen)
        return
    if not isinstance(node, dict):
        return
    reference = node.get("$ref")
    if isinstance(reference, str) and reference.startswith("#/components/schemas/"):
        name = reference.removeprefix("#/components/schemas/")
        if name not in seen:  # request components only, each once (they may refer to each other)
            seen.add(name)
            _add_no_nul_pattern(components.get(name), components, seen)
        return
    # An enum, a format (date-time, uuid, uri) or a pattern of its own already rules a NUL out.
    if node.get("type") == "string" and not {"enum", "format", "pattern", "const"} & node.keys():
        node["pattern"] = NO_NUL_PATTERN
    for key, value in node.items():
        if key not in _NOT_SCHEMAS and not key.startswith("x-"):
            _add_no_nul_pattern(value, components, seen)
