from __future__ import annotations

from rest_framework import serializers

from agents.models import ModelRequest, Run, RunEvent


class ModelRequestSerializer(serializers.ModelSerializer):
    class Meta:
        model = ModelRequest
        fields = [
            "step",
            "model",
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
            "output_tokens",
            "breakpoints",
            "stop_reason",
            "duration_ms",
        ]


class RunSerializer(serializers.ModelSerializer):
    model_requests = ModelRequestSerializer(many=True, read_only=True)

    class Meta:
        model = Run
        fields = [
            "id",
            "conversation",
            "trigger",
            "status",
            "provider",
            "model",
            "worker",
            "created_at",
            "started_at",
            "first_event_at",
            "finished_at",
            "error",
            "retryable",
            "model_requests",
        ]


class RunEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunEvent
        fields = ["seq", "type", "payload", "created_at"]
