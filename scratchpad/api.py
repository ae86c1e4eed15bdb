"""REST endpoints: a turn's entries, one entry's metadata, slices read with the tool's modes, pin."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlcenter.api import request_user
from controlcenter.errors import DomainError, NotFound
from scratchpad import selectors, services
from scratchpad.models import Entry
from scratchpad.serializers import EntrySerializer, PinSerializer


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
        return Response(services.read_slice(entry=_entry_for(request, entry_id), params=request.query_params))


class EntryPinApi(APIView):
    @extend_schema(request=PinSerializer, responses=EntrySerializer)
    def post(self, request: Request, entry_id: str) -> Response:
        entry = _entry_for(request, entry_id)
        serializer = PinSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        pinned = services.pin(entry=entry, ttl_seconds=serializer.validated_data.get("ttl_seconds"))
        return Response(EntrySerializer(pinned).data)
