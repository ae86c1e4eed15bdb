"""Rows for tests, built with factory-boy instead of by hand: each factory fills what a test does not care about.

A message tree is built a message at a time (`MessageFactory(conversation=c, text="...", as_tip=True)`) or a
whole turn at a time (`tests.support.history.add_turn`); a run needs only its owner
(`RunFactory(conversation__owner=alice)`: its conversation and trigger are made for it).
"""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from agents.models import ModelRequest, Run
from conversations.models import Checkpoint, Conversation, Message
from toolcatalog.models import Mode


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


class ModeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Mode

    name = factory.Sequence(lambda n: f"mode-{n}")
    allow = factory.LazyFunction(lambda: ["*"])


class ConversationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Conversation

    owner = factory.SubFactory(UserFactory)
    title = factory.Sequence(lambda n: f"conversation {n}")


class MessageFactory(factory.django.DjangoModelFactory):
    """A user prompt under the conversation's tip by default. `text` sets a one-block content;
    `as_tip=True` moves the conversation's tip to the new message, as persisting a turn does."""

    class Meta:
        model = Message
        skip_postgeneration_save = True

    class Params:
        text = "Hello."

    conversation = factory.SubFactory(ConversationFactory)
    parent = factory.LazyAttribute(lambda message: message.conversation.tip)
    role = Message.Role.USER
    content = factory.LazyAttribute(lambda message: [{"type": "text", "text": message.text}])

    @factory.post_generation
    def as_tip(message, create, extracted, **kwargs):
        if create and extracted:
            message.conversation.tip = message
            message.conversation.save(update_fields=["tip"])


class CheckpointFactory(factory.django.DjangoModelFactory):
    """A label on the conversation's tip by default."""

    class Meta:
        model = Checkpoint

    conversation = factory.SubFactory(ConversationFactory)
    label = factory.Sequence(lambda n: f"checkpoint-{n}")
    message_id = factory.LazyAttribute(lambda checkpoint: checkpoint.conversation.tip_id)


class RunFactory(factory.django.DjangoModelFactory):
    """A run of the offline provider, triggered by a new prompt in its conversation."""

    class Meta:
        model = Run

    conversation = factory.SubFactory(ConversationFactory)
    trigger = factory.SubFactory(MessageFactory, conversation=factory.SelfAttribute("..conversation"))
    provider = "offline"
    model = "offline-1"


class ModelRequestFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ModelRequest

    run = factory.SubFactory(RunFactory)
    step = 1
    model = factory.SelfAttribute("run.model")
