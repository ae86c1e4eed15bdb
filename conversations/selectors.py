from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery, TextField
from django.db.models.functions import Cast

from agents.models import Run
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


def conversations_with_activity(*, user: AbstractBaseUser, search: str = "") -> QuerySet[Conversation]:
    """The user's conversations, most recently active first, each with its message count and
    its latest run; `search` matches titles and the text of the user's own messages."""
    latest_run = Run.objects.filter(conversation=OuterRef("pk")).order_by("-id")
    queryset = Conversation.objects.filter(owner=user)
    if search:
        # The stored JSON as text: portable across PostgreSQL and SQLite, and a person's
        # conversations are few enough that a scan is fine.
        matching = (
            Message.objects.filter(conversation__owner=user, role=Message.Role.USER)
            .annotate(as_text=Cast("content", TextField()))
            .filter(as_text__icontains=search)
            .values("conversation_id")
        )
        queryset = queryset.filter(Q(title__icontains=search) | Q(pk__in=matching))
    return queryset.annotate(
        message_count=Count("messages"),
        last_run_id=Subquery(latest_run.values("id")[:1]),
        last_run_status=Subquery(latest_run.values("status")[:1]),
    ).order_by("-updated_at")
