"""The ladder in the runtime: proactive at a threshold, reactive on a too-long prompt, no model call (CH-2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.chat import message_send
from agents.lifecycle import run_execute
from agents.models import ModelRequest, Run, RunEvent
from agents.turns import reactive_compaction_hook as _reactive_compaction
from conversations.models import Compaction, Conversation, Message
from conversations.services import conversation_create
from engine.context.transcript import RequestCount
from engine.emulator import Emulator
from engine.loop import run_turn
from engine.providers.inprocess import EmulatorProvider
from engine.providers.protocol import PromptTooLong as PromptTooLong_
from engine.request import text_block
from toolcatalog.builtins import WorkspaceToolBox

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
    # /compact from the same stored messages gives the same view: nothing to free, nothing recorded (CH-11).
    again = alice_api.post(f"/api/conversations/{conversation.pk}/compact/", {}, format="json")
    assert again.status_code == 200 and again.json()["recorded"] is False, again.json()
    assert Compaction.objects.filter(conversation=conversation).count() == 1
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
        model="claude-sonnet-4-5",
        system=[text_block("You audit repositories.")],
        history=history,
        toolbox=_NoTools(),
        emit=lambda kind, payload: events.append((kind, payload)),
        on_prompt_too_long=_reactive_compaction(
            run, lambda kind, payload: events.append((kind, payload)), overhead=lambda: RequestCount(system=10)
        ),
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
            model="claude-sonnet-4-5",
            system=[],
            history=history,
            toolbox=_NoTools(),
            emit=lambda kind, payload: None,
            on_prompt_too_long=_reactive_compaction(run, lambda kind, payload: None, overhead=RequestCount),
        )
    assert refused.value.tokens > 400 and refused.value.maximum == 400
    assert not Compaction.objects.filter(conversation=conversation).exists()


class _NoTools(WorkspaceToolBox):
    def __init__(self) -> None:
        super().__init__(Path("no-tools"), tools={})


class _BigTools(_NoTools):
    """A tool block of about 2,600 tokens, like the resident set the issue measured."""

    def schemas(self) -> list:
        return [
            {
                "name": f"tool_{n}",
                "description": "Does one careful thing to the repository and reports it. " * 9,
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
            }
            for n in range(20)
        ]


@pytest.mark.req("CH-12")
def test_recovery_counts_system_and_tools_when_they_push_a_fitting_history_over(alice, settings):
    from engine.context.transcript import overhead_count, transcript_tokens
    from engine.providers.protocol import PromptTooLong
    from engine.tokens import tool_prompt_tokens

    settings.CC_COMPACT_TAIL_TOKENS = 1_000
    conversation = _long_conversation(alice, turns=4, output_chars=12_000)
    _, run = message_send(conversation=conversation, text="Summarize the audit.")
    history = [{"role": m.role, "content": m.content} for m in Message.objects.filter(conversation=conversation)]
    system, tools = [text_block("You audit repositories. " * 40)], _BigTools()
    # The provider's tool-use system prompt is part of what the history must leave room for.
    tool_prompt = tool_prompt_tokens("emulator", "claude-sonnet-4-5")
    overhead = overhead_count(system, tools.schemas(), tool_prompt=tool_prompt).total
    # The history alone fits the provider's window with room to spare; with system and tools it does not.
    window = transcript_tokens(history) + overhead // 2
    assert transcript_tokens(history) < window * 0.9 < transcript_tokens(history) + overhead
    outcome = run_turn(
        provider=EmulatorProvider(Emulator(context_window=window)),
        model="claude-sonnet-4-5",
        system=system,
        history=history,
        toolbox=tools,
        emit=lambda kind, payload: None,
        on_prompt_too_long=_reactive_compaction(
            run,
            lambda kind, payload: None,
            overhead=lambda: overhead_count(system, tools.schemas(), tool_prompt=tool_prompt),
        ),
    )
    assert outcome.stop_reason == "end_turn"
    compaction = Compaction.objects.get(conversation=conversation, trigger="reactive")
    # The retry went out below the maximum with a margin, by the provider's own count.
    sent = outcome.steps[0]
    assert sent.usage.input_tokens + sent.usage.cache_read_input_tokens + sent.usage.cache_creation_input_tokens <= (
        window * 0.9
    )
    assert compaction.tokens_after + overhead < window
    with pytest.raises(PromptTooLong):
        # The same history without recovery is refused: the case the old size check missed.
        run_turn(
            provider=EmulatorProvider(Emulator(context_window=window)),
            model="claude-sonnet-4-5",
            system=system,
            history=history,
            toolbox=tools,
            emit=lambda kind, payload: None,
        )


def _prose_conversation(owner) -> Conversation:
    """Eight turns of a model's prose: text the free rungs cannot shorten."""
    prose = "I read the module, traced the call into the parser and noted what breaks on empty input. " * 60
    conversation = conversation_create(owner=owner, title="prose")
    parent = Message.objects.create(conversation=conversation, role="user", content=[text_block("Audit the parser.")])
    for n in range(8):
        parent = Message.objects.create(
            conversation=conversation, parent=parent, role="assistant", content=[text_block(f"Finding {n}. {prose}")]
        )
        parent = Message.objects.create(
            conversation=conversation, parent=parent, role="user", content=[text_block(f"Go on with part {n + 1}.")]
        )
    parent = Message.objects.create(
        conversation=conversation, parent=parent, role="assistant", content=[text_block("Part 8 is next.")]
    )
    conversation.tip = parent
    conversation.model = "claude-haiku-4-5"
    conversation.save()
    return conversation


