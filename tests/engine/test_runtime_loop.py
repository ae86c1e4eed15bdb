"""Loop features: parallel tool calls, action limits, approvals pausing the step, prompt too long."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from engine.actions import ActionLimits, ApprovalNeeded
from engine.context.transcript import request_tokens
from engine.emulator import Emulator, ScriptedPolicy, TestClock
from engine.loop import PausedTurn, RequestSize, Room, StepRecord, TurnCancelled, TurnHandedOff, run_turn
from engine.providers.inprocess import EmulatorProvider
from engine.providers.protocol import MessageDone, Overloaded, PromptTooLong, TextDelta
from engine.providers.retry import RetryingProvider
from engine.request import text_block
from engine.room import elide_turn_results, turn_room
from engine.tokens import estimate_text_tokens, tool_prompt_tokens
from toolcatalog.builtins import WorkspaceToolBox

MODEL = "claude-sonnet-4-5"
SYSTEM = [text_block("You are a careful agent.")]


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": arguments}


def provider(*replies: Any, context_window: int = 200_000) -> EmulatorProvider:
    return EmulatorProvider(
        Emulator(clock=TestClock(), policy=ScriptedPolicy(list(replies)), context_window=context_window)
    )


def observations(outcome, index: int = 1) -> list[dict[str, Any]]:
    return [json.loads(block["content"]) for block in outcome.messages[index]["content"]]


class ApprovingBox(WorkspaceToolBox):
    """The workspace toolbox with the loop deciding approvals (as agents.approvals.GatedToolBox does)."""

    def __init__(self, root, needs: set[str]) -> None:
        super().__init__(root, approve=lambda name, arguments: True)
        self.needs = needs

    def requires_approval(self, name: str) -> bool:
        return name in self.needs


def turn(provider, toolbox, **options):
    events: list[tuple[str, dict]] = []
    outcome = run_turn(
        provider=provider,
        model=MODEL,
        system=SYSTEM,
        history=[{"role": "user", "content": [text_block("go")]}],
        toolbox=toolbox,
        emit=lambda kind, payload: events.append((kind, payload)),
        **options,
    )
    return outcome, events


@pytest.mark.req("RN-4")
def test_the_calls_of_one_step_run_concurrently_and_results_come_back_in_call_order(tmp_path):
    sleeps = [call("bash", command=f"sleep 0.5; echo call-{n}") for n in range(8)]
    box = WorkspaceToolBox(tmp_path, approve=lambda name, arguments: True)
    started = time.monotonic()
    outcome, events = turn(provider(sleeps, "done"), box, max_parallel_tools=8)
    elapsed = time.monotonic() - started
    assert elapsed < 2.5, f"eight 0.5 s calls took {elapsed:.1f}s: they did not overlap (4 s one by one)"
    assert [o["stdout"].strip() for o in observations(outcome)] == [f"call-{n}" for n in range(8)]
    ids = [b["id"] for b in outcome.messages[0]["content"]]
    assert [b["tool_use_id"] for b in outcome.messages[1]["content"]] == ids
    assert [p["id"] for kind, p in events if kind == "tool_result"] == ids


@pytest.mark.req("RN-4")
def test_a_bounded_pool_of_one_runs_the_calls_one_after_another(tmp_path):
    sleeps = [call("bash", command=f"sleep 0.4; echo {n}") for n in range(3)]
    box = WorkspaceToolBox(tmp_path, approve=lambda name, arguments: True)
    started = time.monotonic()
    turn(provider(sleeps, "done"), box, max_parallel_tools=1)
    assert time.monotonic() - started >= 1.2


@pytest.mark.req("RN-4")
def test_calls_past_the_per_tool_and_per_run_limits_get_an_error_observation_and_do_not_run(tmp_path):
    writes = [call("write_file", path=f"f{n}.txt", content="x") for n in range(3)]
    # Distinct arguments: identical calls would meet the duplicate-call guard first (SP-8).
    listing = [call("list_dir", path=path) for path in (".", "./", "./.")]
    box = WorkspaceToolBox(tmp_path)
    outcome, _ = turn(
        provider(writes + listing, "done"), box, limits=ActionLimits(per_run=4, per_tool={"write_file": 2})
    )
    seen = observations(outcome)
    assert [o["ok"] for o in seen] == [True, True, False, True, True, False]
    assert "write_file has already been called 2 times in this run (limit 2)" in seen[2]["error"]
    assert "already made 4 tool calls (limit 4)" in seen[5]["error"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f0.txt", "f1.txt"]


@pytest.mark.req("RN-4")
def test_a_call_that_needs_approval_pauses_the_step_before_anything_runs_and_resumes_with_the_decisions(tmp_path):
    step = [call("write_file", path="a.txt", content="a"), call("bash", command="echo hi > b.txt")]
    model = provider(step, "finished")
    box = ApprovingBox(tmp_path, needs={"bash"})
    with pytest.raises(ApprovalNeeded) as paused:
        turn(model, box)
    pause = paused.value
    assert [b["name"] for b in pause.pending] == ["bash"]
    assert len(pause.messages) == 1 and pause.messages[0]["role"] == "assistant"
    assert list(tmp_path.iterdir()) == []  # nothing of the step ran

    resume = PausedTurn(messages=pause.messages, step=pause.step, previous_end=pause.previous_end, counts=pause.counts)
    outcome, _ = turn(model, box, resume=resume, decisions={pause.pending[0]["id"]: "denied"})
    seen = observations(outcome, 1)
    assert seen[0]["ok"] is True
    assert seen[1] == {"ok": False, "denied": True, "error": "A person denied this call of bash; it did not run."}
    assert (tmp_path / "a.txt").exists() and not (tmp_path / "b.txt").exists()
    assert outcome.messages[-1]["content"] == [text_block("finished")]
    assert [s.step for s in outcome.steps] == [2]  # the resumed turn continues the step count


@pytest.mark.req("OP-4")
def test_a_turn_told_to_hand_off_stops_after_a_step_and_resumes_without_running_a_call_again(tmp_path):
    model = provider([call("bash", command="echo x >> calls.txt")], [call("list_dir", path=".")], "finished")
    box = WorkspaceToolBox(tmp_path, approve=lambda name, arguments: True)
    asked: list[int] = []  # the loop asks only once it has done a step of its own: before step 2
    recorded: list[StepRecord] = []
    with pytest.raises(TurnHandedOff) as handed:
        turn(model, box, hand_off=lambda: asked.append(1) or True, record_step=recorded.append)
    assert asked == [1]
    paused = handed.value.paused
    assert paused.step == 1 and [m["role"] for m in paused.messages] == ["assistant", "user"]
    # Recorded as the answer began (our estimate), then with the usage the reply carried.
    assert [(s.step, s.stop_reason) for s in recorded] == [(1, "incomplete"), (1, "tool_use")]
    assert (tmp_path / "calls.txt").read_text() == "x\n"

    outcome, _ = turn(model, box, resume=paused)
    assert (tmp_path / "calls.txt").read_text() == "x\n"  # the handed-off step's call is not run again
    assert [m["role"] for m in outcome.messages] == ["assistant", "user", "assistant", "user", "assistant"]
    assert outcome.messages[-1]["content"] == [text_block("finished")]
    assert [s.step for s in outcome.steps] == [2, 3]


@pytest.mark.req("OP-4")
def test_a_turn_resumed_after_an_approval_hands_off_right_after_the_approved_calls(tmp_path):
    model = provider([call("bash", command="echo x >> calls.txt")], [call("list_dir", path=".")], "finished")
    box = ApprovingBox(tmp_path, needs={"bash"})
    with pytest.raises(ApprovalNeeded) as paused:
        turn(model, box)
    pause = paused.value
    resume = PausedTurn(messages=pause.messages, step=pause.step, previous_end=pause.previous_end, counts=pause.counts)
    recorded: list[StepRecord] = []
    with pytest.raises(TurnHandedOff) as handed:  # the worker was asked to stop while the call ran
        turn(model, box, resume=resume, decisions={pause.pending[0]["id"]: "approved"}, hand_off=lambda: True,
             record_step=recorded.append)  # fmt: skip
    assert (tmp_path / "calls.txt").read_text() == "x\n"
    assert handed.value.paused.step == 1 and recorded == []  # no model request after the call
    assert [m["role"] for m in handed.value.paused.messages] == ["assistant", "user"]


@pytest.mark.req("RN-4")
def test_only_an_explicit_approval_runs_a_call_that_needs_one(tmp_path):
    model = provider([call("bash", command="echo hi > b.txt")], "finished")
    box = ApprovingBox(tmp_path, needs={"bash"})
    with pytest.raises(ApprovalNeeded) as paused:
        turn(model, box)
    pause = paused.value
    resume = PausedTurn(messages=pause.messages, step=pause.step, previous_end=pause.previous_end, counts=pause.counts)
    # An approval that expired (its run was cancelled) is no approval.
    outcome, _ = turn(model, box, resume=resume, decisions={pause.pending[0]["id"]: "expired"})
    assert observations(outcome, 1)[0]["denied"] is True
    assert not (tmp_path / "b.txt").exists()


@pytest.mark.req("RN-4")
def test_a_prompt_too_long_goes_to_the_compaction_hook_and_fails_with_the_measured_size_when_it_declines(tmp_path):
    seen: list[PromptTooLong] = []

    def hook(history, turn_messages, error):
        seen.append(error)
        return None

    with pytest.raises(PromptTooLong) as failure:
        turn(provider("never", context_window=300), WorkspaceToolBox(tmp_path), on_prompt_too_long=hook)
    assert failure.value.maximum == 300 and failure.value.tokens > 300
    assert seen == [failure.value]


@pytest.mark.req("RN-4")
def test_a_compaction_hook_that_returns_a_shorter_history_gets_the_request_retried(tmp_path):
    long_history = [{"role": "user", "content": [text_block("word " * 3000)]}]
    outcome = run_turn(
        provider=provider("short answer", context_window=2500),
        model=MODEL,
        system=SYSTEM,
        history=long_history,
        toolbox=WorkspaceToolBox(tmp_path, tools={}),
        emit=lambda kind, payload: None,
        on_prompt_too_long=lambda history, turn_messages, error: [{"role": "user", "content": [text_block("hi")]}],
    )
    assert outcome.messages == [{"role": "assistant", "content": [text_block("short answer")]}]


class CancellingBox:
    """`stop` answers as bash does when a cancel killed it; `note` answers normally."""

    def __init__(self) -> None:
        self.cancel = False

    def schemas(self) -> list[dict[str, Any]]:
        return [{"name": n, "description": n, "input_schema": {"type": "object"}} for n in ("note", "stop")]

    def execute(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if name == "stop":
            return {"ok": False, "cancelled": True, "stdout": "1\n2\n", "error": "cancelled"}
        self.cancel = True  # the person presses stop while this call runs
        return {"ok": True}

    def execute_step(self, step: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.execute(name, arguments)

    def requires_approval(self, name: str) -> bool:
        return False

    def resident_count(self) -> int | None:
        return None

    def restore_loaded(self, names: list[str], recency: list[str] | None = None, called=()) -> None:
        pass


class _SlowFirstToken:
    """A model that reads its prompt for `seconds` before its first token (a long prompt, a local model)."""

    name = "emulator"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.inner = provider("never seen")

    def stream(self, request):
        time.sleep(self.seconds)
        yield from self.inner.stream(request)


@pytest.mark.req("OP-3")
def test_a_cancel_while_the_model_has_sent_nothing_yet_ends_the_turn_at_once(tmp_path):
    started = time.monotonic()
    pressed_stop = started + 0.3
    with pytest.raises(TurnCancelled) as stopped:
        turn(_SlowFirstToken(5.0), WorkspaceToolBox(tmp_path), is_cancelled=lambda: time.monotonic() > pressed_stop)
    assert time.monotonic() - started < 2.0  # not the 5 s the model takes to its first token
    assert stopped.value.messages == []


@pytest.mark.req("OP-3", "RN-2")
def test_an_answer_cut_by_a_cancel_is_recorded_as_an_estimated_request(tmp_path):
    story = "Once upon a time " + "and then it went on " * 60
    recorded: list[StepRecord] = []
    deltas: list[str] = []

    def emit(kind: str, payload: dict[str, Any]) -> None:
        if kind == "text_delta":
            deltas.append(payload["text"])

    with pytest.raises(TurnCancelled) as stopped:
        run_turn(provider=provider(story), model=MODEL, system=SYSTEM, history=[{"role": "user", "content": "go"}],
                 toolbox=WorkspaceToolBox(tmp_path), emit=emit, is_cancelled=lambda: bool(deltas),
                 record_step=recorded.append)  # fmt: skip
    assert stopped.value.messages == []  # the cut answer is not kept
    began, cut = recorded  # recorded as the answer began, then replaced once the cancel cut it
    assert (began.step, began.stop_reason, began.usage.output_tokens) == (1, "incomplete", 0)
    assert (cut.step, cut.stop_reason, cut.usage.source) == (1, "cancelled", "estimate")
    assert not cut.usage.cache_reported  # what the provider cached of the prompt is unknown
    assert cut.usage.input_tokens == cut.estimate.total > 0  # the whole prompt, as we count it
    # What arrived before the cancel: the text shown, and the trailing space the live view holds
    # back until text follows it (a continued reply is stored without it).
    shown = "".join(deltas)
    assert shown and cut.usage.output_tokens in (estimate_text_tokens(shown), estimate_text_tokens(shown + " "))


class _AnswersThen:
    """The emulator's answer as one final message (no deltas), then, on demand, an error mid-answer."""

    name = "emulator"

    def __init__(self, reply: Any, *, fail_after_text: bool = False) -> None:
        self.inner, self.fail_after_text, self.answered = provider(reply), fail_after_text, False

    def stream(self, request):
        for event in self.inner.stream(request):
            if self.fail_after_text and isinstance(event, TextDelta):
                yield event
                raise Overloaded("overloaded_error: Overloaded")  # what a retry layer gives up with
            if isinstance(event, MessageDone):
                self.answered = True
                yield event


