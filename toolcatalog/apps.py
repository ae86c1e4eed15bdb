from django.apps import AppConfig
from django.db.models.signals import post_delete

from toolcatalog.workspace import remove_conversation_workspace


class ToolcatalogConfig(AppConfig):
    name = "toolcatalog"
    verbose_name = "Tool catalog"

    def ready(self) -> None:
        # By the sender's label: conversations sit above this app, which never imports them. A
        # signal, not the delete service: the admin and a user's deletion delete conversations too.
        post_delete.connect(
            remove_conversation_workspace, sender="conversations.Conversation", dispatch_uid="cc-workspace-removal"
        )