@pytest.mark.req("CH-14")
def test_a_run_climbs_to_the_summary_rung_only_when_the_free_rungs_cannot_fit(alice, settings):
    from engine.emulator.server import EmulatorServer

    conversation = _prose_conversation(alice)
    # A window where head, tail and even one snapshot page leave the target behind: only a summary fits.
    settings.CC_CONTEXT_WINDOW_TOKENS = 8_000
    settings.CC_COMPACT_AT_PERCENT, settings.CC_COMPACT_TO_PERCENT = 80, 50
    # Full-size pages (not the window-scaled ones, LM-2), so that a page cannot fit.
    settings.CC_SNAPSHOT_PAGE_PIXELS = 1072
    settings.CC_TOOL_WINDOW_PERCENT = 100  # and the full resident tool set, as before LM-2 trimmed it
    settings.CC_MODELS = {**settings.CC_MODELS, "claude-haiku-4-5": "anthropic"}
    with EmulatorServer(Emulator()) as server:
        settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "test-key", server.base_url
        _, run = message_send(conversation=conversation, text="What is left to check?")
        run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    compaction = Compaction.objects.get(conversation=conversation)
    assert compaction.rung == "summary" and compaction.trigger == "proactive" and compaction.run_id == run.pk
    assert [step["rung"] for step in compaction.steps] == ["elide", "drop_images", "snapshot", "summary"]
    summary = ModelRequest.objects.get(run=run, subagent="summary")
    # Its cost is recorded with the run, under the conversation's own model, from a bounded prompt.
    assert summary.model == "claude-haiku-4-5" and summary.prompt_tokens > 0 and summary.output_tokens > 0
    assert summary.prompt_tokens < 60_000 // 3
    assert "summary of messages #" in json.dumps(compaction.view)
    # The turn's own request sent the summarized view, not the whole path.
    first = ModelRequest.objects.filter(run=run, subagent="").order_by("step").first()
    assert first.prompt_tokens < 8_000


@pytest.mark.req("CH-14")
def test_reactive_recovery_never_calls_the_summary_rung(alice, settings):
    from agents import turns

    settings.CC_COMPACT_TAIL_TOKENS = 1_000
    conversation = _long_conversation(alice)
    _, run = message_send(conversation=conversation, text="Summarize.")
    history = [{"role": m.role, "content": m.content} for m in Message.objects.filter(conversation=conversation)]
    assert "summary" not in turns.NO_CALL_RUNGS
    compacted = turns.reactive_compaction(trigger=run.trigger, history=history, limit_tokens=9_000, run=run)
    assert compacted is not None
    assert all(step["rung"] != "summary" for step in compacted[1].steps)
    assert not ModelRequest.objects.filter(run=run).exists()


