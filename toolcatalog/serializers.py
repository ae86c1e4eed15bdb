from __future__ import annotations

from rest_framework import serializers

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
    class Meta:
        model = McpServer
        # The command line and URL may carry credentials: operators read them in the admin.
        fields = ["id", "name", "transport", "enabled", "created_at"]