@pytest.mark.req("RN-2")
def test_an_answer_broken_off_by_an_error_is_recorded_with_what_arrived(tmp_path):
    recorded: list[StepRecord] = []
    with pytest.raises(Overloaded):
        turn(_AnswersThen("Once upon a time", fail_after_text=True), WorkspaceToolBox(tmp_path),
             record_step=recorded.append)  # fmt: skip
    assert [(r.step, r.stop_reason) for r in recorded] == [(1, "incomplete"), (1, "failed")]
    assert recorded[-1].usage.output_tokens > 0 and recorded[-1].usage.source == "estimate"


@pytest.mark.req("OP-3", "RN-2")
def test_an_answer_whole_when_the_stop_is_seen_is_recorded_with_the_providers_usage(tmp_path):
    model, recorded = _AnswersThen("All done here."), []
    with pytest.raises(TurnCancelled):
        turn(model, WorkspaceToolBox(tmp_path), is_cancelled=lambda: model.answered, record_step=recorded.append)
    assert [(r.step, r.stop_reason) for r in recorded] == [(1, "incomplete"), (1, "end_turn")]
    assert recorded[-1].usage.source == "reported" and recorded[-1].usage.output_tokens > 0


class _AlwaysOverloaded:
    name = "emulator"

    def __init__(self) -> None:
        self.requests = 0

    def stream(self, request):
        self.requests += 1
        raise Overloaded("overloaded_error: Overloaded")
        yield  # a generator, as every provider's stream