class _AlwaysTooLong:
    """A provider whose window nothing fits: the reactive pass is made, and its retry is refused too."""

    name = "too-long"

    def stream(self, request):
        raise PromptTooLong_("prompt is too long: 50000 tokens > 1000 maximum", tokens=50_000, maximum=40_000)


@pytest.mark.req("CH-12")
def test_a_pass_whose_retry_is_refused_too_is_not_kept_for_later_turns(alice, settings, monkeypatch):
    from agents import lifecycle as run_services

    settings.CC_COMPACT_TAIL_TOKENS = 1_000
    conversation = _long_conversation(alice)
    _, run = message_send(conversation=conversation, text="Summarize the audit.")
    monkeypatch.setattr(run_services, "get_provider", lambda name: _AlwaysTooLong())
    run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED and "too long" in run.error
    # The pass was made (and announced), but its view is gone: later turns start from the path again.
    assert RunEvent.objects.filter(run=run, type="compaction", payload__trigger="reactive").exists()
    assert not Compaction.objects.filter(conversation=conversation).exists()


def _window(settings, window: int) -> None:
    """The settings a worker derives from CC_CONTEXT_WINDOW_TOKENS at start (LM-2)."""
    from engine.window import budget_for_window

    budget = budget_for_window(window)
    settings.CC_CONTEXT_WINDOW_TOKENS = window
    settings.CC_COMPACT_AT_PERCENT = budget.compact_at_percent
    settings.CC_COMPACT_TO_PERCENT = budget.compact_to_percent
    settings.CC_COMPACT_TAIL_TOKENS, settings.CC_SNAPSHOT_PAGE_PIXELS = budget.compact_tail_tokens, budget.page_pixels
    settings.CC_MAX_OUTPUT_TOKENS = budget.max_output_tokens


class _ReadsTheScratchpad:
    """A model that reads the part of the prompt the scratchpad took, then answers with what it found."""

    def __init__(self) -> None:
        self.payloads: list[dict] = []

    def __call__(self, payload: dict) -> list[dict]:
        import re

        self.payloads.append(payload)
        last = payload["messages"][-1]["content"]
        blocks = [last] if isinstance(last, str) else last
        results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        if results:
            return [{"type": "text", "text": "Found: " + json.dumps(results[0]["content"])[:300]}]
        text = json.dumps(payload["messages"][-1])
        entry = re.search(r"scratchpad entry ([0-9a-f]{16})", text)
        if entry is None:
            return [{"type": "text", "text": "no entry"}]
        arguments = {"scratchpad_id": entry.group(1), "mode": "grep", "pattern": "MIDDLE-MARKER"}
        return [{"type": "tool_use", "name": "scratchpad_read", "input": arguments}]


def _big_prompt() -> str:
    """A 200 KB question: asked at both ends, with a marker in the middle only a scratchpad read finds."""
    filler = "".join(f"line {n}: the service logged a retry and moved on.\n" for n in range(2_000))
    prompt = "START-ASK: find why the deploy hangs.\n" + filler + "MIDDLE-MARKER here\n" + filler
    return prompt + "END-ASK: and say which line shows it first."


def _answered_by_a_scratchpad_reader(settings, conversation, prompt: str) -> tuple[_ReadsTheScratchpad, Run]:
    """`prompt` sent and run to its end by a model with a 20,000-token window that reads the scratchpad."""
    from engine.emulator.server import EmulatorServer

    settings.CC_MODELS = {**settings.CC_MODELS, "claude-haiku-4-5": "anthropic"}
    model = _ReadsTheScratchpad()
    with EmulatorServer(Emulator(policy=model, context_window=20_000)) as server:
        settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "test-key", server.base_url
        _, run = message_send(conversation=conversation, text=prompt)
        run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    return model, run


