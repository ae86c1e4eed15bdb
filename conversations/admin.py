from django.contrib import admin

from conversations.models import Checkpoint, Compaction, Conversation, Message, RewindDigest


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ["id", "title", "owner", "updated_at"]
    search_fields = ["title", "owner__username"]
    list_filter = ["updated_at"]
    raw_id_fields = ["tip", "owner"]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ["id", "conversation", "role", "parent", "created_at"]
    list_filter = ["role"]
    raw_id_fields = ["conversation", "parent"]


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ["id", "conversation", "label", "message", "created_at"]
    search_fields = ["label"]
    raw_id_fields = ["conversation", "message"]


@admin.register(RewindDigest)
class RewindDigestAdmin(admin.ModelAdmin):
    list_display = ["id", "conversation", "label", "target", "explored_tip", "created_at"]
    raw_id_fields = ["conversation", "target", "explored_tip"]


@admin.register(Compaction)
class CompactionAdmin(admin.ModelAdmin):
    list_display = ["id", "conversation", "rung", "tokens_before", "tokens_after", "trigger", "created_at"]
    list_filter = ["rung", "trigger"]
    raw_id_fields = ["conversation", "tip"]