@pytest.mark.req("OP-3")
def test_a_cancel_during_a_retry_back_off_ends_the_turn_and_sends_no_further_request(tmp_path):
    overloaded, asked_to_stop = _AlwaysOverloaded(), threading.Event()

    def back_off(seconds: float) -> None:
        asked_to_stop.set()  # the person presses stop while the retry waits
        time.sleep(1.0)

    started = time.monotonic()
    with pytest.raises(TurnCancelled):
        turn(
            RetryingProvider(overloaded, sleep=back_off), WorkspaceToolBox(tmp_path), is_cancelled=asked_to_stop.is_set
        )
    assert time.monotonic() - started < 0.9  # within the back-off, not after it
    time.sleep(1.5)  # the back-off is over: a retry would have been sent by now
    assert overloaded.requests == 1


@pytest.mark.req("OP-3")
def test_a_cancelled_turn_is_kept_to_its_last_complete_step_with_every_call_answered():
    box = CancellingBox()
    recorded: list[StepRecord] = []
    with pytest.raises(TurnCancelled) as stopped:
        turn(provider([call("stop")], "never asked"), box, record_step=recorded.append)
    assert [m["role"] for m in stopped.value.messages] == ["assistant", "user"]
    [result] = stopped.value.messages[1]["content"]
    assert result["tool_use_id"] == stopped.value.messages[0]["content"][0]["id"] and result["is_error"] is True
    assert json.loads(result["content"])["stdout"] == "1\n2\n"
    assert [(r.step, r.stop_reason) for r in recorded] == [(1, "incomplete"), (1, "tool_use")]

    # Cancelled during a tool that finishes normally: the next request is never sent, the step is kept whole.
    box = CancellingBox()
    with pytest.raises(TurnCancelled) as stopped:
        turn(provider([call("note")], "a reply that is cut"), box, is_cancelled=lambda: box.cancel)
    assert [m["role"] for m in stopped.value.messages] == ["assistant", "user"]
    assert "cut" not in json.dumps(stopped.value.messages)


