"""Deleting messages in the admin never leaves a conversation without a tip (CH-7)."""

from __future__ import annotations

import pytest

from agents import chat
from conversations.models import Message
from tests.support.factories import ConversationFactory, MessageFactory
from tests.support.history import add_turn

pytestmark = [pytest.mark.django_db, pytest.mark.req("CH-7")]


def _delete(admin_client, message: Message):
    return admin_client.post(f"/admin/conversations/message/{message.pk}/delete/", {"post": "yes"}, follow=True)


def test_deleting_the_tip_moves_it_to_the_parent_and_retry_still_finds_the_transcript(admin_client, explored):
    prompt, answer = add_turn(explored, "One more question.", "One more answer.")
    assert explored.tip_id == answer.pk
    _delete(admin_client, answer)
    explored.refresh_from_db()
    assert explored.tip_id == prompt.pk  # the parent, not null
    assert not Message.objects.filter(pk=answer.pk).exists()
    # The unanswered prompt is the tip again: retry runs it rather than saying nothing is loaded.
    run = chat.conversation_retry(conversation=explored)
    assert run.trigger_id == prompt.pk


def test_deleting_a_message_above_the_tip_moves_the_tip_out_of_the_deleted_subtree(admin_client, explored):
    prompt, answer = add_turn(explored, "Branch point.", "Answer.")
    _delete(admin_client, prompt)
    explored.refresh_from_db()
    assert explored.tip_id == prompt.parent_id and explored.tip_id is not None
    assert not Message.objects.filter(pk__in=[prompt.pk, answer.pk]).exists()


def test_deleting_the_root_of_the_path_while_other_messages_remain_is_refused_with_the_reason(admin_client, explored):
    root = Message.objects.filter(conversation=explored, parent=None).get()
    MessageFactory(conversation=explored, parent=None, text="x")
    count, tip = Message.objects.count(), explored.tip_id
    page = _delete(admin_client, root).content.decode()
    assert "is the root of the current path" in page
    explored.refresh_from_db()
    assert Message.objects.count() == count and explored.tip_id == tip


def test_deleting_the_only_root_empties_the_conversation_and_leaves_no_tip(admin_client, alice):
    conversation = ConversationFactory(owner=alice, title="short")
    add_turn(conversation, "Hello.", "Hi.")
    root = Message.objects.get(conversation=conversation, parent=None)
    _delete(admin_client, root)
    conversation.refresh_from_db()
    assert conversation.tip_id is None and not Message.objects.filter(conversation=conversation).exists()
