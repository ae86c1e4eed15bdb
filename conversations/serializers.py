from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from rest_framework import serializers
from rest_framework.fields import empty

from controlcenter.api import RefusingUnknownFields, StrictCharField
from conversations.models import Checkpoint, Compaction, Conversation, Message, RewindDigest


class MessageSerializer(serializers.ModelSerializer):
    class Meta:
        model = Message
        fields = ["id", "parent", "role", "content", "created_at"]


class PathMessageSerializer(serializers.Serializer):
    """A message of the current path (`selectors.PathMessage`), in the same shape as MessageSerializer."""

    id = serializers.IntegerField()
    # A declared field may shadow a Field attribute (the metaclass moves it away); the stubs cannot tell.
    parent = serializers.IntegerField(source="parent_id", allow_null=True)  # type: ignore[assignment]
    role = serializers.ChoiceField(choices=Message.Role.choices)
    content = serializers.JSONField()
    created_at = serializers.DateTimeField()


class ConversationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Conversation
        fields = ["id", "title", "tip", "model", "mode", "created_at", "updated_at"]
        read_only_fields = ["tip", "model", "mode", "created_at", "updated_at"]


class ModelNameField(StrictCharField):
    """A model the conversation's runs use: a name from CC_MODELS, or blank for the server default.
    Checked by the service, whose 400 lists what is offered; the schema lists it too, as generated."""


class ModelNameFieldSchema(OpenApiSerializerFieldExtension):
    target_class = ModelNameField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> Any:
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        return {**schema, "enum": ["", *settings.CC_MODELS]}


class ConversationUpdateSerializer(RefusingUnknownFields):
    """The pickers (what the next run uses, checked against CC_MODELS and the catalog) and the title."""

    model = ModelNameField(required=False, allow_blank=True, max_length=128, help_text="blank: server default")
    mode = serializers.IntegerField(required=False, allow_null=True, min_value=1, help_text="null: the default mode")
    title = StrictCharField(required=False, max_length=200, help_text="a rename")


class ModelChoiceSerializer(serializers.Serializer):
    name = serializers.CharField()
    provider = serializers.CharField()
    default = serializers.BooleanField()


class SearchTextField(serializers.CharField):
    """Search text: a NUL character (which no stored text holds, and PostgreSQL refuses in a
    query) is dropped rather than refused, so any string the schema allows is answered (UX-8)."""

    def run_validation(self, data: Any = empty) -> Any:
        if isinstance(data, str):
            data = data.replace("\x00", "")
        return super().run_validation(data)


class ConversationListQuerySerializer(serializers.Serializer):
    """One page of the conversation list, newest first: a page of 50 costs a quarter of the old 200 rows."""

    q = SearchTextField(required=False, allow_blank=True, default="")
    limit = serializers.IntegerField(required=False, default=50, min_value=1, max_value=200)
    # Bounded so the database's OFFSET (a bigint) never overflows (UX-8).
    offset = serializers.IntegerField(required=False, default=0, min_value=0, max_value=10**18 - 1)


class ConversationCreateSerializer(RefusingUnknownFields):
    """A new conversation: its title, and the model its runs use (as a PATCH sets it)."""

    title = StrictCharField(required=False, allow_blank=True, max_length=200, default="")
    model = ModelNameField(required=False, allow_blank=True, max_length=128, help_text="blank: server default")


class MessageCreateSerializer(RefusingUnknownFields):
    text = StrictCharField(allow_blank=True, trim_whitespace=False)
    after = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        help_text="the tip you saw (null: no message yet); a tip moved since is a 409, nothing stored",
    )


class MessageEditSerializer(RefusingUnknownFields):
    text = StrictCharField(allow_blank=True, trim_whitespace=False)


class BranchSerializer(RefusingUnknownFields):
    message = serializers.IntegerField(min_value=1)


class ForkSerializer(RefusingUnknownFields):
    title = StrictCharField(required=False, allow_blank=True, max_length=200, default="")


class CheckpointCreateSerializer(RefusingUnknownFields):
    label = StrictCharField(max_length=64, trim_whitespace=False)  # type: ignore[assignment]  # as `parent`


class CheckpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = Checkpoint
        fields = ["id", "label", "message", "created_at"]


class RewindSerializer(RefusingUnknownFields):
    label = StrictCharField(required=False, allow_null=True, max_length=64, default=None)  # type: ignore[assignment]


class RewindDigestSerializer(serializers.ModelSerializer):
    class Meta:
        model = RewindDigest
        fields = ["id", "label", "target", "explored_tip", "digest", "created_at"]


class CompactSerializer(RefusingUnknownFields):
    rungs = serializers.ListField(
        # "summary" calls the conversation's model, in a worker (CH-14).
        child=serializers.ChoiceField(
            choices=["elide", "drop_images", "snapshot", "summary"],
            error_messages={"invalid_choice": '"{input}" is not a rung: use elide, drop_images, snapshot or summary.'},
        ),
        required=False,
        allow_empty=False,
        default=["elide", "drop_images", "snapshot"],
    )


class CompactionSerializer(serializers.ModelSerializer):
    class Meta:
        model = Compaction
        fields = [
            "id",
            "run",
            "rung",
            "tip",
            "tokens_before",
            "tokens_after",
            "target_tokens",
            "steps",
            "replaced",
            "trigger",
            "created_at",
        ]
