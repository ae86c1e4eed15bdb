"""The OpenAI-compatible adapter against the streams and errors real servers send (LM-1).

A replay server on a real 127.0.0.1 socket sends chunks shaped as llama.cpp, vLLM and
Ollama send them (tool-call arguments split across chunks, several calls in one step,
no usage at all, malformed arguments), and their error bodies word for word; the real
llama.cpp server itself is in test_local_model.py.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from engine.actions import StepExecutor
from engine.catalog.surface import ModeSpec, ToolRecord, build_surface
from engine.catalog.toolbox import CatalogToolBox
from engine.providers.openai_compat import OpenAICompatProvider, to_chat_payload
from engine.providers.protocol import (
    MALFORMED_ARGUMENTS,
    InvalidRequest,
    MessageDone,
    PromptTooLong,
    StreamInterrupted,
    TextDelta,
    ToolUseBlock,
)
from engine.request import ModelRequestSpec

LIST_DIR = {
    "name": "list_dir",
    "description": "List a directory.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    choices = [] if delta is None and finish is None else [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": choices,
        "usage": usage,
    }


def call_delta(index: int, *, id: str | None = None, name: str | None = None, arguments: str = "") -> dict:
    function: dict[str, Any] = {"arguments": arguments}
    if name:
        function["name"] = name
    return {"tool_calls": [{"index": index, "id": id, "type": "function" if id else None, "function": function}]}


class ReplayServer:
    """Answers each POST with the next scripted reply: a list of chunks (SSE) or (status, body)."""

    def __init__(self, replies: list[Any], *, tokenizer: bool = False) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.counted: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if self.path == "/extras/tokenize/count":
                    if not tokenizer:
                        self.send_error(404)
                        return
                    server.counted.append(body["input"])
                    # A stand-in tokenizer: one token per word, so the figure is checkable.
                    self._send(200, {"count": len(body["input"].split())})
                    return
                server.requests.append(body)
                reply = server.replies.pop(0)
                if isinstance(reply, tuple):
                    self._send(*reply)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for item in reply:
                    if item == "cut":
                        return  # the connection closes mid-stream, as a killed server's does
                    self.wfile.write(f"data: {json.dumps(item)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def replay():
    servers: list[ReplayServer] = []

    def start(replies: list[Any], **kwargs: Any) -> OpenAICompatProvider:
        servers.append(ReplayServer(replies, **kwargs))
        return OpenAICompatProvider(api_key=None, base_url=servers[-1].url, timeout=10)

    start.servers = servers  # type: ignore[attr-defined]
    yield start
    for server in servers:
        server.close()


def request(*messages: str, tools: list | None = None) -> ModelRequestSpec:
    return ModelRequestSpec(
        model="m",
        system=[{"type": "text", "text": "You are terse."}],
        tools=tools if tools is not None else [LIST_DIR],
        messages=[{"role": "user", "content": text} for text in messages],
    )


def events(provider: OpenAICompatProvider, spec: ModelRequestSpec) -> tuple[list[ToolUseBlock], MessageDone]:
    received = list(provider.stream(spec))
    return [e for e in received if isinstance(e, ToolUseBlock)], received[-1]


@pytest.mark.req("LM-1")
def test_tool_call_arguments_split_across_chunks_and_several_calls_in_one_step(replay):
    provider = replay(
        [
            [
                chunk({"role": "assistant", "content": None}),
                chunk(call_delta(0, id="call_a", name="list_dir")),
                chunk(call_delta(0, arguments='{"pa')),
                chunk(call_delta(0, arguments='th": "sr')),
                chunk(call_delta(0, arguments='c"}')),
                chunk(call_delta(1, id="call_b", name="list_dir", arguments='{"path"')),
                chunk(call_delta(1, arguments=': "docs"}')),
                chunk(finish="tool_calls"),
                chunk(usage={"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}),
            ]
        ]
    )
    calls, done = events(provider, request("list src and docs"))
    assert [(c.id, c.name, c.input) for c in calls] == [
        ("call_a", "list_dir", {"path": "src"}),
        ("call_b", "list_dir", {"path": "docs"}),
    ]
    assert done.stop_reason == "tool_use"
    assert (done.usage.input_tokens, done.usage.output_tokens, done.usage.source) == (120, 30, "reported")


@pytest.mark.req("LM-1")
def test_the_request_asks_for_usage_in_the_stream_and_says_tool_choice_outright(replay):
    provider = replay([[chunk({"content": "hi"}), chunk(finish="stop")]] * 2)
    list(provider.stream(request("hi")))
    forced = request("hi")
    forced.tool_choice = {"type": "tool", "name": "list_dir"}
    list(provider.stream(forced))
    sent = replay.servers[0].requests
    assert sent[0]["stream_options"] == {"include_usage": True}
    # llama-cpp-python's chatml-function-calling leaves the tools out of the prompt without it.
    assert sent[0]["tool_choice"] == "auto"
    assert sent[1]["tool_choice"] == {"type": "function", "function": {"name": "list_dir"}}


@pytest.mark.req("LM-1")
def test_cached_tokens_are_a_subset_of_prompt_tokens(replay):
    usage = {"prompt_tokens": 1000, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 768}}
    provider = replay([[chunk({"content": "ok"}), chunk(finish="stop"), chunk(usage=usage)]])
    _, done = events(provider, request("hi"))
    assert (done.usage.input_tokens, done.usage.cache_read_input_tokens, done.usage.output_tokens) == (232, 768, 5)


@pytest.mark.req("LM-1")
@pytest.mark.req("RN-2")
def test_usage_without_cached_tokens_says_the_cache_is_unknown_not_empty(replay):
    # llama.cpp's server when it sends usage: prompt and completion counts, no prompt_tokens_details.
    usage = {"prompt_tokens": 1000, "completion_tokens": 5}
    provider = replay([[chunk({"content": "ok"}), chunk(finish="stop"), chunk(usage=usage)]])
    _, done = events(provider, request("hi"))
    assert (done.usage.input_tokens, done.usage.cache_read_input_tokens) == (1000, 0)
    assert done.usage.source == "reported" and done.usage.cache_reported is False


@pytest.mark.req("LM-1")
def test_a_server_without_usage_is_counted_with_its_tokenizer_else_estimated_never_zero(replay):
    stream = [chunk({"content": "three word reply"}), chunk(finish="stop")]
    with_tokenizer = replay([stream], tokenizer=True)
    _, done = events(with_tokenizer, request("please say three words"))
    counted = replay.servers[0].counted
    assert done.usage.source == "tokenizer"
    assert done.usage.input_tokens == len(counted[0].split()) > 0
    assert "please say three words" in counted[0] and "You are terse." in counted[0]
    assert done.usage.output_tokens == 3

    without = replay([stream, stream])
    _, first = events(without, request("please say three words"))
    _, second = events(without, request("please say three words"))
    assert first.usage.source == second.usage.source == "estimate"
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0


@pytest.mark.req("LM-1")
def test_malformed_arguments_become_a_tool_error_the_model_sees(replay, tmp_path):
    provider = replay(
        [
            [chunk(call_delta(0, id="c1", name="list_dir", arguments='{"path": "src",')), chunk(finish="tool_calls")],
            [chunk(call_delta(0, id="c2", name="list_dir", arguments='["src"]')), chunk(finish="tool_calls")],
        ]
    )
    (bad_json,), _ = events(provider, request("list src"))
    (not_object,), _ = events(provider, request("list src"))
    assert bad_json.input == {MALFORMED_ARGUMENTS: '{"path": "src",'}
    assert not_object.input == {MALFORMED_ARGUMENTS: '["src"]'}
    ran: list[str] = []
    toolbox = catalog_toolbox(lambda name, arguments: ran.append(name) or {"ok": True})
    blocks = [{"type": "tool_use", "id": b.id, "name": b.name, "input": b.input} for b in (bad_json, not_object)]
    message = StepExecutor(toolbox, lambda kind, payload: None).run(1, blocks)
    results = message["content"]
    assert ran == [] and all(result["is_error"] for result in results)
    assert "were not a JSON object" in results[0]["content"] and "input_schema" in results[0]["content"]
    # A wrong type inside valid JSON is the schema's error, with the schema.
    wrong_type = toolbox.execute("list_dir", {"path": 5})
    assert wrong_type["ok"] is False and "Invalid arguments for list_dir" in wrong_type["error"]
    # Sent back as the model wrote them, so the model sees its own mistake.
    replayed = to_chat_payload(
        ModelRequestSpec(model="m", system=[], tools=[LIST_DIR], messages=[{"role": "assistant", "content": blocks}])
    )
    assert replayed["messages"][0]["tool_calls"][0]["function"]["arguments"] == '{"path": "src",'


@pytest.mark.req("LM-1")
def test_an_unknown_tool_name_gets_did_you_mean_and_search_tools():
    toolbox = catalog_toolbox(lambda name, arguments: {"ok": True})
    answer = toolbox.execute("list_directory", {"path": "."})
    assert answer["ok"] is False
    assert "Did you mean list_dir?" in answer["error"] and "search_tools" in answer["error"]


@pytest.mark.req("LM-1")
def test_server_errors_map_to_typed_errors(replay):
    llama_cpp_python = {
        "error": {
            "message": "This model's maximum context length is 8192 tokens. However, you requested 9304 tokens "
            "(9048 in the messages, 256 in the completion). Please reduce the length of the messages or completion.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    llama_server = {
        "error": {
            "code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 9100,
            "n_ctx": 8192,
        }
    }
    bad = {"error": {"message": "'messages' must contain at least one message", "type": "invalid_request_error"}}
    provider = replay([(400, llama_cpp_python), (400, llama_server), (400, bad)])
    with pytest.raises(PromptTooLong) as first:
        list(provider.stream(request("long")))
    assert (first.value.tokens, first.value.maximum) == (9048, 8192)
    with pytest.raises(PromptTooLong) as second:
        list(provider.stream(request("long")))
    assert (second.value.tokens, second.value.maximum) == (9100, 8192)
    with pytest.raises(InvalidRequest, match="HTTP 400: 'messages' must contain at least one message"):
        list(provider.stream(request("x")))


@pytest.mark.req("LM-1")
def test_a_refused_connection_and_a_stream_cut_short_are_retryable(replay):
    cut = replay([[chunk({"content": "Hel"}), "cut"]])
    with pytest.raises(StreamInterrupted) as broken:
        list(cut.stream(request("hi")))
    assert broken.value.transient
    port = replay.servers[0].httpd.server_address[1]
    replay.servers[0].close()
    refused = OpenAICompatProvider(api_key=None, base_url=f"http://127.0.0.1:{port}/v1", timeout=5)
    with pytest.raises(StreamInterrupted, match=rf"could not reach the model server at http://127.0.0.1:{port}/v1"):
        list(refused.stream(request("hi")))
    replay.servers.clear()


def catalog_toolbox(executor: Any) -> CatalogToolBox:
    records = [
        ToolRecord(name, "Files", "d", LIST_DIR["input_schema"] if name == "list_dir" else {"type": "object"}, True)
        for name in ("list_dir", "read_file", "search_tools")
    ]
    return CatalogToolBox(
        surface=build_surface(records, ModeSpec(), deferral=True), index=lambda: None, executor=executor
    )


@pytest.mark.req("LM-1")
def test_prompted_tools_stream_a_message_and_read_back_calls(replay):
    message = [
        chunk({"content": "mess"}),
        chunk({"content": "age:\nHel"}),
        chunk({"content": "lo."}),
        chunk(finish="stop"),
    ]
    calls = [
        chunk({"content": "functions.list_dir:\n"}),
        chunk({"content": '{"path": "src"}\nfunctions.list_dir:\n{"path": "docs"}'}),
        chunk(finish="stop"),
    ]
    replay([message, calls])
    provider = OpenAICompatProvider(api_key=None, base_url=replay.servers[0].url, timeout=10, prompted_tools=True)
    received = list(provider.stream(request("say hello")))
    assert "".join(e.text for e in received if isinstance(e, TextDelta)) == "Hello."
    assert received[-1].content == [{"type": "text", "text": "Hello."}]
    sent = replay.servers[0].requests[0]
    # The tools are in the system prompt, in chatml-function-calling's words; none go to the server.
    assert "tools" not in sent and "functions.list_dir:" in sent["messages"][0]["content"]
    (first, second), done = events(provider, request("list src and docs"))
    assert [(first.name, first.input), (second.name, second.input)] == [
        ("list_dir", {"path": "src"}),
        ("list_dir", {"path": "docs"}),
    ]
    assert done.stop_reason == "tool_use" and [b["type"] for b in done.content] == ["tool_use", "tool_use"]
