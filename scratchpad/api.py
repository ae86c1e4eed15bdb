"""REST endpoints: a turn's entries, one entry's metadata, slices read with the tool's modes, pin."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlcenter.api import request_user
from controlcenter.errors import DomainError, NotFound
from engine.scratchpad.read_tool import run_read
from scratchpad import selectors, services
from scratchpad.models import Entry
from scratchpad.serializers import EntrySerializer, PinSerializer

_INT_PARAMS = ("n", "start", "end", "context", "max_matches")


def _entry_for(request: Request, entry_id: str) -> Entry:
    if "\x00" in entry_id:
        raise DomainError("The scratchpad id contains a NUL character; ids are hexadecimal.")
    entry = selectors.entry_for_user(user=request_user(request), entry_id=entry_id)
    if entry is None:
        raise NotFound(f"Scratchpad entry {entry_id} does not exist.")
    return entry


class EntryDetailApi(APIView):
    @extend_schema(responses=EntrySerializer)
    def get(self, request: Request, entry_id: str) -> Response:
        return Response(EntrySerializer(_entry_for(request, entry_id)).data)


class EntryReadApi(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("mode", str, enum=["full", "head", "tail", "range", "lines", "grep"]),
            OpenApiParameter("n", int),
            OpenApiParameter("start", int),
            OpenApiParameter("end", int),
            OpenApiParameter("pattern", str),
            OpenApiParameter("ignore_case", bool),
            OpenApiParameter("context", int),
            OpenApiParameter("max_matches", int),
        ],
        responses=dict,
    )
    def get(self, request: Request, entry_id: str) -> Response:
        entry = _entry_for(request, entry_id)
        arguments = _arguments(request.query_params, entry_id)
        source = selectors.DbChunkSource(entry)
        result = run_read(arguments, lambda requested: source if requested == entry.pk else None)
        if not result["ok"]:
            raise DomainError(result["error"])
        return Response(result)


class EntryPinApi(APIView):
    @extend_schema(request=PinSerializer, responses=EntrySerializer)
    def post(self, request: Request, entry_id: str) -> Response:
        entry = _entry_for(request, entry_id)
        serializer = PinSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        pinned = services.pin(entry=entry, ttl_seconds=serializer.validated_data.get("ttl_seconds"))
        return Response(EntrySerializer(pinned).data)


def _arguments(params: Any, entry_id: str) -> dict[str, Any]:
    arguments: dict[str, Any] = {"scratchpad_id": entry_id}
    for name, raw in params.items():
        if name in _INT_PARAMS:
            try:
                arguments[name] = int(raw)
            except ValueError:
                raise DomainError(f"{name} must be an integer; got {raw!r}.") from None
        elif name == "ignore_case":
            if raw.lower() not in ("true", "false", "1", "0"):
                raise DomainError(f"ignore_case must be true or false; got {raw!r}.")
            arguments[name] = raw.lower() in ("true", "1")
        elif name in ("limit", "offset", "format"):
            continue
        else:
            arguments[name] = raw
    return arguments
