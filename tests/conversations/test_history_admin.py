"""Deleting messages in the admin never leaves a conversation without a tip (CH-7)."""

from __future__ import annotations

import pytest

from agents import chat
from conversations import selectors
from conversations.models import Checkpoint, Conversation, Message
from engine.context import transcript
from tests.support.factories import CheckpointFactory, ConversationFactory, MessageFactory
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


@pytest.mark.req("CH-5", "CH-7")
def test_deleting_a_tool_result_never_leaves_the_tip_on_its_tool_call(admin_client, explored):
    """QA: deleting the answer, then the tool result, left the tip on a tool call with no result;
    every later run failed with the provider's 400 and /branch refused to go there."""
    prompt, call, result, answer = add_turn(explored, "Run it.", "Done.", tools=[("bash", "ok")])
    _delete(admin_client, answer)
    explored.refresh_from_db()
    assert explored.tip_id == result.pk

    _delete(admin_client, result)
    explored.refresh_from_db()
    assert Message.objects.filter(pk=call.pk).exists()
    assert explored.tip_id == prompt.pk  # above the orphaned call, on the unanswered prompt
    history = selectors.history_view(conversation_id=explored.pk, tip_id=explored.tip_id)
    assert transcript.pairing_problems(history) == []
    assert chat.conversation_retry(conversation=explored).trigger_id == prompt.pk


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


@pytest.mark.req("CH-7", "UX-7")
def test_the_admin_never_writes_the_tree_so_no_tip_points_into_another_users_conversation(admin_client, explored):
    """QA: a tip set in the admin to another user's message gave its owner that user's path (and
    their next prompt that history); message content saved as a string failed every page."""
    theirs = ConversationFactory(title="someone else's")
    secret = MessageFactory(conversation=theirs, text="their private words", as_tip=True)
    tip_before = explored.tip_id
    messages_before = list(Message.objects.order_by("id").values_list("id", "parent_id", "content"))

    # The conversation form shows the tip; a posted tip is not taken.
    changed = admin_client.post(
        f"/admin/conversations/conversation/{explored.pk}/change/",
        {"title": "renamed", "owner": explored.owner_id, "model": "", "tip": secret.pk},
    )
    assert changed.status_code == 302
    explored.refresh_from_db()
    assert (explored.title, explored.tip_id) == ("renamed", tip_before)
    added = admin_client.post(
        "/admin/conversations/conversation/add/",
        {"title": "new", "owner": explored.owner_id, "model": "", "tip": secret.pk},
    )
    assert added.status_code == 302
    assert Conversation.objects.get(title="new").tip_id is None

    # Messages are shown, never added or changed here.
    assert admin_client.get("/admin/conversations/message/add/").status_code == 403
    refused = admin_client.post(
        f"/admin/conversations/message/{tip_before}/change/",
        {"conversation": theirs.pk, "parent": secret.pk, "role": "user", "content": '"not a list"'},
    )
    assert refused.status_code == 403
    assert admin_client.get(f"/admin/conversations/message/{tip_before}/change/").status_code == 200
    assert list(Message.objects.order_by("id").values_list("id", "parent_id", "content")) == messages_before

    # A checkpoint's label is renamed as /checkpoint names one; its target is not taken from the form.
    checkpoint = CheckpointFactory(conversation=explored, label="before")
    bad = admin_client.post(
        f"/admin/conversations/checkpoint/{checkpoint.pk}/change/",
        {"label": "no spaces allowed", "message": secret.pk, "conversation": theirs.pk},
    )
    assert bad.status_code == 200 and "is not a valid label" in bad.content.decode()
    good = admin_client.post(
        f"/admin/conversations/checkpoint/{checkpoint.pk}/change/",
        {"label": "after", "message": secret.pk, "conversation": theirs.pk},
    )
    assert good.status_code == 302
    checkpoint.refresh_from_db()
    assert (checkpoint.label, checkpoint.message_id, checkpoint.conversation_id) == ("after", tip_before, explored.pk)
    assert admin_client.get("/admin/conversations/checkpoint/add/").status_code == 403


@pytest.mark.req("SB-5", "CH-9")
def test_renaming_a_checkpoint_to_a_label_the_conversation_has_is_a_form_error(admin_client, explored):
    """QA: the rename hit the unique constraint and answered "Server Error (500)"."""
    early = CheckpointFactory(conversation=explored, label="early")
    late = CheckpointFactory(conversation=explored, label="late")
    theirs = ConversationFactory()
    MessageFactory(conversation=theirs, text="theirs", as_tip=True)
    elsewhere = CheckpointFactory(conversation=theirs, label="other")
    rows_before = list(Checkpoint.objects.order_by("id").values_list("id", "label", "message_id"))

    page = admin_client.post(f"/admin/conversations/checkpoint/{late.pk}/change/", {"label": "early"})
    assert page.status_code == 200
    assert "A checkpoint named &#x27;early&#x27; already exists here" in page.content.decode()
    assert list(Checkpoint.objects.order_by("id").values_list("id", "label", "message_id")) == rows_before

    # Its own label, and a label only another conversation has, are free.
    kept = admin_client.post(f"/admin/conversations/checkpoint/{early.pk}/change/", {"label": "early"})
    moved = admin_client.post(f"/admin/conversations/checkpoint/{late.pk}/change/", {"label": "other"})
    assert (kept.status_code, moved.status_code) == (302, 302)
    late.refresh_from_db()
    elsewhere.refresh_from_db()
    assert (late.label, elsewhere.label) == ("other", "other")
