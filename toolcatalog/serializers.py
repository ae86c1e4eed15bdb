from __future__ import annotations

from rest_framework import serializers

from toolcatalog.models import Mode, Tool


class ToolSerializer(serializers.ModelSerializer):
    name = serializers.CharField(source="qualified_name")
    group = serializers.CharField(source="group.heading")
    server = serializers.CharField(source="server.name", default=None)
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
