"""Turn-boundary persistence and retry (CH-5; the SIGKILL-a-worker test lives with the worker fixture)."""

from __future__ import annotations

import pytest

from agents import chat
from agents.lifecycle import run_execute
from agents.models import Run
from controlcenter.errors import Conflict
from conversations import selectors
from conversations.models import Message
from tests.support.factories import ConversationFactory

pytestmark = pytest.mark.django_db


@pytest.mark.req("CH-5")
def test_retry_tells_nothing_to_retry_from_nothing_loaded(conversation, explored):
    with pytest.raises(chat.NothingToRetry, match="nothing to retry") as finished:
        chat.conversation_retry(conversation=explored)
    empty = ConversationFactory(owner=conversation.owner, title="Empty")
    with pytest.raises(chat.NothingLoaded, match="no persisted transcript") as unloaded:
        chat.conversation_retry(conversation=empty)
    assert finished.value.code == "nothing_to_retry" != unloaded.value.code == "nothing_loaded"
    assert not Run.objects.exists()


@pytest.mark.req("CH-5")
def test_a_failed_turn_leaves_the_previous_turn_and_retry_reruns_its_prompt(explored, settings, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("the workspace cannot be created here")
    settings.CC_WORKSPACE_ROOT = blocker
    sent = chat.message_send(conversation=explored, text="List the files in the workspace.")
    stored = list(Message.objects.values_list("id", flat=True))

    run_execute(run_id=sent.run.pk, worker="test-worker")

    sent.run.refresh_from_db()
    explored.refresh_from_db()
    assert sent.run.status == Run.Status.FAILED and sent.run.error
    assert list(Message.objects.values_list("id", flat=True)) == stored
    assert explored.tip_id == sent.message.pk

    settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
    retry = chat.conversation_retry(conversation=explored)
    assert retry.trigger_id == sent.message.pk and retry.status == Run.Status.QUEUED
    run_execute(run_id=retry.pk, worker="test-worker")

    explored.refresh_from_db()
    turn = selectors.current_path(explored)[-4:]
    assert [m.role for m in turn] == ["user", "assistant", "user", "assistant"]
    assert turn[0].pk == sent.message.pk
    assert turn[1].content[-1]["type"] == "tool_use"
    assert turn[2].content[0]["tool_use_id"] == turn[1].content[-1]["id"]
    with pytest.raises(chat.NothingToRetry):
        chat.conversation_retry(conversation=explored)


@pytest.mark.req("CH-5")
def test_retry_while_a_run_is_in_progress_is_a_conflict(explored):
    chat.message_send(conversation=explored, text="Go on.")
    with pytest.raises(Conflict, match="still in progress"):
        chat.conversation_retry(conversation=explored)
    assert Run.objects.count() == 1
