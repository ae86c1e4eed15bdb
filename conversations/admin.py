from django.contrib import admin

from conversations.models import Conversation, Message


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
