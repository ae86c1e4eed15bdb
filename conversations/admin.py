from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from controlcenter.admin_base import ModelAdmin
from controlcenter.errors import DomainError
from conversations import commands, services
from conversations.models import Checkpoint, Compaction, Conversation, Message, RewindDigest
from conversations.signals import announce_on_commit

# The tree (tips, parents, message content, checkpoint targets) is written by the services alone,
# which check it belongs together: a form that took any message id let a conversation's tip point
# into another user's conversation (its path, and its next prompt's history, were theirs) or stored
# content that was no list of blocks, and the pages drawing them failed. Here it is shown, titles
# and labels are edited, and messages are deleted through the service.


@admin.register(Conversation)
class ConversationAdmin(ModelAdmin):
    list_display = ["id", "title", "owner", "updated_at"]
    search_fields = ["title", "owner__username"]
    list_filter = ["updated_at"]
    raw_id_fields = ["owner"]
    readonly_fields = ["tip", "forked_from"]


class TranscriptAdmin(ModelAdmin):
    """Shown and deleted, never written: new rows come from a conversation's runs and commands."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Message)
class MessageAdmin(TranscriptAdmin):
    list_display = ["id", "conversation", "role", "parent", "created_at"]
    list_filter = ["role"]

    # Through the service, so a deleted tip moves up to a message a branch could move to instead of
    # leaving the conversation with no tip, or one on a tool call without its result (CH-5, CH-7);
    # a refusal is shown with its reason.
    def delete_model(self, request: HttpRequest, obj: Message) -> None:
        try:
            services.message_delete(message=obj)
        except DomainError as exc:
            self.message_user(request, str(exc), level=messages.ERROR)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        for message in queryset.order_by("id"):
            if Message.objects.filter(pk=message.pk).exists():  # an earlier one's subtree may have taken it
                self.delete_model(request, message)


class CheckpointForm(forms.ModelForm):
    class Meta:
        model = Checkpoint
        fields = ["label"]

    def clean_label(self) -> str:
        try:
            label = commands.validate_label(self.cleaned_data["label"])
        except commands.CommandError as exc:
            raise forms.ValidationError(str(exc)) from None
        # Said on the form, as the API says it: the unique constraint alone answered with a 500 (SB-5).
        try:
            services.check_label_free(
                conversation_id=self.instance.conversation_id, label=label, renaming=self.instance
            )
        except DomainError as exc:
            raise forms.ValidationError(str(exc)) from None
        return label


@admin.register(Checkpoint)
class CheckpointAdmin(ModelAdmin):
    """A label is renamed here, as /checkpoint would name it; a checkpoint is made on its
    conversation (/checkpoint), at a turn boundary."""

    form = CheckpointForm
    list_display = ["id", "conversation", "label", "message", "created_at"]
    search_fields = ["label"]
    readonly_fields = ["conversation", "message"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    # The tree page lists checkpoints: the tabs open on it redraw (UX-4), as for /checkpoint.
    def save_model(self, request: HttpRequest, obj: Checkpoint, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        announce_on_commit(conversation_id=obj.conversation_id, reason="checkpoint")

    def delete_model(self, request: HttpRequest, obj: Checkpoint) -> None:
        super().delete_model(request, obj)
        announce_on_commit(conversation_id=obj.conversation_id, reason="checkpoint")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Checkpoint]) -> None:
        conversations = set(queryset.values_list("conversation_id", flat=True))
        super().delete_queryset(request, queryset)
        for conversation_id in conversations:
            announce_on_commit(conversation_id=conversation_id, reason="checkpoint")


@admin.register(RewindDigest)
class RewindDigestAdmin(TranscriptAdmin):
    list_display = ["id", "conversation", "label", "target", "explored_tip", "created_at"]


@admin.register(Compaction)
class CompactionAdmin(TranscriptAdmin):
    list_display = ["id", "conversation", "rung", "tokens_before", "tokens_after", "trigger", "created_at"]
    list_filter = ["rung", "trigger"]