@pytest.mark.req("CH-13")
def test_a_prompt_larger_than_the_window_stays_text_at_both_ends_and_the_rest_is_in_the_scratchpad(alice, settings):
    from scratchpad.models import Entry
    from scratchpad.services import full_content

    _window(settings, 20_000)
    prompt = _big_prompt()
    assert 200_000 < len(prompt) < settings.CC_MAX_MESSAGE_CHARS  # a 200 KB prompt is accepted as it is
    conversation = conversation_create(owner=alice, title="big prompt")
    conversation.model = "claude-haiku-4-5"
    conversation.save()
    model, run = _answered_by_a_scratchpad_reader(settings, conversation, prompt)
    # Every request fit the window by the provider's own count; none was refused.
    requests = list(ModelRequest.objects.filter(run=run).order_by("step"))
    assert len(requests) == 2 and all(r.prompt_tokens <= 20_000 for r in requests)
    # The question's words at its start and end are text in the request, never only on a page.
    sent = model.payloads[0]["messages"][-1]["content"]
    texts = [block["text"] for block in sent if block.get("type") == "text"]
    assert any("START-ASK" in text and "END-ASK" in text for text in texts)
    assert not any(block.get("type") == "image" for block in sent)
    # The rest is in the scratchpad, pinned to the conversation, and the model read it.
    (entry,) = Entry.objects.filter(conversation=conversation, pinned=True)
    assert full_content(entry) == prompt and f"scratchpad entry {entry.pk}" in texts[0]
    assert "MIDDLE-MARKER" in json.dumps(model.payloads[1]["messages"][-1]["content"])
    compaction = Compaction.objects.get(conversation=conversation)
    assert compaction.rung == "scratchpad" and compaction.replaced[-1]["entry"] == entry.pk


@pytest.mark.req("CH-13")
@pytest.mark.req("SB-3")
def test_a_prompt_larger_than_the_window_is_still_answered_when_the_owners_scratchpad_is_full(alice, settings):
    from scratchpad.models import Entry
    from scratchpad.services import put

    _window(settings, 20_000)
    settings.CC_SCRATCHPAD_QUOTA_MB = 1
    prompt = _big_prompt()
    conversation = conversation_create(owner=alice, title="big prompt, full scratchpad")
    conversation.model = "claude-haiku-4-5"
    conversation.save()
    # Her scratchpad is nearly full with a live entry of another conversation of hers.
    other = conversation_create(owner=alice, title="earlier")
    put(turn_id="earlier", content="x" * (1024 * 1024 - 1000), conversation_id=other.pk, pinned=True, ttl_seconds=3600)
    before = Entry.objects.count()
    model, run = _answered_by_a_scratchpad_reader(settings, conversation, prompt)
    assert all(r.prompt_tokens <= 20_000 for r in ModelRequest.objects.filter(run=run))
    # Both ends are text; the middle is left out, said plainly, and nothing was stored past the quota.
    texts = [block["text"] for block in model.payloads[0]["messages"][-1]["content"] if block.get("type") == "text"]
    cut = next(text for text in texts if "START-ASK" in text)
    assert "END-ASK" in cut and "the user's scratchpad is full" in cut and "scratchpad entry" not in cut
    assert Entry.objects.count() == before
    compaction = Compaction.objects.get(conversation=conversation)
    assert compaction.replaced[-1]["entry"] is None


