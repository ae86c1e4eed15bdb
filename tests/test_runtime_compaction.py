"""The ladder in the runtime: proactive at a threshold, reactive on a too-long prompt, no model call (CH-2)."""

from __future__ import annotations

import json

import pytest

from agents.chat import message_send
from agents.lifecycle import run_execute
from agents.models import ModelRequest, Run, RunEvent
from agents.turns import reactive_compaction_hook as _reactive_compaction
from conversations.models import Compaction, Conversation, Message
from conversations.services import conversation_create
from engine.loop import run_turn
from engine.providers.emulator import Emulator
from engine.providers.inprocess import EmulatorProvider
from engine.request import text_block

pytestmark = [pytest.mark.django_db, pytest.mark.req("CH-2")]


def _long_conversation(owner, turns: int = 12, output_chars: int = 12_000) -> Conversation:
    """Old turns with large tool output: what a long agent session leaves behind."""
    conversation = conversation_create(owner=owner, title="long")
    parent = Message.objects.create(
        conversation=conversation, role="user", content=[{"type": "text", "text": "Audit the repository."}]
    )
    for n in range(turns):
        call = Message.objects.create(
            conversation=conversation,
            parent=parent,
            role="assistant",
            content=[{"type": "tool_use", "id": f"toolu_{n}", "name": "bash", "input": {"command": f"step {n}"}}],
        )
        result = Message.objects.create(
            conversation=conversation,
            parent=call,
            role="user",
            content=[
                {
                    "type": "tool_result",
                    "tool_use_id": f"toolu_{n}",
                    "content": json.dumps(
                        {"ok": True, "stdout": f"output {n} " + "lorem ipsum " * (output_chars // 12)}
                    ),
                }
            ],
        )
        parent = Message.objects.create(
            conversation=conversation,
            parent=result,
            role="assistant",
            content=[{"type": "text", "text": f"Step {n} done."}],
        )
    conversation.tip = parent
    conversation.save()
    return conversation


@pytest.fixture
def small_window(settings):
    settings.CC_CONTEXT_WINDOW_TOKENS = 30_000
    settings.CC_COMPACT_AT_PERCENT = 80
    settings.CC_COMPACT_TO_PERCENT = 50
    settings.CC_COMPACT_TAIL_TOKENS = 1_000


def test_a_turn_past_the_threshold_compacts_first_and_later_turns_reuse_the_view(alice, alice_api, small_window):
    conversation = _long_conversation(alice)  # about 36k tokens of history
    _, first = message_send(conversation=conversation, text="What did you find?")
    run_execute(run_id=first.pk, worker="test")
    first.refresh_from_db()
    assert first.status == Run.Status.SUCCEEDED, first.error

    compaction = Compaction.objects.get(conversation=conversation)
    assert compaction.trigger == "proactive"
    assert compaction.run_id == first.pk  # the run that caused it, recorded, not guessed from times
    listed = alice_api.get(f"/api/runs/{first.pk}/").json()["compactions"]
    assert [(c["id"], c["run"], c["trigger"]) for c in listed] == [(compaction.pk, first.pk, "proactive")]
    assert compaction.tokens_before > 24_000 >= compaction.tokens_after
    event = RunEvent.objects.get(run=first, type="compaction").payload
    assert event["trigger"] == "proactive" and event["tokens_after"] == compaction.tokens_after
    sent = ModelRequest.objects.filter(run=first).order_by("step").first()
    assert sent.prompt_tokens < 30_000 * 50 // 100 + 2_000  # the view, not the whole path, was sent
    # The whole conversation is still stored: compaction is a view, nothing was deleted.
    assert Message.objects.filter(conversation=conversation).count() == 1 + 12 * 3 + 2

    conversation.refresh_from_db()
    _, second = message_send(conversation=conversation, text="And the next step?")
    run_execute(run_id=second.pk, worker="test")
    second.refresh_from_db()
    assert second.status == Run.Status.SUCCEEDED, second.error
    assert Compaction.objects.filter(conversation=conversation).count() == 1  # the view was reused
    assert alice_api.get(f"/api/runs/{second.pk}/").json()["compactions"] == []
    # /compact from the API belongs to the conversation only: no run caused it.
    assert alice_api.post(f"/api/conversations/{conversation.pk}/compact/", {}, format="json").json()["run"] is None
    reused = ModelRequest.objects.filter(run=second).order_by("step").first()
    assert reused.cache_read_input_tokens > 0  # same prefix as the first turn's requests (TD-11)


def test_a_prompt_the_provider_refuses_as_too_long_is_compacted_once_and_sent_again(alice, settings):
    settings.CC_COMPACT_TAIL_TOKENS = 1_000
    conversation = _long_conversation(alice)
    _, run = message_send(conversation=conversation, text="Summarize the audit.")
    history = [{"role": m.role, "content": m.content} for m in Message.objects.filter(conversation=conversation)]
    provider = EmulatorProvider(Emulator(context_window=20_000))
    events = []

    outcome = run_turn(
        provider=provider,
        model="claude-test",
        system=[text_block("You audit repositories.")],
        history=history,
        toolbox=_NoTools(),
        emit=lambda kind, payload: events.append((kind, payload)),
        on_prompt_too_long=_reactive_compaction(run, lambda kind, payload: events.append((kind, payload))),
    )
    assert outcome.stop_reason == "end_turn"
    compaction = Compaction.objects.get(conversation=conversation)
    assert compaction.trigger == "reactive"
    assert compaction.run_id == run.pk
    assert compaction.rung in ("elide", "drop_images", "snapshot")  # never a model call
    assert ("compaction", {"trigger": "reactive", "rung": compaction.rung, "tokens_before": compaction.tokens_before,
                           "tokens_after": compaction.tokens_after}) in events  # fmt: skip


def test_when_one_pass_cannot_fit_the_run_fails_with_the_measured_size(alice, settings):
    settings.CC_COMPACT_TAIL_TOKENS = 1_000
    conversation = _long_conversation(alice)
    _, run = message_send(conversation=conversation, text="Summarize.")
    history = [{"role": m.role, "content": m.content} for m in Message.objects.filter(conversation=conversation)]
    from engine.providers.protocol import PromptTooLong

    with pytest.raises(PromptTooLong) as refused:
        run_turn(
            # A window smaller than the literal head and tail plus one snapshot page.
            provider=EmulatorProvider(Emulator(context_window=400)),
            model="claude-test",
            system=[],
            history=history,
            toolbox=_NoTools(),
            emit=lambda kind, payload: None,
            on_prompt_too_long=_reactive_compaction(run, lambda kind, payload: None),
        )
    assert refused.value.tokens > 400 and refused.value.maximum == 400
    assert not Compaction.objects.filter(conversation=conversation).exists()


class _NoTools:
    def schemas(self) -> list:
        return []

    def execute(self, name, arguments) -> dict:
        return {"ok": False, "error": "no tools here"}
