"""Factories for conversation-history tests: whole turns written the way a run persists them."""

from __future__ import annotations

import pytest

from conversations.models import Conversation
from tests.support.factories import ConversationFactory
from tests.support.history import add_turn


@pytest.fixture
def conversation(alice) -> Conversation:
    return ConversationFactory(owner=alice, title="History")


@pytest.fixture
def explored(conversation) -> Conversation:
    """Two finished turns, the second with a tool call."""
    add_turn(conversation, "Plan the migration; keep the API stable.", "Here is the plan.")
    add_turn(conversation, "List the files.", "There are three files.", tools=[("list_dir", {"entries": ["a", "b"]})])
    return conversation
