"""The offline model keeps its behaviour and reports usage as the emulator's cache would."""

from __future__ import annotations

import pytest

from agents.providers import get_provider
from engine.emulator import Emulator, TestClock
from engine.providers.offline import OfflineProvider, shared_emulator
from engine.providers.protocol import InvalidRequest, MessageDone, PromptTooLong, TextDelta, ToolUseBlock
from engine.request import CachePoint, ModelRequestSpec

SYSTEM = [{"type": "text", "text": "You are the Control Center agent. " * 200}]
LIST_DIR = {"name": "list_dir", "description": "List a directory.", "input_schema": {"type": "object"}}


def ask(text: str, *, cache: bool = True, history: tuple = ()) -> ModelRequestSpec:
    messages = [*history, {"role": "user", "content": [{"type": "text", "text": text}]}]
    points = [CachePoint("system", 0, ttl="1h"), CachePoint("messages", len(messages) - 1)] if cache else []
    return ModelRequestSpec(model="offline-1", system=SYSTEM, tools=[LIST_DIR], messages=messages, cache_points=points)


def events(provider, request):
    return list(provider.stream(request))


@pytest.mark.req("RN-2")
def test_offline_usage_is_accounted_through_the_emulator_cache():
    emulator = Emulator(clock=TestClock())
    offline = OfflineProvider(emulator=emulator)
    first = events(offline, ask("hello"))[-1]
    assert isinstance(first, MessageDone)
    assert first.usage.cache_read_input_tokens == 0 and first.usage.cache_creation_1h_input_tokens > 0
    history = (
        {"role": "user", "content": [{"type": "text", "text": "hello"}]},
        {"role": "assistant", "content": first.content},
    )
    second = events(offline, ask("and now?", history=history))[-1]
    assert second.usage.cache_read_input_tokens > 0
    assert second.usage.prompt_tokens == emulator.prompt_tokens(ask("and now?", history=history).as_payload())
    uncached = events(offline, ask("no markers", cache=False))[-1]
    assert uncached.usage.cache_read_input_tokens == uncached.usage.cache_creation_input_tokens == 0
    assert uncached.usage.input_tokens == emulator.prompt_tokens(ask("no markers", cache=False).as_payload())


def test_offline_keeps_saying_what_it_is_and_lists_files_when_asked():
    offline = OfflineProvider(emulator=Emulator(clock=TestClock()))
    answer = events(offline, ask("what files are in the workspace?"))
    text = "".join(e.text for e in answer if isinstance(e, TextDelta))
    assert text.startswith("I am the offline model of Control Center")
    tools = [e for e in answer if isinstance(e, ToolUseBlock)]
    assert [(t.name, t.input) for t in tools] == [("list_dir", {"path": "."})]
    assert answer[-1].stop_reason == "tool_use"


def test_offline_reports_prompt_too_long_with_the_measured_count():
    emulator = Emulator(context_window=500)
    request = ask("hello")
    with pytest.raises(PromptTooLong) as error:
        events(OfflineProvider(emulator=emulator), request)
    assert (error.value.tokens, error.value.maximum) == (emulator.prompt_tokens(request.as_payload()), 500)


def test_offline_rejects_an_orphan_tool_result_like_the_api():
    orphan = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "{}"}]}
    request = ModelRequestSpec(model="offline-1", system=SYSTEM, tools=[], messages=[orphan])
    with pytest.raises(InvalidRequest, match="unexpected `tool_use_id`"):
        events(OfflineProvider(emulator=Emulator()), request)


def test_registry_offline_provider_shares_one_cache_per_process():
    provider = get_provider("offline")
    before = shared_emulator().entry_count()
    events(provider, ask("a question only this test asks " * 3))
    assert shared_emulator().entry_count() == before + 2
