"""RetryingProvider around the real adapters, against the emulator's HTTP server."""

from __future__ import annotations

from typing import Any

import pytest

from engine.emulator import Emulator, Fault, ScriptedPolicy, TestClock
from engine.emulator.server import EmulatorServer
from engine.loop import RETRIED, StepRecord, stream_answer
from engine.providers.anthropic import AnthropicProvider
from engine.providers.offline import OfflineProvider
from engine.providers.openai_compat import OpenAICompatProvider
from engine.providers.protocol import (
    InvalidRequest,
    MessageDone,
    Overloaded,
    PromptTooLong,
    ProviderError,
    RateLimited,
    TextDelta,
)
from engine.providers.retry import RetryingProvider
from engine.request import ModelRequestSpec
from engine.tokens import estimate_text_tokens

ANSWER = "The quick brown fox jumps over the lazy dog, then naps in the sun."


@pytest.fixture
def emulator() -> Emulator:
    return Emulator(clock=TestClock(), min_cache_tokens=100, policy=ScriptedPolicy([ANSWER]))


@pytest.fixture
def server(emulator):
    with EmulatorServer(emulator) as running:
        yield running


@pytest.fixture
def sleeps() -> list[float]:
    return []


def claude(server, sleeps, **options: Any) -> RetryingProvider:
    inner = AnthropicProvider(api_key="k", base_url=server.base_url, timeout=10)
    return RetryingProvider(inner, sleep=sleeps.append, jitter=lambda: 0.5, **options)


def gpt(server, sleeps, **options: Any) -> RetryingProvider:
    inner = OpenAICompatProvider(api_key="k", base_url=f"{server.base_url}/v1", timeout=10)
    return RetryingProvider(inner, sleep=sleeps.append, jitter=lambda: 0.5, **options)


def request() -> ModelRequestSpec:
    return ModelRequestSpec(
        model="claude-sonnet-4-5",
        system=[{"type": "text", "text": "Be brief."}],
        tools=[],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Tell me about the fox."}]}],
    )


def collect(provider) -> tuple[list[str], MessageDone]:
    deltas, done = [], None
    for event in provider.stream(request()):
        if isinstance(event, TextDelta):
            deltas.append(event.text)
        elif isinstance(event, MessageDone):
            done = event
    assert done is not None
    return deltas, done


def test_retry_429_waits_at_least_retry_after(emulator, server, sleeps):
    emulator.inject(Fault("rate_limit", retry_after=7))
    deltas, done = collect(claude(server, sleeps))
    assert sleeps == [7.0]
    assert "".join(deltas) == ANSWER == done.content[0]["text"]


def test_retry_529_backs_off_exponentially_with_jitter(emulator, server, sleeps):
    for _ in range(3):
        emulator.inject(Fault("overloaded"))
    collect(claude(server, sleeps, base_delay=1.0))
    assert sleeps == [0.5, 1.0, 2.0]  # ceiling 1, 2, 4 seconds, times the jitter draw 0.5


def test_retry_jitter_spreads_waits_below_the_exponential_ceiling():
    draws = iter([0.0, 0.99, 0.3])
    provider = RetryingProvider(OfflineProvider(), jitter=lambda: next(draws), base_delay=2.0, max_delay=5.0)
    assert [provider.delay(attempt, None) for attempt in range(3)] == [0.0, pytest.approx(3.96), pytest.approx(1.5)]


def test_retry_is_bounded_by_max_attempts(emulator, server, sleeps):
    for _ in range(5):
        emulator.inject(Fault("overloaded"))
    with pytest.raises(Overloaded):
        collect(claude(server, sleeps, max_attempts=3))
    assert len(sleeps) == 2


def test_retry_gives_up_when_retry_after_is_longer_than_worth_waiting(emulator, server, sleeps):
    emulator.inject(Fault("rate_limit", retry_after=600))
    with pytest.raises(RateLimited) as error:
        collect(claude(server, sleeps, max_retry_after=120))
    assert error.value.retry_after == 600 and sleeps == []


def test_retry_never_retries_prompt_too_long_or_invalid_requests(sleeps):
    with EmulatorServer(Emulator(context_window=20)) as tight, pytest.raises(PromptTooLong):
        collect(claude(tight, sleeps))
    with EmulatorServer(Emulator()) as server:
        provider = claude(server, sleeps)
        bad = request()
        bad.messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}
        )
        with pytest.raises(InvalidRequest):
            list(provider.stream(bad))
    assert sleeps == []


