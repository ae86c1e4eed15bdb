"""Both official SDKs, through our adapters, against the emulator on a real 127.0.0.1 socket."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from agents.providers import UnknownProvider, get_provider
from controlcenter.stack import free_port
from engine.emulator import Emulator, Fault, ScriptedPolicy, TestClock
from engine.emulator.server import EmulatorServer
from engine.providers.anthropic import AnthropicProvider
from engine.providers.openai_compat import OpenAICompatProvider, to_chat_payload
from engine.providers.protocol import (
    AnswerStarted,
    InvalidRequest,
    MessageDone,
    Overloaded,
    PromptTooLong,
    RateLimited,
    StreamInterrupted,
    TextDelta,
    ToolUseBlock,
)
from engine.providers.retry import RetryingProvider
from engine.request import CachePoint, ModelRequestSpec
from engine.tokens import estimate_json_tokens

MODEL = "claude-sonnet-4-5"
TOOLS = [
    {"name": "read", "description": "Read a file. " * 40, "input_schema": {"type": "object", "properties": {}}},
    {
        "name": "list_dir",
        "description": "List a directory. " * 40,
        "input_schema": {"type": "object", "properties": {}},
    },
]
SYSTEM = [{"type": "text", "text": "You are a careful agent. " * 120}]


@pytest.fixture
def emulator() -> Emulator:
    return Emulator(clock=TestClock(), min_cache_tokens=100)


@pytest.fixture
def server(emulator: Emulator):
    with EmulatorServer(emulator) as running:
        yield running


@pytest.fixture
def claude(server: EmulatorServer) -> AnthropicProvider:
    return AnthropicProvider(api_key="test-key", base_url=server.base_url, timeout=10)


@pytest.fixture
def gpt(server: EmulatorServer) -> OpenAICompatProvider:
    return OpenAICompatProvider(api_key=None, base_url=f"{server.base_url}/v1", timeout=10)


def spec(messages: list[dict[str, Any]], *, cache_points=(), tools=TOOLS, model: str = MODEL) -> ModelRequestSpec:
    return ModelRequestSpec(
        model=model, system=SYSTEM, tools=list(tools), messages=messages, cache_points=list(cache_points)
    )


def say(text: str, role: str = "user") -> dict[str, Any]:
    return {"role": role, "content": [{"type": "text", "text": text}]}


def run(provider, request: ModelRequestSpec) -> tuple[str, list[ToolUseBlock], MessageDone]:
    text, tools, done = "", [], None
    for event in provider.stream(request):
        if isinstance(event, TextDelta):
            text += event.text
        elif isinstance(event, ToolUseBlock):
            tools.append(event)
        else:
            done = event
    assert done is not None
    return text, tools, done


FOUR_POINTS = [
    CachePoint("tools", 1, ttl="1h", label="tools"),
    CachePoint("system", 0, ttl="1h", label="system"),
]


# --- Anthropic SDK ---------------------------------------------------------------------


def test_anthropic_sdk_streams_text_and_tool_use_through_the_adapter(emulator, claude):
    call = {"type": "tool_use", "name": "list_dir", "input": {"path": "."}}
    emulator.policy = ScriptedPolicy([[{"type": "text", "text": "Looking at the files."}, call]])
    text, tools, done = run(claude, spec([say("what files are there?")]))
    assert text == "Looking at the files."
    assert [(t.name, t.input) for t in tools] == [("list_dir", {"path": "."})]
    assert done.stop_reason == "tool_use"
    assert done.content[1] == {"type": "tool_use", "id": tools[0].id, "name": "list_dir", "input": {"path": "."}}


@pytest.mark.req("TD-13")
@pytest.mark.req("RN-2")
def test_anthropic_adapter_sends_cache_breakpoints_with_ttls_and_maps_usage(emulator, claude):
    first_turn = [say("first question " * 30)]
    points = [*FOUR_POINTS, CachePoint("messages", 0, ttl="5m", label="current_turn")]
    _, _, first = run(claude, spec(first_turn, cache_points=points))
    assert first.usage.cache_read_input_tokens == 0
    assert first.usage.cache_creation_1h_input_tokens > 0 and first.usage.cache_creation_5m_input_tokens > 0
    assert first.usage.cache_creation_input_tokens == (
        first.usage.cache_creation_1h_input_tokens + first.usage.cache_creation_5m_input_tokens
    )
    second_turn = [*first_turn, say("an answer", "assistant"), say("second question")]
    points = [
        *FOUR_POINTS,
        CachePoint("messages", 0, label="previous_turn"),
        CachePoint("messages", 2, label="current_turn"),
    ]
    request = spec(second_turn, cache_points=points)
    _, _, second = run(claude, request)
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.prompt_tokens == emulator.prompt_tokens(request.as_payload())
    assert request.breakpoint_labels() == ["tools", "system", "previous_turn", "current_turn"]


@pytest.mark.req("TD-11")
def test_anthropic_adapter_sends_defer_loading_tools_and_tool_reference_results(emulator, claude):
    deferred = {
        "name": "tickets_create",
        "description": "Create a ticket. " * 60,
        "input_schema": {"type": "object"},
        "defer_loading": True,
    }
    tools = [*TOOLS, deferred]
    search = {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "x"}}
    reference = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "tool_reference", "tool_name": "tickets_create"}],
    }
    first = spec([say("make a ticket")], tools=tools, cache_points=[CachePoint("messages", 0)])
    _, _, written = run(claude, first)
    follow = spec(
        [say("make a ticket"), {"role": "assistant", "content": [search]}, {"role": "user", "content": [reference]}],
        tools=tools,
        cache_points=[CachePoint("messages", 2)],
    )
    _, _, done = run(claude, follow)
    # The deferred schema is outside the cached prefix and is paid where the reference stands.
    assert done.usage.cache_read_input_tokens == written.usage.cache_creation_input_tokens
    assert done.usage.cache_creation_input_tokens >= estimate_json_tokens(
        {k: v for k, v in deferred.items() if k != "defer_loading"}
    )


def test_anthropic_adapter_maps_prompt_too_long_with_the_measured_count(server):
    small = Emulator(context_window=300)
    with EmulatorServer(small) as tight:
        provider = AnthropicProvider(api_key="k", base_url=tight.base_url, timeout=10)
        request = spec([say("hello")])
        with pytest.raises(PromptTooLong) as error:
            run(provider, request)
    assert error.value.tokens == small.prompt_tokens(request.as_payload())
    assert error.value.maximum == 300


def test_anthropic_adapter_maps_an_orphan_tool_result_to_invalid_request(claude):
    orphan = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}]}
    with pytest.raises(InvalidRequest, match="unexpected `tool_use_id`"):
        run(claude, spec([say("hi"), say("ok", "assistant"), orphan]))


def test_anthropic_adapter_maps_429_to_rate_limited_with_retry_after(emulator, claude):
    emulator.inject(Fault("rate_limit", retry_after=3))
    with pytest.raises(RateLimited) as error:
        run(claude, spec([say("hi")]))
    assert error.value.retry_after == 3.0


def test_anthropic_adapter_maps_529_to_overloaded(emulator, claude):
    emulator.inject(Fault("overloaded"))
    with pytest.raises(Overloaded):
        run(claude, spec([say("hi")]))


def test_anthropic_adapter_maps_a_mid_stream_overloaded_event_to_overloaded(emulator, claude):
    emulator.policy = ScriptedPolicy(["one two three four"])
    emulator.inject(Fault("stream_overloaded", after_chars=8))
    seen = []
    with pytest.raises(Overloaded):
        for event in claude.stream(spec([say("hi")])):
            seen.append(event)
    started, *text = seen
    assert text == [TextDelta("one "), TextDelta("two ")]
    # The prompt's figures came first (message_start): what a cut answer is still owed for.
    assert isinstance(started, AnswerStarted) and started.usage.prompt_tokens > 0 and started.usage.output_tokens == 0


def test_anthropic_adapter_reports_a_cut_stream_as_interrupted(emulator, claude):
    emulator.policy = ScriptedPolicy(["one two three four"])
    emulator.inject(Fault("stream_cut", after_chars=4))
    seen = []
    with pytest.raises(StreamInterrupted):
        for event in claude.stream(spec([say("hi")])):
            seen.append(event)
    assert seen[1:] == [TextDelta("one ")] and isinstance(seen[0], AnswerStarted)


def test_count_tokens_route_uses_the_shared_estimator(emulator, server):
    client = anthropic.Anthropic(api_key="k", base_url=server.base_url, max_retries=0)
    messages = [{"role": "user", "content": "how many tokens is this?"}]
    counted = client.messages.count_tokens(model=MODEL, messages=messages, system=SYSTEM)
    assert counted.input_tokens == estimate_json_tokens(SYSTEM[0]) + estimate_json_tokens(
        {"type": "text", "text": "how many tokens is this?"}
    )


def test_default_policy_answers_with_text_when_no_script_is_set(server):
    client = anthropic.Anthropic(api_key="k", base_url=server.base_url, max_retries=0)
    message = client.messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "hello"}])
    assert message.stop_reason == "end_turn"
    assert "emulator" in message.content[0].text


# --- OpenAI SDK ----------------------------------------------------------------------------


def test_openai_adapter_streams_text_and_tool_calls(emulator, gpt):
    call = {"type": "tool_use", "name": "read", "input": {"path": "a.txt"}}
    emulator.policy = ScriptedPolicy([[{"type": "text", "text": "Reading it."}, call], "It says hello."])
    text, tools, done = run(gpt, spec([say("read a.txt")]))
    assert text == "Reading it." and done.stop_reason == "tool_use"
    assert [(t.name, t.input) for t in tools] == [("read", {"path": "a.txt"})]
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tools[0].id, "content": "hello"}]}
    text, _, done = run(gpt, spec([say("read a.txt"), {"role": "assistant", "content": done.content}, result]))
    assert (text, done.stop_reason) == ("It says hello.", "end_turn")


@pytest.mark.req("RN-2")
def test_openai_adapter_maps_cached_tokens_as_a_subset_of_prompt_tokens(emulator, gpt):
    first_turn = [say("question " * 50)]
    _, _, first = run(gpt, spec(first_turn))
    # OpenAI's 0 is a reported 0: the request counts in the cache ratio.
    assert first.usage.cache_read_input_tokens == 0 and first.usage.cache_reported
    _, _, second = run(gpt, spec([*first_turn, say("answer", "assistant"), say("next")]))
    assert second.usage.cache_read_input_tokens >= 1024
    assert second.usage.cache_read_input_tokens % 128 == 0
    assert second.usage.cache_creation_input_tokens == 0
    chat = to_chat_payload(spec([*first_turn, say("answer", "assistant"), say("next")]))
    total = emulator.openai_begin(chat).prompt_tokens
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == total


def test_openai_adapter_maps_context_length_exceeded_to_prompt_too_long():
    with EmulatorServer(Emulator(context_window=200)) as tight:
        provider = OpenAICompatProvider(api_key="k", base_url=f"{tight.base_url}/v1", timeout=10)
        with pytest.raises(PromptTooLong) as error:
            run(provider, spec([say("hello")]))
    assert error.value.maximum == 200 and error.value.tokens > 200


def test_openai_adapter_sends_a_deferred_tool_only_once_referenced_after_the_resident_tools():
    deferred = {"name": "tickets_create", "description": "d", "input_schema": {"type": "object"}, "defer_loading": True}
    before = to_chat_payload(spec([say("x")], tools=[*TOOLS, deferred]))
    assert [t["function"]["name"] for t in before["tools"]] == ["read", "list_dir"]
    search = {"type": "tool_use", "id": "c1", "name": "read", "input": {}}
    reference = {
        "type": "tool_result",
        "tool_use_id": "c1",
        "content": [{"type": "tool_reference", "tool_name": "tickets_create"}],
    }
    after = to_chat_payload(
        spec(
            [say("x"), {"role": "assistant", "content": [search]}, {"role": "user", "content": [reference]}],
            tools=[*TOOLS, deferred],
        )
    )
    assert [t["function"]["name"] for t in after["tools"]] == ["read", "list_dir", "tickets_create"]
    assert after["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "Tool loaded: tickets_create"}


def test_openai_route_rejects_bad_json_with_a_clear_error(server):
    request = urllib.request.Request(f"{server.base_url}/v1/chat/completions", data=b"{nope", method="POST")
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request, timeout=5)
    assert error.value.code == 400
    assert "not valid JSON" in json.loads(error.value.read())["error"]["message"]


def test_openai_sdk_sees_a_cut_stream_as_an_error(emulator, server):
    client = openai.OpenAI(api_key="k", base_url=f"{server.base_url}/v1", max_retries=0)
    emulator.inject(Fault("stream_cut", after_chars=3))
    with pytest.raises(openai.APIConnectionError):
        list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))


# --- registry and the command ---------------------------------------------------------------


def test_registry_wires_anthropic_and_openai_from_settings(settings, server):
    settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "k", server.base_url
    settings.OPENAI_API_KEY, settings.OPENAI_BASE_URL = None, f"{server.base_url}/v1"
    for name, inner in [("anthropic", AnthropicProvider), ("openai", OpenAICompatProvider)]:
        provider = get_provider(name)
        assert isinstance(provider, RetryingProvider) and isinstance(provider.inner, inner)
        text, _, done = run(provider, spec([say("hello")]))
        assert "emulator" in text and done.stop_reason == "end_turn"
    settings.ANTHROPIC_API_KEY = None
    with pytest.raises(UnknownProvider, match="ANTHROPIC_API_KEY"):
        get_provider("anthropic")


@pytest.mark.req("EM-3")
def test_emulator_command_serves_the_messages_api_on_the_given_port():
    port = free_port()
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    command = [
        sys.executable,
        "manage.py",
        "emulator",
        "--port",
        str(port),
        "--context-window",
        "5000",
        "--min-cache-tokens",
        "50",
    ]
    process = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The banner's base URLs are the ones each SDK works with (EM-3).
        banner = process.stdout.readline()
        urls = dict(part.split("=", 1) for part in banner.strip().rstrip(")").split("(", 1)[1].split())
        assert urls == {
            "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
            "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
        }
        client = anthropic.Anthropic(api_key="k", base_url=urls["ANTHROPIC_BASE_URL"], max_retries=0)
        gpt = openai.OpenAI(api_key="k", base_url=urls["OPENAI_BASE_URL"], max_retries=0)
        assert gpt.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).choices
        with pytest.raises(anthropic.RateLimitError):
            client.messages.create(
                model=MODEL, max_tokens=20, messages=[{"role": "user", "content": "hi"}],
                extra_headers={"x-emulator-fault": "rate_limit;retry_after=1"},
            )  # fmt: skip
        system = [{"type": "text", "text": "cached " * 200, "cache_control": {"type": "ephemeral"}}]
        first = client.messages.create(
            model=MODEL, max_tokens=20, system=system, messages=[{"role": "user", "content": "hi"}]
        )
        second = client.messages.create(
            model=MODEL, max_tokens=20, system=system, messages=[{"role": "user", "content": "hi"}]
        )
        assert first.usage.cache_creation_input_tokens > 0
        assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
        with pytest.raises(anthropic.BadRequestError, match=r"prompt is too long: \d+ tokens > 5000 maximum"):
            client.messages.create(model=MODEL, max_tokens=20, messages=[{"role": "user", "content": "word " * 6000}])
    finally:
        process.terminate()
        process.wait(timeout=10)


class _CountingProxy:
    """A TCP relay in front of the emulator that counts the connections clients open."""

    def __init__(self, target_port: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target_port = target_port
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                self.accepted += 1
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
                for source, sink in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()


def test_runs_of_one_process_share_the_hosted_apis_client_and_its_open_connection(settings, server):
    """Each run asks for its provider; a new SDK client each time opened a new connection (a TLS
    handshake before the first token, against the hosted API) and cost ~20 ms of CPU to build."""
    proxy = _CountingProxy(server.port)
    try:
        settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "k", f"http://127.0.0.1:{proxy.port}"
        first, second = get_provider("anthropic"), get_provider("anthropic")
        for provider in (first, second):
            text, _, done = run(provider, spec([say("hello")]))
            assert "emulator" in text and done.stop_reason == "end_turn"
        assert proxy.accepted == 1
        # Each run keeps its own retrying wrapper (its attempts and pauses are the run's own).
        assert first is not second and first.inner is second.inner
        # Another key or address is another client.
        settings.ANTHROPIC_API_KEY = "k2"
        assert get_provider("anthropic").inner is not first.inner
    finally:
        proxy.close()


def test_a_forked_process_builds_its_own_client_instead_of_sharing_its_parents_connections(settings, server):
    settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "k", server.base_url
    parents = get_provider("anthropic").inner
    child = os.fork()
    if child == 0:  # the child: whatever happens, it leaves here (status 0: it built a client of its own)
        status = 2
        try:
            status = 0 if get_provider("anthropic").inner is not parents else 1
        finally:
            os._exit(status)
    deadline = time.monotonic() + 60
    while (waited := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if waited[0] == 0:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        pytest.fail("the forked child did not finish within 60 s")
    assert os.waitstatus_to_exitcode(waited[1]) == 0
    assert get_provider("anthropic").inner is parents
