"""How a retried request ends: the chat route's mid-stream error retried like the Messages one,
and an error that says why the client stopped asking. The real SDKs over HTTP against the emulator,
faults queued through its admin route as `manage.py emulator` takes them (EM-3)."""

from __future__ import annotations

import http.client
import json
import re
from typing import Any

import pytest

from engine.emulator import Emulator, ScriptedPolicy, TestClock
from engine.emulator.server import EmulatorServer
from engine.providers.anthropic import AnthropicProvider
from engine.providers.openai_compat import OpenAICompatProvider
from engine.providers.protocol import AttemptBroken, MessageDone, Overloaded, RateLimited, TextDelta
from engine.providers.retry import RetryingProvider
from engine.request import ModelRequestSpec

ANSWER = "This is the answer, streamed in many small deltas."


@pytest.fixture
def server():
    with EmulatorServer(Emulator(clock=TestClock(), policy=ScriptedPolicy([ANSWER]))) as running:
        yield running


def queue_faults(server: EmulatorServer, *faults: dict[str, Any]) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        body = json.dumps({"faults": list(faults)}).encode()
        connection.request("POST", "/_emulator/faults", body=body, headers={"content-type": "application/json"})
        assert connection.getresponse().status == 200
    finally:
        connection.close()


def gpt(server: EmulatorServer, sleeps: list[float], **options: Any) -> RetryingProvider:
    inner = OpenAICompatProvider(api_key="k", base_url=f"{server.base_url}/v1", timeout=10)
    return RetryingProvider(inner, sleep=sleeps.append, jitter=lambda: 0.5, **options)


def claude(server: EmulatorServer, sleeps: list[float], **options: Any) -> RetryingProvider:
    inner = AnthropicProvider(api_key="k", base_url=server.base_url, timeout=10)
    return RetryingProvider(inner, sleep=sleeps.append, jitter=lambda: 0.5, **options)


def request(model: str) -> ModelRequestSpec:
    return ModelRequestSpec(
        model=model,
        system=[{"type": "text", "text": "Be brief."}],
        tools=[],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say something."}]}],
    )


@pytest.mark.req("EM-3")
def test_an_overloaded_chunk_mid_stream_on_the_chat_route_is_retried_and_the_answer_completes(server):
    queue_faults(server, {"kind": "stream_overloaded", "after_chars": 10})
    sleeps: list[float] = []
    events = list(gpt(server, sleeps).stream(request("gpt-4o")))
    text = "".join(event.text for event in events if isinstance(event, TextDelta))
    assert text == ANSWER  # "This is " once, then the rest: the replay skipped what was streamed
    assert [type(event) for event in events if isinstance(event, AttemptBroken)] == [AttemptBroken]
    done = events[-1]
    assert isinstance(done, MessageDone) and done.content == [{"type": "text", "text": ANSWER}]
    assert len(sleeps) == 1


@pytest.mark.req("EM-3")
def test_an_overloaded_chunk_that_persists_ends_as_overloaded_not_as_an_sdk_error(server):
    queue_faults(server, *[{"kind": "stream_overloaded", "after_chars": 10}] * 2)
    with pytest.raises(Overloaded) as caught:
        list(gpt(server, [], max_attempts=2).stream(request("gpt-4o")))
    assert str(caught.value).startswith("Overloaded")


@pytest.mark.req("EM-3")
@pytest.mark.parametrize("route", ["anthropic", "openai"])
def test_retries_run_out_and_the_error_says_after_how_many_attempts_and_how_long(server, route):
    queue_faults(server, *[{"kind": "overloaded"}] * 6)
    sleeps: list[float] = []
    provider = claude(server, sleeps) if route == "anthropic" else gpt(server, sleeps)
    with pytest.raises(Overloaded) as caught:
        list(provider.stream(request("claude-sonnet-4-5" if route == "anthropic" else "gpt-4o")))
    message = str(caught.value)
    assert "gave up after 5 attempts" in message
    seconds = re.search(r"over (\d+) s", message)
    assert seconds is not None and int(seconds.group(1)) >= int(sum(sleeps))


@pytest.mark.req("EM-3")
def test_a_retry_after_longer_than_the_client_waits_is_named_in_the_error(server):
    queue_faults(server, {"kind": "rate_limit", "retry_after": 300})
    sleeps: list[float] = []
    with pytest.raises(RateLimited) as caught:
        list(gpt(server, sleeps, max_retry_after=120).stream(request("gpt-4o")))
    message = str(caught.value)
    assert "asked to wait 300 s" in message and "120 s" in message
    assert caught.value.retry_after == 300 and sleeps == []
