"""The session tree: branch, edit and re-run, fork (CH-7, CH-8)."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agents import chat
from agents.models import Run
from controlcenter.errors import Conflict, DomainError
from conversations import selectors, services
from conversations.models import Checkpoint, Conversation, Message
from tests.support.factories import ConversationFactory
from tests.support.history import add_turn

pytestmark = pytest.mark.django_db


def _texts(conversation: Conversation) -> list[str]:
    return [
        block.get("text", "")
        for message in selectors.current_path(conversation)
        for block in message.content
        if block.get("type") == "text"
    ]


def _writes(queries) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].split()[0].upper() in ("INSERT", "UPDATE", "DELETE")]


@pytest.mark.req("CH-7")
def test_branch_is_one_update_of_the_tip_and_writes_nothing_else(explored):
    first_answer = selectors.current_path(explored)[1]
    messages_before = Message.objects.count()
    with CaptureQueriesContext(connection) as queries:
        services.conversation_branch(conversation=explored, message_id=first_answer.pk)
    writes = _writes(queries)
    assert len(writes) == 1 and writes[0].upper().startswith("UPDATE") and "conversations_conversation" in writes[0]
    assert Message.objects.count() == messages_before
    assert explored.tip_id == first_answer.pk
    assert _texts(explored) == ["Plan the migration; keep the API stable.", "Here is the plan."]


@pytest.mark.req("CH-7")
def test_a_branch_to_the_tip_it_already_has_writes_nothing(alice_api, explored):
    """QA: branching (or sibling navigation) to the current message moved the conversation to the top of the list."""
    later = ConversationFactory(owner=explored.owner, title="Written to later")
    add_turn(later, "Hello.", "Hi.")
    explored.refresh_from_db()
    updated_before = explored.updated_at
    with CaptureQueriesContext(connection) as queries:
        response = alice_api.post(
            f"/api/conversations/{explored.pk}/branch/", {"message": explored.tip_id}, format="json"
        )
    assert response.status_code == 200, response.content
    assert _writes(queries) == []
    explored.refresh_from_db()
    assert explored.updated_at == updated_before
    listed = alice_api.get("/api/conversations/").json()
    titles = [c["title"] for c in (listed["results"] if isinstance(listed, dict) else listed)]
    assert titles.index("Written to later") < titles.index(explored.title)


@pytest.mark.req("CH-7")
def test_going_back_after_a_branch_is_another_pointer_move(explored):
    old_tip = explored.tip_id
    old_path = [m.pk for m in selectors.current_path(explored)]
    services.conversation_branch(conversation=explored, message_id=old_path[1])
    add_turn(explored, "Try another way.", "Another way.")
    services.conversation_branch(conversation=explored, message_id=old_tip)
    assert [m.pk for m in selectors.current_path(explored)] == old_path


@pytest.mark.req("CH-7")
def test_edit_and_rerun_keeps_the_answer_being_compared_against(explored):
    path = selectors.current_path(explored)
    prompt, old_answer = path[2], path[-1]
    sent = chat.message_edit(conversation=explored, message_id=prompt.pk, text="List only the Python files.")
    assert sent.message.parent_id == prompt.parent_id and sent.message.pk != prompt.pk
    assert sent.run.trigger_id == sent.message.pk and sent.run.status == Run.Status.QUEUED
    assert explored.tip_id == sent.message.pk
    # The old answer is still in the tree, one pointer move away.
    siblings = Message.objects.filter(parent_id=prompt.parent_id).order_by("id")
    assert [m.pk for m in siblings] == [prompt.pk, sent.message.pk]
    Run.objects.filter(pk=sent.run.pk).update(status=Run.Status.SUCCEEDED)
    services.conversation_branch(conversation=explored, message_id=old_answer.pk)
    assert _texts(explored)[-1] == "There are three files."


@pytest.mark.req("CH-7")
def test_edit_refuses_a_tool_result_or_an_answer_and_stores_nothing(explored):
    path = selectors.current_path(explored)
    tool_result, answer = path[4], path[5]
    count = Message.objects.count()
    for target in (tool_result, answer):
        with pytest.raises(DomainError, match="not a prompt you wrote"):
            chat.message_edit(conversation=explored, message_id=target.pk, text="x")
    assert Message.objects.count() == count and not Run.objects.exists()


@pytest.mark.req("CH-7")
def test_branch_refuses_a_message_that_stops_mid_turn_and_another_conversations_message(explored, alice):
    tool_call = selectors.current_path(explored)[3]
    tip = explored.tip_id
    with pytest.raises(DomainError, match="middle of a turn"):
        services.conversation_branch(conversation=explored, message_id=tool_call.pk)
    other = ConversationFactory(owner=alice, title="Other")
    stranger = add_turn(other, "Hi", "Hello")[0]
    with pytest.raises(DomainError, match="not part of conversation"):
        services.conversation_branch(conversation=explored, message_id=stranger.pk)
    explored.refresh_from_db()
    assert explored.tip_id == tip


@pytest.mark.req("CH-8")
def test_fork_copies_the_path_with_new_ids(explored):
    original = selectors.current_path(explored)
    fork = services.conversation_fork(conversation=explored)
    copied = selectors.current_path(fork)
    assert [(m.role, m.content) for m in copied] == [(m.role, m.content) for m in original]
    assert not {m.pk for m in copied} & {m.pk for m in original}
    assert Message.objects.filter(pk__in=[m.id for m in copied], conversation=fork).count() == len(copied)
    assert copied[0].parent_id is None and fork.forked_from_id == explored.pk and fork.owner_id == explored.owner_id


@pytest.mark.req("CH-8")
def test_fork_does_not_see_later_messages_of_the_original_nor_the_other_way_round(explored):
    fork = services.conversation_fork(conversation=explored)
    add_turn(explored, "Original goes on.", "Original answer.")
    add_turn(fork, "Fork goes on.", "Fork answer.")
    assert "Original goes on." not in _texts(fork) and "Original answer." not in _texts(fork)
    assert "Fork goes on." not in _texts(explored) and "Fork answer." not in _texts(explored)
    # Not on another branch either: no row of the fork holds the original's later messages.
    fork_texts = [b.get("text") for m in Message.objects.filter(conversation=fork) for b in m.content]
    assert "Original goes on." not in fork_texts and "Original answer." not in fork_texts


@pytest.mark.req("CH-8")
def test_fork_of_a_long_path_is_one_insert_of_messages(conversation):
    for index in range(30):
        add_turn(conversation, f"Prompt {index}", f"Answer {index}")
    with CaptureQueriesContext(connection) as queries:
        fork = services.conversation_fork(conversation=conversation)
    message_inserts = [q for q in _writes(queries) if q.startswith("INSERT") and "conversations_message" in q]
    assert len(message_inserts) == 1
    assert len(selectors.current_path(fork)) == 60


@pytest.mark.req("CH-8")
@pytest.mark.req("CH-9")
def test_fork_carries_checkpoints_on_the_path_pointing_at_the_copies(explored):
    services.checkpoint_create(conversation=explored, label="listed")
    fork = services.conversation_fork(conversation=explored)
    copied = Checkpoint.objects.get(conversation=fork)
    assert copied.label == "listed" and copied.message_id == fork.tip_id != explored.tip_id


@pytest.mark.req("CH-8")
def test_fork_of_an_empty_conversation_is_refused(conversation):
    with pytest.raises(DomainError, match="nothing to fork"):
        services.conversation_fork(conversation=conversation)
    assert Conversation.objects.count() == 1


@pytest.mark.req("CH-7")
def test_edit_while_a_run_is_in_progress_is_a_conflict(explored):
    prompt = selectors.current_path(explored)[2]
    chat.message_edit(conversation=explored, message_id=prompt.pk, text="again")
    with pytest.raises(Conflict):
        chat.message_edit(conversation=explored, message_id=prompt.pk, text="and again")
    assert Message.objects.filter(parent_id=prompt.parent_id).count() == 2


@pytest.mark.req("CH-7")
def test_the_path_loads_in_one_query_as_plain_rows_equal_to_the_stored_messages(explored):
    stored = {m.pk: m for m in Message.objects.filter(conversation=explored)}
    with CaptureQueriesContext(connection) as queries:
        path = selectors.current_path(explored)
    assert len(queries) == 1
    assert path[-1].id == explored.tip_id and path[0].parent_id is None
    for parent, child in zip(path, path[1:], strict=False):
        assert child.parent_id == parent.id
    for row in path:
        message = stored[row.id]
        assert (row.role, row.content, row.parent_id) == (message.role, message.content, message.parent_id)
        assert datetime.fromisoformat(row.created_at) == message.created_at
    # A tip of another conversation loads nothing rather than someone else's path.
    other = ConversationFactory(owner=explored.owner, title="other")
    assert selectors.path_to(conversation_id=other.pk, tip_id=explored.tip_id) == []
    assert selectors.path_to(conversation_id=explored.pk, tip_id=None) == []