def test_retry_resumes_a_cut_anthropic_stream_without_duplicating_streamed_text(emulator, server, sleeps):
    emulator.inject(Fault("stream_cut", after_chars=14))  # "The quick brown " is cut after "The quick "
    emulator.inject(Fault("stream_cut", after_chars=10))  # and the continuation is cut again
    deltas, done = collect(claude(server, sleeps))
    assert "".join(deltas) == ANSWER
    assert done.content == [{"type": "text", "text": ANSWER}]
    assert len(sleeps) == 2
    # The last attempt carried the streamed text as a prefill, so its prompt is longer than the request's.
    assert done.usage.prompt_tokens > emulator.prompt_tokens(request().as_payload())


def test_retry_resumes_after_a_mid_stream_overloaded_event_without_duplicating_text(emulator, server, sleeps):
    emulator.inject(Fault("stream_overloaded", after_chars=30))
    deltas, done = collect(claude(server, sleeps))
    assert "".join(deltas) == ANSWER
    assert done.content == [{"type": "text", "text": ANSWER}]
    assert sleeps == [0.5]


def test_retry_replays_a_cut_openai_stream_skipping_what_was_streamed(emulator, server, sleeps):
    emulator.inject(Fault("stream_cut", after_chars=20))
    deltas, done = collect(gpt(server, sleeps))
    assert "".join(deltas) == ANSWER
    assert done.content == [{"type": "text", "text": ANSWER}]
    assert len(sleeps) == 1


def test_retry_refuses_a_replay_that_differs_from_the_streamed_text(emulator, server, sleeps):
    answers = iter(["First answer, long enough to be cut.", "A different answer altogether."])
    emulator.policy = lambda payload: [{"type": "text", "text": next(answers)}]
    emulator.inject(Fault("stream_cut", after_chars=12))
    streamed = []
    with pytest.raises(ProviderError, match="differs from the text already streamed"):
        for event in gpt(server, sleeps).stream(request()):
            if isinstance(event, TextDelta):
                streamed.append(event.text)
    assert "".join(streamed) == "First "


def test_a_replay_given_up_has_its_connection_closed_at_once(emulator, server, sleeps, monkeypatch):
    # Seen with llama.cpp's server restarted mid-answer: the differing replay was given up with its
    # connection open, and the server generated it to its limit (2 minutes), every request waiting.
    answers = iter(["First answer, long enough to be cut.", "A different answer altogether."])
    emulator.policy = lambda payload: [{"type": "text", "text": next(answers)}]
    emulator.inject(Fault("stream_cut", after_chars=12))
    provider = gpt(server, sleeps)
    opened = []
    create = provider.inner._create
    monkeypatch.setattr(provider.inner, "_create", lambda payload: opened.append(create(payload)) or opened[-1])
    with pytest.raises(ProviderError, match="differs from the text already streamed"):
        list(provider.stream(request()))
    assert len(opened) == 2 and all(stream.response.is_closed for stream in opened)


@pytest.mark.req("RN-2")
@pytest.mark.parametrize("route", [claude, gpt])
def test_every_attempt_broken_after_its_answer_began_is_recorded_before_its_retry(emulator, server, sleeps, route):
    emulator.inject(Fault("rate_limit", retry_after=1))  # refused before any answer: owes nothing
    emulator.inject(Fault("stream_cut", after_chars=14))
    records: list[StepRecord] = []
    done, _ = stream_answer(
        route(server, sleeps), request(), step=3, is_cancelled=lambda: False, record_step=records.append
    )
    assert done.stop_reason == "end_turn"
    closed = [record for record in records if record.stop_reason != "incomplete"]
    assert [(record.step, record.stop_reason) for record in closed] == [(3, RETRIED)]
    broken = closed[0]
    # What the cut attempt was owed for: the prompt, as the API reported it at message_start (our own
    # count where the route sends nothing before its end), and the output that arrived ("The quick ").
    if route is claude:
        assert (broken.usage.prompt_tokens, broken.usage.source) == (
            emulator.prompt_tokens(request().as_payload()),
            "partial",
        )
    else:
        assert (broken.usage.input_tokens, broken.usage.source) == (broken.estimate.total, "estimate")
    assert broken.usage.output_tokens == estimate_text_tokens("The quick ") > 0
    # Each attempt was announced once when it began; the retry's own record follows the closed one.
    assert [record.stop_reason for record in records] == ["incomplete", RETRIED, "incomplete"]
