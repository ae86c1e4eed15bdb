"""Conversations: create, and send a message that starts a run."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from agents.models import Run
from agents.services import run_start
from controlcenter.errors import Conflict, DomainError
from conversations.models import Conversation, Message

TITLE_MAX = 200


def conversation_create(*, owner: AbstractBaseUser, title: str = "") -> Conversation:
    title = title.strip()
    if len(title) > TITLE_MAX:
        raise DomainError(f"The title has {len(title)} characters; the limit is {TITLE_MAX}.")
    return Conversation.objects.create(owner=owner, title=title or "New conversation")


def message_send(*, conversation: Conversation, text: str) -> tuple[Message, Run]:
    """Append a user message under the tip, move the tip, and queue the turn after commit."""
    if not isinstance(text, str) or not text.strip():
        raise DomainError("The message is empty; write something to send.")
    if len(text) > settings.CC_MAX_MESSAGE_CHARS:
        raise DomainError(f"The message has {len(text)} characters; the limit is {settings.CC_MAX_MESSAGE_CHARS}.")
    with transaction.atomic():
        locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
        if Run.objects.filter(
            conversation=locked, status__in=[Run.Status.QUEUED, Run.Status.RUNNING, Run.Status.WAITING]
        ).exists():
            raise Conflict("A run is still in progress in this conversation; wait for it or cancel it.")
        message = Message.objects.create(
            conversation=locked,
            parent_id=locked.tip_id,
            role=Message.Role.USER,
            content=[{"type": "text", "text": text}],
        )
        if locked.title == "New conversation" and locked.tip_id is None:
            locked.title = text.strip().splitlines()[0][:80]
        locked.tip = message
        locked.save(update_fields=["tip", "title", "updated_at"])
        run = run_start(conversation=locked, trigger=message)
    conversation.refresh_from_db()
    return message, run