@pytest.mark.req("CH-14")
@pytest.mark.parametrize("how", ["api", "command"])
def test_the_summary_rung_asked_for_runs_in_a_worker_with_the_conversations_model_and_records_its_cost(
    alice, alice_api, client, settings, how
):
    from engine.emulator.server import EmulatorServer

    conversation = _prose_conversation(alice)
    settings.CC_MODELS = {**settings.CC_MODELS, "claude-haiku-4-5": "anthropic"}
    url = f"/api/conversations/{conversation.pk}/"
    with EmulatorServer(Emulator()) as server:
        settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "test-key", server.base_url
        if how == "api":
            response = alice_api.post(url + "compact/", {"rungs": ["elide", "summary"]}, format="json")
            assert response.status_code == 202, response.json()
            run_id = response.json()["run"]["id"]
            assert response.json()["run"]["compact_rungs"] == ["elide", "summary"]
        else:
            response = alice_api.post(url + "messages/", {"text": "/compact summary"}, format="json")
            assert response.status_code == 200, response.json()
            run_id = response.json()["command"]["data"]["run"]
        # The web process called no model: the pass waits for a worker, and holds the conversation meanwhile.
        assert not Compaction.objects.exists() and not ModelRequest.objects.exists()
        busy = alice_api.post(url + "compact/", {"rungs": ["summary"]}, format="json")
        assert busy.status_code == 409 and Run.objects.count() == 1
        run_execute(run_id=run_id, worker="test")
    run = Run.objects.get(pk=run_id)
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert run.trigger_id == conversation.tip_id and run.model == "claude-haiku-4-5"
    compaction = Compaction.objects.get(conversation=conversation)
    assert compaction.rung == "summary" and compaction.run_id == run.pk and compaction.trigger == "command"
    assert "summary of messages #" in json.dumps(compaction.view)
    # One bounded call of the conversation's own model, paid for and recorded with the run.
    (summary,) = ModelRequest.objects.filter(run=run)
    assert summary.subagent == "summary" and summary.model == "claude-haiku-4-5"
    assert 0 < summary.prompt_tokens < 60_000 // 3 and summary.output_tokens > 0
    listed = alice_api.get(f"/api/runs/{run.pk}/").json()
    assert [c["id"] for c in listed["compactions"]] == [compaction.pk] and listed["model_requests"]
    assert RunEvent.objects.filter(run=run, type="compaction", payload__rung="summary").exists()
    # The conversation page draws no prompt card for it (it answers none).
    client.force_login(alice)
    page = client.get(f"/conversations/{conversation.pk}/")
    assert page.status_code == 200 and f"run {run.pk}<" not in page.content.decode()
    # Free rungs after it start again from the stored messages and would send more than the summary
    # does: nothing recorded, and the answer says why (QA: "freed": -3827, "would free 0 tokens").
    again = alice_api.post(url + "compact/", {"rungs": ["elide", "drop_images", "snapshot"]}, format="json")
    assert again.status_code == 200 and again.json()["recorded"] is False
    assert again.json()["tokens_after"] > again.json()["tokens_now"] and again.json()["freed"] == 0
    assert "starts again from the stored messages" in again.json()["detail"]
    assert Compaction.objects.filter(conversation=conversation).count() == 1


@pytest.mark.req("CH-14")
def test_bad_compaction_requests_are_refused_and_store_nothing(alice, alice_api, settings):
    settings.CC_MODELS = {**settings.CC_MODELS, "claude-haiku-4-5": "anthropic"}
    conversation = _prose_conversation(alice)
    url = f"/api/conversations/{conversation.pk}/compact/"
    for body in ({"rungs": ["summarise"]}, {"rungs": []}, {"rungs": "summary"}):
        response = alice_api.post(url, body, format="json")
        assert response.status_code == 400, (body, response.json())
    # A misspelt rung is told which rungs there are.
    misspelt = alice_api.post(url, {"rungs": ["summarise"]}, format="json").json()["error"]["message"]
    assert '"summarise" is not a rung: use elide, drop_images, snapshot or summary.' in misspelt
    bad = alice_api.post(f"/api/conversations/{conversation.pk}/messages/", {"text": "/compact everything"})
    assert bad.status_code == 400 and "/compact [summary]" in bad.json()["error"]["message"]
    empty = conversation_create(owner=alice, title="empty")
    nothing = alice_api.post(f"/api/conversations/{empty.pk}/compact/", {"rungs": ["summary"]}, format="json")
    assert nothing.status_code == 409 and "nothing to compact" in nothing.json()["error"]["message"]
    _, turn = message_send(conversation=conversation, text="And now?")  # a run in flight (queued)
    for body in ({"rungs": ["summary"]}, {}):
        assert alice_api.post(url, body, format="json").status_code == 409
    assert (
        alice_api.post(f"/api/conversations/{conversation.pk}/messages/", {"text": "/compact summary"}).status_code
        == 409
    )
    assert list(Run.objects.values_list("pk", flat=True)) == [turn.pk]
    assert not Compaction.objects.exists() and not ModelRequest.objects.exists()


