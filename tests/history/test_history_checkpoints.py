"""Checkpoint and rewind (CH-9)."""

from __future__ import annotations

import pytest

from controlcenter.errors import DomainError
from conversations import selectors, services
from conversations.models import Checkpoint, Conversation, Message, RewindDigest
from tests.history.conftest import add_turn

pytestmark = pytest.mark.django_db


@pytest.mark.req("CH-9")
def test_rewind_returns_to_the_checkpoint_and_keeps_a_digest_of_the_exploration(explored):
    services.checkpoint_create(conversation=explored, label="before-refactor")
    mark = explored.tip_id
    add_turn(explored, "Rename the module.", "Renamed, but the tests fail.", tools=[("list_dir", {"ok": False})])
    add_turn(explored, "Fix the tests.", "Could not fix them.")
    explored_tip = explored.tip_id

    record = services.conversation_rewind(conversation=explored, label="before-refactor")

    assert explored.tip_id == mark
    assert record.target_id == mark and record.explored_tip_id == explored_tip
    digest = record.digest
    assert digest["tried"] == ["Rename the module.", "Fix the tests."]
    assert digest["tools"] == {"list_dir": 1}
    assert digest["outcome"] == "Could not fix them."
    assert digest["messages"] == 6
    # The explored path is still in the tree: going back to it is a pointer move.
    services.conversation_branch(conversation=explored, message_id=explored_tip)
    assert selectors.current_path(explored)[-1].pk == explored_tip


@pytest.mark.req("CH-9")
def test_rewind_without_a_label_goes_to_the_latest_checkpoint_behind_the_tip(explored):
    first = selectors.current_path(explored)[1].pk
    Checkpoint.objects.create(conversation=explored, label="early", message_id=first)
    services.checkpoint_create(conversation=explored, label="late")
    late = explored.tip_id
    add_turn(explored, "Explore.", "Explored.")
    services.conversation_rewind(conversation=explored)
    assert explored.tip_id == late


@pytest.mark.req("CH-9")
def test_checkpoints_survive_a_restart(explored):
    services.checkpoint_create(conversation=explored, label="saved")
    add_turn(explored, "Explore.", "Explored.")
    # A restart loses every in-memory object; only the database is left.
    fresh = Conversation.objects.get(pk=explored.pk)
    services.conversation_rewind(conversation=fresh, label="saved")
    assert fresh.tip.content[0]["text"] == "There are three files."


@pytest.mark.req("CH-9")
def test_a_checkpoint_whose_target_was_cut_away_is_dropped_never_moved(explored):
    services.checkpoint_create(conversation=explored, label="doomed")
    target = explored.tip
    parent = target.parent_id
    Message.objects.filter(pk=target.pk).delete()
    assert not Checkpoint.objects.filter(label="doomed").exists()
    assert not Checkpoint.objects.filter(message_id=parent).exists()
    with pytest.raises(DomainError, match="no checkpoint named 'doomed'"):
        services.conversation_rewind(conversation=Conversation.objects.get(pk=explored.pk), label="doomed")


@pytest.mark.req("CH-9")
def test_checkpoint_only_at_a_clean_turn_boundary(explored):
    # The tip is a prompt still waiting for its answer.
    services.message_send(conversation=explored, text="One more thing.")
    with pytest.raises(DomainError):
        services.checkpoint_create(conversation=explored, label="mid")
    tool_result = selectors.current_path(explored)[4]
    explored.runs.update(status="failed")
    services.conversation_branch(conversation=explored, message_id=tool_result.pk)
    with pytest.raises(DomainError, match="not a clean turn boundary"):
        services.checkpoint_create(conversation=explored, label="mid")
    assert not Checkpoint.objects.exists()


@pytest.mark.req("CH-9")
@pytest.mark.parametrize("label", ["", " ", "has space", "-dash-first", "x" * 65, "ünïcode"])
def test_bad_checkpoint_labels_are_refused_and_nothing_is_stored(explored, label):
    with pytest.raises(DomainError, match="not a valid label"):
        services.checkpoint_create(conversation=explored, label=label)
    assert not Checkpoint.objects.exists()


@pytest.mark.req("CH-9")
def test_duplicate_label_and_rewind_errors_change_nothing(explored):
    services.checkpoint_create(conversation=explored, label="one")
    with pytest.raises(DomainError, match="already exists"):
        services.checkpoint_create(conversation=explored, label="one")
    tip = explored.tip_id
    with pytest.raises(DomainError, match="nothing was explored"):
        services.conversation_rewind(conversation=explored, label="one")
    with pytest.raises(DomainError, match="no checkpoint named 'two'; checkpoints here: one"):
        services.conversation_rewind(conversation=explored, label="two")
    # A checkpoint on another branch is not behind the tip: rewinding there would land elsewhere.
    first_answer = selectors.current_path(explored)[1].pk
    services.conversation_branch(conversation=explored, message_id=first_answer)
    with pytest.raises(DomainError, match="not on the current branch"):
        services.conversation_rewind(conversation=explored, label="one")
    with pytest.raises(DomainError, match="no checkpoint behind the tip"):
        services.conversation_rewind(conversation=explored)
    explored.refresh_from_db()
    assert explored.tip_id == first_answer != tip
    assert Checkpoint.objects.count() == 1 and not RewindDigest.objects.exists()
