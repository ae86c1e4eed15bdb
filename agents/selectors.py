from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from agents.models import Run, RunEvent
from conversations.models import Conversation


def run_visible_to(*, run_id: int, user: AbstractBaseUser) -> bool:
    return Run.objects.filter(pk=run_id, conversation__owner=user).exists()


def conversation_visible_to(*, conversation_id: int, user: AbstractBaseUser) -> bool:
    return Conversation.objects.filter(pk=conversation_id, owner=user).exists()


def runs_for_user(*, user: AbstractBaseUser) -> QuerySet[Run]:
    return Run.objects.filter(conversation__owner=user)


def run_events_after(*, run: Run, after: int) -> QuerySet[RunEvent]:
    return RunEvent.objects.filter(run=run, seq__gt=after).order_by("seq")