class _BuildsAndAnswers:
    """A model that runs a command with a long output, then answers about it in a paragraph."""

    def __call__(self, payload: dict) -> list[dict]:
        from agents.summary import SUMMARY_SYSTEM

        if payload["system"] and payload["system"][0]["text"].startswith(SUMMARY_SYSTEM[:40]):
            return [{"type": "text", "text": "Summary: the build ran at every step and every log line said ok."}]
        last = payload["messages"][-1]["content"]
        if isinstance(last, list) and any(block.get("type") == "tool_result" for block in last):
            return [{"type": "text", "text": "The build printed its log; every line says ok. " * 10}]
        return [{"type": "tool_use", "name": "bash", "input": {"command": "seq -f 'build log line %g: ok' 1 220"}}]


@pytest.mark.req("CH-12")
def test_the_calibrated_estimate_follows_the_provider_while_compaction_changes_what_the_request_holds(
    alice, settings, tmp_path
):
    """Tool output fills the requests, then passes elide it, turn it into pages or a summary: the mix of
    what a request holds changes from one request to the next, and the provider (the emulator) counts
    tool output, prose, the tool-use system prompt and pages each its own way."""
    from agents.turns import CALIBRATION_REQUESTS
    from engine.context.calibration import calibration_from
    from engine.emulator.server import EmulatorServer

    model = "claude-sonnet-4-5"
    _window(settings, 8_000)
    settings.CC_MODELS = {**settings.CC_MODELS, model: "anthropic"}
    settings.CC_WORKSPACE_ROOT = tmp_path
    settings.CC_TOOL_AUTO_APPROVE = ["bash"]
    settings.SCRATCHPAD_THRESHOLD_BYTES = 100_000  # outputs stay in the transcript
    conversation = conversation_create(owner=alice, title="mixed")
    conversation.model = model
    conversation.save()
    with EmulatorServer(Emulator(policy=_BuildsAndAnswers(), context_window=8_000)) as server:
        settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "test-key", server.base_url
        for turn in range(10):
            conversation.refresh_from_db()
            _, run = message_send(conversation=conversation, text=f"Step {turn}: run the build, say what it printed.")
            run_execute(run_id=run.pk, worker="test")
            run.refresh_from_db()
            assert run.status == Run.Status.SUCCEEDED, run.error

    requests = list(ModelRequest.objects.filter(run__conversation=conversation, subagent="").order_by("id"))
    measured = [(RequestCount.from_dict(r.estimated_parts), r.prompt_tokens) for r in requests]
    assert len(measured) == 20
    assert all(count.total == r.estimated_tokens for (count, _), r in zip(measured, requests, strict=True))
    # The mix did change: requests mostly tool output, requests with almost none left, requests with pages.
    shares = [count.tool_results / count.total for count, _ in measured]
    assert max(shares) > 0.3 and min(shares[1:]) < 0.1, shares
    assert Compaction.objects.filter(conversation=conversation).exists()
    assert any(count.images for count, _ in measured)
    assert all(count.tool_prompt == 346 for count, _ in measured)  # the API's, with tools (EM-2)
    # Every request after the first, estimated with what the requests before it measured, is within 3 %.
    for index in range(1, len(measured)):
        count, tokens = measured[index]
        calibrated = calibration_from(measured[max(0, index - CALIBRATION_REQUESTS) : index]).tokens(count)
        assert abs(calibrated - tokens) / tokens <= 0.03, (index, calibrated, tokens, count)
