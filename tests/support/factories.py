"""Rows for tests, built with factory-boy instead of by hand: each factory fills what a test does not care about."""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from agents.models import Run
from conversations.models import Conversation, Message


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.PostGenerationMethodCall("set_password", "password-1")

    @classmethod
    def _after_postgeneration(cls, instance, create, results=None):
        if create and results:
            instance.save(update_fields=["password"])


class ConversationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Conversation

    owner = factory.SubFactory(UserFactory)
    title = factory.Sequence(lambda n: f"conversation {n}")


class MessageFactory(factory.django.DjangoModelFactory):
    """A user prompt under the conversation's tip by default; the tip is not moved."""

    class Meta:
        model = Message

    conversation = factory.SubFactory(ConversationFactory)
    parent = factory.LazyAttribute(lambda message: message.conversation.tip)
    role = Message.Role.USER
    content = factory.LazyFunction(lambda: [{"type": "text", "text": "Hello."}])


class RunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Run

    trigger = factory.SubFactory(MessageFactory)
    conversation = factory.LazyAttribute(lambda run: run.trigger.conversation)
    provider = "offline"
    model = "offline-1"
