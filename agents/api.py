from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.generics import get_object_or_404
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents import selectors, services
from agents.serializers import RunEventSerializer, RunSerializer


class RunDetailApi(APIView):
    @extend_schema(responses=RunSerializer)
    def get(self, request: Request, run_id: int) -> Response:
        run = get_object_or_404(selectors.runs_for_user(user=request.user), pk=run_id)
        return Response(RunSerializer(run).data)


class RunCancelApi(APIView):
    @extend_schema(request=None, responses=RunSerializer)
    def post(self, request: Request, run_id: int) -> Response:
        run = get_object_or_404(selectors.runs_for_user(user=request.user), pk=run_id)
        return Response(RunSerializer(services.run_cancel(run=run)).data)


class RunRetryApi(APIView):
    @extend_schema(request=None, responses={201: RunSerializer})
    def post(self, request: Request, run_id: int) -> Response:
        run = get_object_or_404(selectors.runs_for_user(user=request.user), pk=run_id)
        return Response(RunSerializer(services.run_retry(run=run)).data, status=status.HTTP_201_CREATED)


class RunEventsApi(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("after", int, description="Return events with a sequence number above this.")],
        responses=RunEventSerializer(many=True),
    )
    def get(self, request: Request, run_id: int) -> Response:
        run = get_object_or_404(selectors.runs_for_user(user=request.user), pk=run_id)
        raw_after = request.query_params.get("after", "0")
        if not raw_after.isdigit():
            raise ValidationError({"after": f"{raw_after!r} is not a non-negative integer."})
        events = selectors.run_events_after(run=run, after=int(raw_after))
        return Response(RunEventSerializer(events, many=True).data)
