from __future__ import annotations

from typing import Any

from rest_framework import serializers

from agents.models import Approval, ModelRequest, Run, RunEvent, Subagent
from conversations.serializers import CompactionSerializer


class ModelRequestSerializer(serializers.ModelSerializer):
    usage_estimated = serializers.BooleanField(
        read_only=True, help_text="The server sent no usage: the figures were counted (see usage_source)."
    )
    # Stored as "" for the run's own request; null says so in the schema, as Approval.subagent does.
    subagent = serializers.CharField(
        read_only=True,
        allow_null=True,
        help_text="The subagent that made this request, as '<fan-out id>/<child index>' (TD-14); "
        "null for the run's own. Each agent counts its own steps from 1.",
    )
    stop_reason = serializers.CharField(
        read_only=True,
        help_text="Why the answer ended: end_turn, tool_use, max_tokens, refusal, pause_turn, or 'retried' for an "
        "attempt broken off mid-answer and asked again (paid for on its own; its retry follows with the same step).",
    )

    class Meta:
        model = ModelRequest
        fields = [
            "step",
            "model",
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
            "cache_creation_5m_input_tokens",
            "cache_creation_1h_input_tokens",
            "output_tokens",
            "usage_source",
            "usage_estimated",
            "cache_reported",
            "request_id",
            "subagent",
            "breakpoints",
            "tools_loaded",
            "cache_miss",
            "stop_reason",
            "duration_ms",
        ]

    def to_representation(self, instance: ModelRequest) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["subagent"] = data["subagent"] or None
        return data


class RunSerializer(serializers.ModelSerializer):
    model_requests = ModelRequestSerializer(many=True, read_only=True)
    # The passes this run made (Compaction.run): a turn's own, or a compaction run's (CH-14);
    # /compact and /shake without the summary have no run.
    compactions = CompactionSerializer(many=True, read_only=True)

    class Meta:
        model = Run
        fields = [
            "id",
            "conversation",
            "trigger",
            "status",
            "provider",
            "model",
            "mode",
            "worker",
            "created_at",
            "started_at",
            "first_event_at",
            "finished_at",
            "error",
            "retryable",
            "compact_rungs",
            "model_requests",
            "compactions",
        ]


class RunEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunEvent
        fields = ["seq", "type", "payload", "created_at"]


class SubagentBriefSerializer(serializers.ModelSerializer):
    class Meta:
        model = Subagent
        fields = ["id", "index", "profile", "status", "task"]


class ApprovalSerializer(serializers.ModelSerializer):
    decided_by = serializers.CharField(source="decided_by.username", default=None, read_only=True)
    # The child whose call this is (TD-14), or null for the run's own call.
    subagent = SubagentBriefSerializer(read_only=True, allow_null=True)

    class Meta:
        model = Approval
        fields = [
            "id",
            "run",
            "subagent",
            "tool_use_id",
            "tool_name",
            "input",
            "status",
            "decided_by",
            "decided_at",
            "created_at",
        ]


class CacheMetricSerializer(serializers.Serializer):
    key = serializers.CharField()
    requests = serializers.IntegerField()
    input_tokens = serializers.IntegerField()
    cache_creation_input_tokens = serializers.IntegerField()
    cache_read_input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    prompt_tokens = serializers.IntegerField()
    activation_misses = serializers.IntegerField()
    # Undefined (null) for a group none of whose requests reported its cache over some prompt token.
    cache_ratio = serializers.FloatField(allow_null=True)
