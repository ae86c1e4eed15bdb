from django.apps import AppConfig

from conversations.signals import conversation_changed


class AgentsConfig(AppConfig):
    name = "agents"

    def ready(self) -> None:
        # agents.events imports this app's models, which are loadable only once the registry is ready.
        from agents.events import on_conversation_changed

        # A signal, not a call from the services: conversations sit below this app and never import it.
        conversation_changed.connect(on_conversation_changed, dispatch_uid="cc-conversation-changed")
