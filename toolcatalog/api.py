from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from toolcatalog import selectors
from toolcatalog.serializers import McpServerSerializer, ModeSerializer, ToolGroupSerializer, ToolSerializer


class ToolListApi(APIView):
    @extend_schema(responses=ToolSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(ToolSerializer(selectors.tools_list(), many=True).data)


class ModeListApi(APIView):
    @extend_schema(responses=ModeSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(ModeSerializer(selectors.modes_list(), many=True).data)


class ToolGroupListApi(APIView):
    @extend_schema(responses=ToolGroupSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(ToolGroupSerializer(selectors.groups_list(), many=True).data)


class McpServerListApi(APIView):
    @extend_schema(responses=McpServerSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(McpServerSerializer(selectors.mcp_servers_list(), many=True).data)
