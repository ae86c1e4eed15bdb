from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlcenter.errors import NotFound
from toolcatalog import selectors, services
from toolcatalog.models import McpServer
from toolcatalog.serializers import (
    McpServerConfigSerializer,
    McpServerInputSerializer,
    McpServerSavedSerializer,
    McpServerSerializer,
    ModeSerializer,
    ToolGroupSerializer,
    ToolSerializer,
)


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


class McpServerPermission(BasePermission):
    """Staff holding the admin's own permission on MCP servers for the method (view, add, change,
    delete; a refresh is a change). A server's command runs as soon as it is imported: a staff user
    the admin refused a server could add and run one here (QA)."""

    message = "Managing MCP servers needs a staff account with the MCP server permissions the admin asks for."
    _ACTIONS = {"GET": "view", "POST": "add", "PATCH": "change", "PUT": "change", "DELETE": "delete"}

    def has_permission(self, request: Request, view: APIView) -> bool:
        return may_manage_servers(
            request.user, getattr(view, "mcp_action", None) or self._ACTIONS.get(request.method or "")
        )


def may_manage_servers(user: Any, action: str | None) -> bool:
    return bool(
        user and user.is_authenticated and user.is_staff and action and user.has_perm(f"toolcatalog.{action}_mcpserver")
    )


class McpServerListApi(APIView):
    """Every user lists the servers; operators see their configuration and add servers (MC-1)."""

    def get_permissions(self) -> list:
        return [IsAuthenticated()] if self.request.method == "GET" else [McpServerPermission()]

    @extend_schema(responses=McpServerConfigSerializer(many=True))
    def get(self, request: Request) -> Response:
        servers = selectors.mcp_servers_list()
        if may_manage_servers(request.user, "view"):
            return Response(McpServerConfigSerializer(servers, many=True).data)
        return Response(McpServerSerializer(servers, many=True).data)

    @extend_schema(request=McpServerInputSerializer, responses={201: McpServerSavedSerializer})
    def post(self, request: Request) -> Response:
        given = McpServerInputSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        server, result = services.mcp_server_save(config=dict(given.validated_data))
        return Response(_saved(server, result), status=status.HTTP_201_CREATED)


class McpServerDetailApi(APIView):
    permission_classes = [McpServerPermission]

    @extend_schema(responses=McpServerConfigSerializer)
    def get(self, request: Request, server_id: int) -> Response:
        return Response(McpServerConfigSerializer(_server(server_id)).data)

    @extend_schema(request=McpServerInputSerializer, responses=McpServerSavedSerializer)
    def patch(self, request: Request, server_id: int) -> Response:
        server = _server(server_id)
        given = McpServerInputSerializer(data=request.data, partial=True)
        given.is_valid(raise_exception=True)
        server, result = services.mcp_server_save(config=dict(given.validated_data), server=server)
        return Response(_saved(server, result))

    @extend_schema(responses={204: None})
    def delete(self, request: Request, server_id: int) -> Response:
        services.mcp_server_delete(server=_server(server_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class McpServerRefreshApi(APIView):
    permission_classes = [McpServerPermission]
    mcp_action = "change"

    @extend_schema(request=None, responses=McpServerSavedSerializer)
    def post(self, request: Request, server_id: int) -> Response:
        server = _server(server_id)
        result = services.mcp_server_import(server=server)
        return Response(_saved(server, result))


def _server(server_id: int) -> McpServer:
    server = McpServer.objects.filter(pk=server_id).first()
    if server is None:
        raise NotFound(f"MCP server {server_id} does not exist.")
    return server


def _saved(server: McpServer, result: services.McpImportResult | None) -> dict:
    return {
        "server": McpServerConfigSerializer(server).data,
        "imported": result.as_dict() if result is not None else None,
    }
