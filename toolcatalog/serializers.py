from __future__ import annotations

from rest_framework import serializers

from controlcenter.api import StrictCharField
from controlcenter.redact import redact_text
from toolcatalog.mcp_config import hidden
from toolcatalog.models import McpServer, Mode, Tool, ToolGroup


class ToolSerializer(serializers.ModelSerializer):
    name = serializers.CharField(source="qualified_name")
    group = serializers.CharField(source="group.heading")
    server = serializers.CharField(source="server.name", default=None, allow_null=True, help_text="null: built-in")
    schema_tokens = serializers.IntegerField()

    class Meta:
        model = Tool
        fields = [
            "id",
            "name",
            "group",
            "description",
            "input_schema",
            "resident",
            "requires_approval",
            "max_calls_per_run",
            "enabled",
            "source",
            "server",
            "schema_tokens",
        ]


class ModeSerializer(serializers.ModelSerializer):
    class Meta:
        model = Mode
        fields = ["id", "name", "description", "allow", "deny", "output_action"]


class ToolGroupSerializer(serializers.ModelSerializer):
    tools = serializers.IntegerField(source="tool_count")

    class Meta:
        model = ToolGroup
        fields = ["id", "heading", "order", "tools"]


class McpServerSerializer(serializers.ModelSerializer):
    """What every signed-in user sees of a server: no command, URL or secret."""

    class Meta:
        model = McpServer
        fields = ["id", "name", "transport", "enabled", "created_at"]


class McpServerConfigSerializer(serializers.ModelSerializer):
    """An operator's view: the whole configuration, with env and header values hidden (MC-3).

    A value shows as "***", or as its `${VAR}` reference when it is one; sending "***"
    back in an update keeps the stored value.
    """

    env = serializers.SerializerMethodField()
    headers = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField()
    tools = serializers.SerializerMethodField()

    class Meta:
        model = McpServer
        fields = ["id", "name", "transport", "command", "args", "env", "cwd", "url", "headers", "network"]
        fields += ["enabled", "created_at", "tools"]

    def get_env(self, server: McpServer) -> dict[str, str]:
        return hidden(server.env)

    def get_headers(self, server: McpServer) -> dict[str, str]:
        return hidden(server.headers)

    def get_url(self, server: McpServer) -> str:
        return redact_text(server.url)

    def get_tools(self, server: McpServer) -> list[str]:
        return [tool.qualified_name for tool in server.tools.filter(enabled=True).order_by("name")]


class McpServerInputSerializer(serializers.Serializer):
    """A server's configuration, as in an `mcpServers` entry; checked again by the service."""

    name = StrictCharField(max_length=40, required=False)
    transport = serializers.ChoiceField(choices=McpServer.Transport.choices, required=False)
    command = StrictCharField(required=False, allow_blank=True)
    args = serializers.ListField(child=StrictCharField(allow_blank=True), required=False)
    env = serializers.DictField(child=StrictCharField(allow_blank=True), required=False)
    cwd = StrictCharField(max_length=500, required=False, allow_blank=True)
    url = StrictCharField(max_length=200, required=False, allow_blank=True)
    headers = serializers.DictField(child=StrictCharField(allow_blank=True), required=False)
    network = serializers.BooleanField(required=False)
    enabled = serializers.BooleanField(required=False)


class McpImportResultSerializer(serializers.Serializer):
    added = serializers.ListField(child=serializers.CharField())
    changed = serializers.ListField(child=serializers.CharField())
    unchanged = serializers.IntegerField()
    removed = serializers.ListField(child=serializers.CharField())
    refused = serializers.ListField(child=serializers.CharField())


class McpServerSavedSerializer(serializers.Serializer):
    server = McpServerConfigSerializer()
    imported = McpImportResultSerializer(allow_null=True)