class Recording(EmulatorProvider):
    """The in-process provider, keeping every request it was asked to send."""

    def __init__(self, *replies: Any) -> None:
        super().__init__(Emulator(clock=TestClock(), policy=ScriptedPolicy(list(replies))))
        self.requests: list[Any] = []

    def stream(self, request):
        self.requests.append(request)
        return super().stream(request)


@pytest.mark.req("LM-2")
def test_the_loop_asks_before_every_request_and_sends_what_the_hook_makes_room_with(tmp_path):
    (tmp_path / "notes.txt").write_text("a line of notes\n" * 40)
    seen: list[RequestSize] = []

    def make_room(history, turn_so_far, size):
        seen.append(size)
        if len(seen) == 2:
            # The tool result grew the request: a shorter history and a smaller reply.
            return Room(history=[{"role": "user", "content": "go, compacted"}], max_tokens=300)
        return None

    box = WorkspaceToolBox(tmp_path, approve=lambda name, arguments: True)
    model = Recording([call("read_file", path="notes.txt")], "done")
    outcome, _ = turn(model, box, make_room=make_room, max_tokens=1000)
    assert len(seen) == 2 and seen[1].estimated > seen[0].estimated
    assert seen[1].history == seen[0].history  # the growth is this turn's, not the history's
    # The second size carries the first request's measured tokens and our count of it: the latest calibration.
    assert seen[0].measured == () and seen[1].measured == (
        (outcome.steps[0].estimate, outcome.steps[0].usage.prompt_tokens),
    )
    assert outcome.steps[0].estimate.total > 0
    # The provider adds its tool-use system prompt to a request with tools; the count has it, uncalibrated.
    assert (
        seen[0].count.tool_prompt == outcome.steps[0].estimate.tool_prompt == tool_prompt_tokens("emulator", MODEL) > 0
    )
    first, second = model.requests
    assert first.max_tokens == 1000 and second.max_tokens == 300
    assert second.messages[0]["content"] == [text_block("go, compacted")]
    assert second.messages[1:] == outcome.messages[:2]  # this turn's call and result follow the new history


