from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from controlcenter.errors import NotFound
from conversations.models import Conversation, Message


def conversations_for_user(*, user: AbstractBaseUser, search: str = "") -> QuerySet[Conversation]:
    queryset = Conversation.objects.filter(owner=user)
    if search:
        queryset = queryset.filter(title__icontains=search)
    return queryset


def conversation_for_user(*, user: AbstractBaseUser, conversation_id: int) -> Conversation:
    """The conversation if `user` owns it; another user's answers exactly like a missing one."""
    try:
        return Conversation.objects.get(pk=conversation_id, owner=user)
    except Conversation.DoesNotExist:
        raise NotFound(f"Conversation {conversation_id} does not exist.") from None


def path_to(message: Message | None) -> list[Message]:
    """Root-to-`message` path of the tree, oldest first."""
    if message is None:
        return []
    by_id = {m.pk: m for m in Message.objects.filter(conversation_id=message.conversation_id)}
    path = []
    current: Message | None = by_id.get(message.pk, message)
    while current is not None:
        path.append(current)
        current = by_id.get(current.parent_id) if current.parent_id else None
    path.reverse()
    return path


def current_path(conversation: Conversation) -> list[Message]:
    return path_to(conversation.tip)
