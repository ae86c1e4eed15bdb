from __future__ import annotations

from rest_framework import serializers

from controlcenter.api import RefusingUnknownFields
from scratchpad.models import Entry
from scratchpad.services import MAX_TTL_SECONDS


class EntrySerializer(serializers.ModelSerializer):
    scratchpad_id = serializers.CharField(source="id", read_only=True)

    class Meta:
        model = Entry
        fields = [
            "scratchpad_id",
            "turn_id",
            "run",
            "conversation",
            "step_num",
            "executor_name",
            "kind",
            "size_bytes",
            "length",
            "line_count",
            "chunk_count",
            "stored_bytes",
            "summary",
            "metadata",
            "pinned",
            "created_at",
            "expires_at",
        ]
        read_only_fields = fields


class PinSerializer(RefusingUnknownFields):
    ttl_seconds = serializers.IntegerField(required=False, min_value=1, max_value=MAX_TTL_SECONDS)
