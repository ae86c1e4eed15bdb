"""The runtime meets the stop reasons the real API gives: max_tokens, refusal, pause_turn (EM-4)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.emulator import Emulator, ScriptedPolicy, TestClock
from engine.emulator.server import EmulatorServer
from engine.loop import run_turn
from engine.providers.anthropic import AnthropicProvider
from engine.providers.inprocess import EmulatorProvider
from engine.providers.openai_compat import OpenAICompatProvider
from engine.request import text_block

pytestmark = pytest.mark.req("EM-4")

MODEL = "claude-sonnet-4-5"
# Longer than one reply may be at the request's max_tokens (4096 tokens, ~16K characters).
# Long words: few stream deltas, so the test stays fast.
LONG = "".join(f"section-{n:03d}-{'audited' * 8} " for n in range(300))


class RecordingBox:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def schemas(self) -> list[dict[str, Any]]:
        return [{"name": "write_file", "description": "Write a file.", "input_schema": {"type": "object"}}]

    def execute(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((name, arguments))
        return {"ok": True}

    def execute_step(self, step: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.execute(name, arguments)

    def requires_approval(self, name: str) -> bool:
        return False

    def resident_count(self) -> int | None:
        return None

    def restore_loaded(self, names: list[str], recency: list[str] | None = None, called=()) -> None:
        pass

    def restore_observations(self, observations) -> None:
        pass

    def preview_arguments(self, arguments):
        return arguments


def turn(provider: Any, box: RecordingBox | None = None) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    outcome = run_turn(
        provider=provider,
        model=MODEL,
        system=[text_block("You are a careful agent.")],
        history=[{"role": "user", "content": [text_block("write the report")]}],
        toolbox=box or RecordingBox(),
        emit=lambda kind, payload: events.append((kind, payload)),
    )
    return outcome, events


def stops(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [payload for kind, payload in events if kind == "model_stopped"]


def test_a_reply_cut_by_max_tokens_mid_text_is_continued_into_one_message():
    outcome, events = turn(EmulatorProvider(Emulator(clock=TestClock(), policy=ScriptedPolicy([LONG]))))
    assert outcome.stop_reason == "end_turn"
    assert [m["content"][0]["text"] for m in outcome.messages] == [LONG]
    assert [s["continued"] for s in stops(events)] == [True]
    assert [step.stop_reason for step in outcome.steps] == ["max_tokens", "end_turn"]


def test_a_cut_reply_is_continued_over_http_through_the_anthropic_sdk():
    with EmulatorServer(Emulator(policy=ScriptedPolicy([LONG]))) as server:
        provider = AnthropicProvider(api_key="k", base_url=server.base_url, timeout=10)
        outcome, events = turn(provider)
    assert "".join(m["content"][0]["text"] for m in outcome.messages) == LONG and len(outcome.messages) == 1
    assert stops(events)[0]["continued"] is True


def test_without_prefill_a_cut_reply_is_reported_not_continued():
    with EmulatorServer(Emulator(policy=ScriptedPolicy([LONG]))) as server:
        provider = OpenAICompatProvider(api_key=None, base_url=f"{server.base_url}/v1", timeout=10)
        outcome, events = turn(provider)
    assert outcome.stop_reason == "max_tokens"
    assert stops(events) == [
        {"step": 1, "stop_reason": "max_tokens", "continued": False,
         "detail": "the reply reached max_tokens and was not continued"}
    ]  # fmt: skip
    assert LONG.startswith(outcome.messages[0]["content"][0]["text"])


def test_a_reply_cut_by_max_tokens_mid_tool_call_never_runs_the_call():
    huge_call = {"type": "tool_use", "name": "write_file", "input": {"path": "report.txt", "text": LONG * 2}}
    box = RecordingBox()
    policy = ScriptedPolicy([[{"type": "text", "text": "Writing the report now."}, huge_call]])
    with EmulatorServer(Emulator(policy=policy)) as server:
        outcome, events = turn(AnthropicProvider(api_key="k", base_url=server.base_url, timeout=10), box)
    assert box.calls == []
    assert outcome.stop_reason == "max_tokens"
    assert outcome.messages == [{"role": "assistant", "content": [{"type": "text", "text": "Writing the report now."}]}]
    assert stops(events)[0]["dropped_calls"] == ["write_file"]


def test_a_refusal_ends_the_turn_and_is_reported():
    policy = ScriptedPolicy([{"content": [], "stop_reason": "refusal"}])  # type: ignore[list-item]
    outcome, events = turn(EmulatorProvider(Emulator(clock=TestClock(), policy=policy)))
    assert outcome.stop_reason == "refusal" and outcome.messages == []
    assert stops(events)[0]["stop_reason"] == "refusal"


def test_pause_turn_sends_the_reply_back_and_the_model_goes_on_in_the_same_message():
    answers = iter(
        [
            {"content": [{"type": "text", "text": "Searching the catalog."}], "stop_reason": "pause_turn"},
            [{"type": "text", "text": " Found it: the report is done."}],
        ]
    )
    seen: list[list[dict[str, Any]]] = []

    def policy(payload: dict[str, Any]) -> Any:
        seen.append(payload["messages"])
        return next(answers)

    outcome, _events = turn(EmulatorProvider(Emulator(clock=TestClock(), policy=policy)))
    assert outcome.stop_reason == "end_turn"
    assert outcome.messages == [
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Searching the catalog. Found it: the report is done."}],
        }
    ]
    assert len(seen) == 2
