from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from controlcenter.admin_base import ModelAdmin
from controlcenter.errors import DomainError
from conversations import services
from conversations.models import Checkpoint, Compaction, Conversation, Message, RewindDigest


@admin.register(Conversation)
class ConversationAdmin(ModelAdmin):
    list_display = ["id", "title", "owner", "updated_at"]
    search_fields = ["title", "owner__username"]
    list_filter = ["updated_at"]
    raw_id_fields = ["tip", "owner"]


@admin.register(Message)
class MessageAdmin(ModelAdmin):
    list_display = ["id", "conversation", "role", "parent", "created_at"]
    list_filter = ["role"]
    raw_id_fields = ["conversation", "parent"]

    # Through the service, so a deleted tip moves to its parent instead of leaving the
    # conversation with no tip (CH-7); a refusal is shown with its reason.
    def delete_model(self, request: HttpRequest, obj: Message) -> None:
        try:
            services.message_delete(message=obj)
        except DomainError as exc:
            self.message_user(request, str(exc), level=messages.ERROR)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        for message in queryset.order_by("id"):
            if Message.objects.filter(pk=message.pk).exists():  # an earlier one's subtree may have taken it
                self.delete_model(request, message)


@admin.register(Checkpoint)
class CheckpointAdmin(ModelAdmin):
    list_display = ["id", "conversation", "label", "message", "created_at"]
    search_fields = ["label"]
    raw_id_fields = ["conversation", "message"]


@admin.register(RewindDigest)
class RewindDigestAdmin(ModelAdmin):
    list_display = ["id", "conversation", "label", "target", "explored_tip", "created_at"]
    raw_id_fields = ["conversation", "target", "explored_tip"]


@admin.register(Compaction)
class CompactionAdmin(ModelAdmin):
    list_display = ["id", "conversation", "rung", "tokens_before", "tokens_after", "trigger", "created_at"]
    list_filter = ["rung", "trigger"]
    raw_id_fields = ["conversation", "tip"]