@pytest.mark.req("LM-2")
def test_a_one_turn_context_past_the_window_sends_its_oldest_results_as_stubs_and_keeps_them_whole(tmp_path):
    # A subagent's context is its task and its turn: no stored path to compact (engine.room).
    (tmp_path / "notes.txt").write_text("".join(f"note {n}: the queue drained in {n % 17} ms\n" for n in range(200)))
    reads = [[call("read_file", path="notes.txt", offset=1 + 40 * n, limit=40)] for n in range(4)]
    fails = [call("read_file", path="missing.txt")]
    window, max_tokens = 4000, 1000

    def make_room(history, turn_so_far, size):
        return turn_room(turn_so_far, size, window=window, max_tokens=max_tokens, factor=1.0, fit_share=0.95,
                         target_share=0.45, min_output=125)  # fmt: skip

    box = WorkspaceToolBox(tmp_path, approve=lambda name, arguments: True)
    model = Recording(fails, *reads, "done")
    outcome, _ = turn(model, box, make_room=make_room, max_tokens=max_tokens)

    sizes = [request_tokens(r.system, r.tools, r.messages) + r.max_tokens for r in model.requests]
    assert max(sizes) <= window * 0.95, sizes
    last = model.requests[-1]
    unstubbed = request_tokens(last.system, last.tools, [*last.messages[:1], *outcome.messages[:-1]])
    assert unstubbed + max_tokens > window  # without the stubs the last request would not have fit

    def results(request):
        return [b for m in request.messages for b in m["content"] if b.get("type") == "tool_result"]

    def stubbed(request):
        return [b["tool_use_id"] for b in results(request) if "[elided: " in json.dumps(b["content"])]

    assert stubbed(last) and "call the tool again" in json.dumps(results(last))
    # The results the model has not seen yet are never stubbed.
    assert all(results(r)[-1]["tool_use_id"] not in stubbed(r) for r in model.requests[1:])
    # The turn's record keeps every result whole.
    assert "[elided: " not in json.dumps(outcome.messages)


@pytest.mark.req("LM-2")
def test_stubs_take_the_oldest_uneventful_results_first_and_never_the_unseen_ones():
    def step(n: int, output: str, *, error: bool = False) -> list[dict[str, Any]]:
        result = {
            "type": "tool_result",
            "tool_use_id": f"t{n}",
            "content": output,
            **({"is_error": True} if error else {}),
        }
        return [
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{n}", "name": "read_file", "input": {}}]},
            {"role": "user", "content": [result]},
        ]

    big = "x" * 4000
    turn = [*step(1, big, error=True), *step(2, big), *step(3, big), *step(4, big)]
    stubs, freed = elide_turn_results(turn, need_tokens=1)
    assert list(stubs) == ["t2"] and freed > 900  # the oldest uneventful output, and no more than needed
    stubs, _ = elide_turn_results(turn, need_tokens=2500)
    assert list(stubs) == ["t2", "t3", "t1"]  # a failure only once the uneventful ones are not enough
    assert stubs["t1"]["is_error"] is True
    stubs, _ = elide_turn_results(turn, need_tokens=100_000)
    assert "t4" not in stubs  # the last results are what the model is about to read
