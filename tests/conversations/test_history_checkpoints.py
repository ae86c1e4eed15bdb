"""Checkpoint and rewind (CH-9)."""

from __future__ import annotations

import json

import pytest

from agents import chat
from agents.lifecycle import run_execute
from agents.models import Run
from agents.turns import turn_history as _turn_history
from controlcenter.errors import DomainError
from conversations import selectors, services
from conversations.models import Checkpoint, Conversation, Message, RewindDigest
from engine.context.transcript import RequestCount
from tests.support.factories import CheckpointFactory
from tests.support.history import add_turn

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
    CheckpointFactory(conversation=explored, label="early", message_id=first)
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
    chat.message_send(conversation=explored, text="One more thing.")
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


@pytest.mark.req("CH-9")
def test_the_next_turn_sends_the_rewind_digest_after_the_checkpoint_and_requests_only_grow(explored):
    services.checkpoint_create(conversation=explored, label="before-refactor")
    at_checkpoint = selectors.history_view(conversation_id=explored.pk, tip_id=explored.tip_id)
    add_turn(explored, "Rename the module.", "Renamed, but the tests fail.", tools=[("run_tests", {"ok": False})])
    explored_tip = explored.tip_id
    services.conversation_rewind(conversation=explored, label="before-refactor")

    _, run = chat.message_send(conversation=explored, text="Try an adapter instead.")
    # The history the run sends, built by the runtime's own turn-building code.
    sent = _turn_history(run, overhead=RequestCount(), emit=lambda kind, payload: None)
    assert sent[: len(at_checkpoint)] == at_checkpoint  # nothing before the checkpoint was rewritten
    assert len(sent) == len(at_checkpoint) + 1
    note, prompt = sent[-1]["content"]
    assert prompt == {"type": "text", "text": "Try an adapter instead."}
    assert note["text"].startswith("[rewind note]")
    for seen in ("'before-refactor'", '"Rename the module."', "run_tests x1", "tool errors: 1", "the tests fail"):
        assert seen in note["text"], seen

    # The turn runs for real; the next turn's request starts with every byte this one sent.
    run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    explored.refresh_from_db()
    _, second = chat.message_send(conversation=explored, text="Go on.")
    later = _turn_history(second, overhead=RequestCount(), emit=lambda kind, payload: None)
    assert later[: len(sent)] == sent and len(later) == len(sent) + 2

    # /context and the export show the note where the model reads it; the stored prompt is unchanged.
    prompt_id = Message.objects.get(conversation=explored, content=[prompt]).pk
    context = chat.command_run(conversation=explored, text="/context").data
    assert [(n["message"], n["text"]) for n in context["rewind_notes"]] == [(prompt_id, note["text"])]
    exported = selectors.conversation_export(conversation=explored, kind="json")
    (carrier,) = [m for m in exported["messages"] if m.get("rewind_notes")]
    assert carrier["id"] == prompt_id and carrier["rewind_notes"] == [note["text"]] and carrier["content"] == [prompt]
    assert f"**Rewind note**\n\n```text\n{note['text']}\n```" in selectors.conversation_export(
        conversation=explored, kind="markdown"
    )

    # The explored path itself was written before the rewind: going back to it carries no note.
    explored_view = selectors.history_view(conversation_id=explored.pk, tip_id=explored_tip)
    assert "[rewind note]" not in json.dumps(explored_view)


@pytest.mark.req("CH-9")
def test_a_compaction_at_the_checkpoint_keeps_the_rewind_note_of_the_prompt_after_it(explored):
    services.checkpoint_create(conversation=explored, label="cp")
    add_turn(explored, "Try the risky idea.", "It broke the build.")
    services.conversation_rewind(conversation=explored, label="cp")
    chat.command_run(conversation=explored, text="/shake")  # a compaction view whose tip is the checkpoint
    _, run = chat.message_send(conversation=explored, text="Do the safe thing.")
    sent = _turn_history(run, overhead=RequestCount(), emit=lambda kind, payload: None)
    note, prompt = sent[-1]["content"]
    assert prompt["text"] == "Do the safe thing." and '"Try the risky idea."' in note["text"]


@pytest.mark.req("CH-8", "CH-9")
def test_a_fork_sends_the_rewind_notes_its_source_sends_and_no_others(explored):
    """QA: the fork's Context showed rewind_notes: [] and its next request carried no note."""
    services.checkpoint_create(conversation=explored, label="early")
    add_turn(explored, "Try the risky idea.", "It broke the build.")
    explored_tip = explored.tip_id
    services.conversation_rewind(conversation=explored, label="early")
    add_turn(explored, "Do the safe thing.", "Done safely.")
    original = selectors.history_view(conversation_id=explored.pk, tip_id=explored.tip_id)
    assert "[rewind note]" in json.dumps(original)

    fork = services.conversation_fork(conversation=explored)
    assert selectors.history_view(conversation_id=fork.pk, tip_id=fork.tip_id) == original
    notes = chat.command_run(conversation=fork, text="/context").data["rewind_notes"]
    prompt = Message.objects.get(conversation=fork, content=[{"type": "text", "text": "Do the safe thing."}])
    assert [n["message"] for n in notes] == [prompt.pk]
    _, run = chat.message_send(conversation=fork, text="Go on.")
    sent = _turn_history(run, overhead=RequestCount(), emit=lambda kind, payload: None)
    assert sent[: len(original)] == original

    # The explored path was written before the rewind and carries no note; neither does its fork.
    services.conversation_branch(conversation=explored, message_id=explored_tip)
    explored_fork = services.conversation_fork(conversation=explored)
    view = selectors.history_view(conversation_id=explored_fork.pk, tip_id=explored_fork.tip_id)
    assert "[rewind note]" not in json.dumps(view)
    assert view == selectors.history_view(conversation_id=explored.pk, tip_id=explored_tip)
