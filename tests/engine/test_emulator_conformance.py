"""The emulator against the documented API, through the official SDKs over HTTP (EM-1, EM-2, EM-3, EM-5).

One test per rule in the table of docs/providers.md ("Fidelity rules"). The server
is the one `manage.py emulator` runs (`EmulatorServer`); the last tests start the
command itself.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import threading
import time
from typing import Any

import anthropic
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from engine.context.transcript import block_tokens, image_tokens
from engine.emulator import Emulator, TestClock
from engine.emulator.server import EmulatorServer
from engine.emulator.validation import sign_thinking
from engine.tokens import estimate_json_tokens

MODEL = "claude-sonnet-4-5"
TOOL = {"name": "read_file", "description": "Read a file from the workspace.", "input_schema": {"type": "object"}}


def policy(payload: dict[str, Any]) -> list[dict[str, Any]] | dict[str, Any]:
    """Answers by the last user text: `echo X`, `call NAME`, `search QUERY`, `regex PATTERN`, `refuse`."""
    messages = payload["messages"]
    text = ""
    if messages and messages[-1]["role"] == "user":
        content = messages[-1]["content"]
        text = content if isinstance(content, str) else " ".join(b.get("text", "") for b in content)
    command, _, rest = text.partition(" ")
    if command == "echo":
        return [{"type": "text", "text": rest}]
    if command == "call":
        return [{"type": "tool_use", "name": rest, "input": {"path": "notes.txt"}}]
    if command in ("search", "regex"):
        name = "tool_search_tool_bm25" if command == "search" else "tool_search_tool_regex"
        key = "query" if command == "search" else "pattern"
        return [{"type": "server_tool_use", "name": name, "input": {key: rest}}]
    if command == "refuse":
        return {"content": [], "stop_reason": "refusal"}
    return [{"type": "text", "text": "This is the emulator answering."}]


@pytest.fixture(scope="module")
def server():
    with EmulatorServer(Emulator(policy=policy, clock=TestClock(), min_cache_tokens=100)) as running:
        yield running


@pytest.fixture(scope="module")
def claude(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="k", base_url=server.base_url, max_retries=0)


@pytest.fixture(scope="module")
def gpt(server) -> openai.OpenAI:
    return openai.OpenAI(api_key="k", base_url=f"{server.base_url}/v1", max_retries=0)


def png(width: int, height: int, fmt: str = "PNG") -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format=fmt)
    return base64.b64encode(buffer.getvalue()).decode()


def image(data: str, media_type: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def user(*blocks: dict[str, Any] | str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": b} if isinstance(b, str) else b for b in blocks]}


def refused(claude: anthropic.Anthropic, error: type[Exception] = anthropic.BadRequestError, **request: Any) -> str:
    request = {"model": MODEL, "max_tokens": 100, "messages": [user("hi")], **request}
    with pytest.raises(error) as caught:
        claude.messages.create(**request)
    body = caught.value.body  # type: ignore[attr-defined]
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return body["error"]["message"]


TOOL_TURN = [
    user("call read_file"),
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}]},
]


# --- EM-1: refused as the API refuses ------------------------------------------------------------

REFUSALS = {
    "unknown_model": ({"model": "claude-imaginary-9"}, anthropic.NotFoundError, "model: claude-imaginary-9"),
    "unknown_top_level_field": (
        {"extra_body": {"foo": 1}},
        anthropic.BadRequestError,
        "foo: Extra inputs are not permitted",
    ),
    "temperature_above_1": (
        {"extra_body": {"temperature": 5}},
        anthropic.BadRequestError,
        "temperature: Input should be less than or equal to 1",
    ),
    "max_tokens_above_model_limit": (
        {"max_tokens": 10_000_000, "timeout": 10},
        anthropic.BadRequestError,
        "maximum allowed number of output tokens",
    ),
    "empty_text_block": ({"messages": [user("")]}, anthropic.BadRequestError, "text content blocks must be non-empty"),
    "cache_control_on_empty_text": (
        {"messages": [user({"type": "text", "text": "", "cache_control": {"type": "ephemeral"}})]},
        anthropic.BadRequestError,
        "cache_control cannot be set for empty text blocks",
    ),
    "text_before_tool_result": (
        {
            "tools": [TOOL],
            "messages": [
                *TOOL_TURN,
                user("here it is", {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}),
            ],
        },
        anthropic.BadRequestError,
        "`tool_use` ids were found without `tool_result` blocks immediately after",
    ),
    "unknown_block_type": (
        {"messages": [user({"type": "hologram", "text": "x"})]},
        anthropic.BadRequestError,
        "Input tag \"hologram\" found using 'type'",
    ),
    "unknown_tool_type": (
        {"tools": [{"type": "teleport_20990101", "name": "t"}]},
        anthropic.BadRequestError,
        'Input tag "teleport_20990101"',
    ),
    "invalid_tool_name": (
        {"tools": [{**TOOL, "name": "read file!"}]},
        anthropic.BadRequestError,
        "String should match pattern",
    ),
    "tool_name_with_a_trailing_newline": (
        {"tools": [{**TOOL, "name": "read_file\n"}]},
        anthropic.BadRequestError,
        "String should match pattern",
    ),
    "invalid_tool_schema": (
        {"tools": [{**TOOL, "input_schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}]},
        anthropic.BadRequestError,
        "JSON schema is invalid",
    ),
    "duplicate_tool_use_ids": (
        {
            "tools": [TOOL],
            "messages": [
                user("call read_file"),
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}},
                        {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}},
                    ],
                },
                user({"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}),
            ],
        },
        anthropic.BadRequestError,
        "`tool_use` ids must be unique",
    ),
    "every_tool_deferred": (
        {"tools": [{**TOOL, "defer_loading": True}]},
        anthropic.BadRequestError,
        "at least one tool must not have defer_loading",
    ),
    "image_media_type_bmp": (
        {"messages": [user(image(png(10, 10, "BMP"), "image/bmp"))]},
        anthropic.BadRequestError,
        "media_type: Input should be",
    ),
    "image_data_invalid": (
        {"messages": [user(image(base64.b64encode(b"not an image").decode()))]},
        anthropic.BadRequestError,
        "Could not process image",
    ),
    "image_media_type_mismatch": (
        {"messages": [user(image(png(10, 10, "JPEG")))]},
        anthropic.BadRequestError,
        "specified using the image/png media type, but the image appears to be a image/jpeg image",
    ),
    "image_over_8000_px": (
        {"messages": [user(image(png(8001, 1)))]},
        anthropic.BadRequestError,
        "exceed max allowed size: 8000 pixels",
    ),
    "thinking_budget_below_1024": (
        {"thinking": {"type": "enabled", "budget_tokens": 500}, "max_tokens": 2000},
        anthropic.BadRequestError,
        "greater than or equal to 1024",
    ),
    "thinking_budget_not_below_max_tokens": (
        {"thinking": {"type": "enabled", "budget_tokens": 2000}, "max_tokens": 2000},
        anthropic.BadRequestError,
        "`max_tokens` must be greater than `thinking.budget_tokens`",
    ),
    "thinking_with_forced_tool_choice": (
        {
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "max_tokens": 2000,
            "tools": [TOOL],
            "tool_choice": {"type": "any"},
        },
        anthropic.BadRequestError,
        "Thinking may not be enabled when tool_choice forces tool use",
    ),
    "whitespace_stop_sequence": (
        {"stop_sequences": ["  "]},
        anthropic.BadRequestError,
        "each stop sequence must contain non-whitespace",
    ),
    "five_breakpoints_with_one_nested": (
        {
            "tools": [TOOL],
            "system": [{"type": "text", "text": f"s{i}", "cache_control": {"type": "ephemeral"}} for i in range(3)],
            "messages": [
                *TOOL_TURN,
                user(
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "cache_control": {"type": "ephemeral"},
                        "content": [{"type": "text", "text": "ok", "cache_control": {"type": "ephemeral"}}],
                    }
                ),
            ],
        },
        anthropic.BadRequestError,
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
    ),
    "whitespace_only_text": (
        {"messages": [user("   ")]},
        anthropic.BadRequestError,
        "messages: text content blocks must contain non-whitespace text",
    ),
    "whitespace_only_text_block": (
        {"messages": [user({"type": "text", "text": " \n\t"})]},
        anthropic.BadRequestError,
        "messages: text content blocks must contain non-whitespace text",
    ),
    "tool_use_id_off_pattern": (
        {
            "tools": [TOOL],
            "messages": [
                user("call read_file"),
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "bad id!", "name": "read_file", "input": {}}],
                },
                user({"type": "tool_result", "tool_use_id": "bad id!", "content": "ok"}),
            ],
        },
        anthropic.BadRequestError,
        "messages.1.content.0.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'",
    ),
    "metadata_user_id_over_256_characters": (
        {"metadata": {"user_id": "u" * 1000}},
        anthropic.BadRequestError,
        "metadata.user_id: String should have at most 256 characters",
    ),
}


@pytest.mark.req("EM-1")
@pytest.mark.parametrize("rule", list(REFUSALS))
def test_rule_the_messages_route_refuses_what_the_api_refuses(claude, rule):
    request, error, wording = REFUSALS[rule]
    assert wording in refused(claude, error, **request)


@pytest.mark.req("EM-1")
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
@pytest.mark.parametrize("version", [None, "", "  "])
def test_rule_a_messages_request_without_an_anthropic_version_is_refused(server, path, version):
    headers = {"content-type": "application/json"} | ({} if version is None else {"anthropic-version": version})
    body = {"model": MODEL, "messages": [user("hi")]} | ({} if path.endswith("count_tokens") else {"max_tokens": 10})
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request("POST", path, body=json.dumps(body).encode(), headers=headers)
        response = connection.getresponse()
        status, error = response.status, json.loads(response.read())["error"]
    finally:
        connection.close()
    assert (status, error) == (
        400,
        {"type": "invalid_request_error", "message": "anthropic-version: header is required"},
    )


@pytest.mark.req("EM-1")
def test_rule_count_tokens_refuses_fields_of_the_messages_request(claude):
    with pytest.raises(anthropic.BadRequestError, match="max_tokens: Extra inputs are not permitted"):
        claude.messages.count_tokens(model=MODEL, messages=[user("hi")], extra_body={"max_tokens": 10})


@pytest.mark.req("EM-1")
def test_rule_a_thinking_block_with_a_forged_signature_is_refused(claude):
    thinking = {"type": "enabled", "budget_tokens": 1024}
    forged = {"type": "thinking", "thinking": "I will read the file.", "signature": sign_thinking("something else")}
    message = refused(
        claude,
        thinking=thinking,
        max_tokens=2000,
        tools=[TOOL],
        messages=[
            user("call read_file"),
            {"role": "assistant", "content": [forged, *TOOL_TURN[1]["content"]]},
            user({"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}),
        ],
    )
    assert "Invalid `signature` in `thinking` block" in message


HI = [{"role": "user", "content": "hi"}]


def function(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


OPENAI_REFUSALS = {
    "unknown_role": (
        {"messages": [{"role": "robot", "content": "hi"}]},
        'Invalid value: "robot". Supported values are',
    ),
    "content_of_the_wrong_type": (
        {"messages": [{"role": "user", "content": 5}]},
        "Invalid type for 'messages[0].content': expected one of a string or array of objects, "
        "but got integer instead.",
    ),
    "tools_not_an_array": (
        {"messages": [{"role": "user", "content": "hi"}], "extra_body": {"tools": True}},
        "Invalid type for 'tools': expected an array of objects, but got boolean instead.",
    ),
    "text_part_not_a_string": (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        "Invalid type for 'messages[0].content[0].text': expected a string, but got integer instead.",
    ),
    "tool_call_id_mismatch": (
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "call_2", "content": "ok"},
            ]
        },
        "messages with role 'tool' must be a response to a preceeding message with 'tool_calls'",
    ),
    "tool_call_without_response": (
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                },
                {"role": "user", "content": "well?"},
            ]
        },
        "The following tool_call_ids did not have response messages: call_1",
    ),
    "unknown_argument": (
        {"messages": [{"role": "user", "content": "hi"}], "extra_body": {"frobnicate": 1}},
        "Unrecognized request argument supplied: frobnicate",
    ),
    "max_tokens_above_model_limit": (
        {"messages": HI, "max_tokens": 10**9},
        "max_tokens is too large: 1000000000. This model supports at most 16384 completion tokens",
    ),
    "max_completion_tokens_above_model_limit": (
        {"messages": HI, "max_completion_tokens": 10**9},
        "max_completion_tokens is too large: 1000000000. This model supports at most 16384 completion tokens",
    ),
    "function_name_with_a_space": (
        {"messages": HI, "tools": [function("my tool")]},
        "Invalid 'tools[0].function.name': string does not match pattern. Expected a string that matches the "
        "pattern '^[a-zA-Z0-9_-]+$'.",
    ),
    "function_name_with_a_dot": (
        {"messages": HI, "tools": [function("a.b")]},
        "Invalid 'tools[0].function.name': string does not match pattern.",
    ),
    "function_name_of_65_characters": (
        {"messages": HI, "tools": [function("f" * 65)]},
        "Invalid 'tools[0].function.name': string too long. Expected a string with maximum length 64, but got a "
        "string with length 65 instead.",
    ),
    "function_name_empty": (
        {"messages": HI, "tools": [function("")]},
        "Invalid 'tools[0].function.name': empty string.",
    ),
    "tools_empty": (
        {"messages": HI, "tools": []},
        "Invalid 'tools': empty array. Expected an array with minimum length 1, but got an empty array instead.",
    ),
    "tool_choice_required_without_tools": (
        {"messages": HI, "tool_choice": "required"},
        "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
    ),
    "tool_choice_any": (
        {"messages": HI, "tools": [function("f")], "tool_choice": "any"},
        "Invalid value: 'any'. Supported values are: 'none', 'auto', and 'required'.",
    ),
    "tool_choice_naming_a_function_not_in_tools": (
        {"messages": HI, "tools": [function("f")], "tool_choice": {"type": "function", "function": {"name": "g"}}},
        "Invalid value for 'tool_choice': function 'g' is not among the functions in 'tools'.",
    ),
    "response_format_bogus": (
        {"messages": HI, "response_format": {"type": "bogus"}},
        "Invalid value: 'bogus'. Supported values are: 'text', 'json_object', and 'json_schema'.",
    ),
    "user_content_empty": (
        {"messages": [{"role": "user", "content": []}]},
        "Invalid 'messages[0].content': empty array. Expected an array with minimum length 1, but got an empty "
        "array instead.",
    ),
    "image_url_not_a_url": (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "notaurl"}}]}]},
        "Invalid 'messages[0].content[0].image_url.url'. Expected a valid URL, but got a value with an invalid format.",
    ),
}


@pytest.mark.req("EM-1")
@pytest.mark.parametrize("rule", list(OPENAI_REFUSALS))
def test_rule_the_chat_route_refuses_what_openai_refuses(gpt, rule):
    request, wording = OPENAI_REFUSALS[rule]
    with pytest.raises(openai.BadRequestError) as caught:
        gpt.chat.completions.create(model="gpt-4o-mini", **request)
    error = caught.value.body
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert wording in error["message"]


@pytest.mark.req("EM-1")
def test_rule_the_chat_route_refuses_an_openai_model_openai_does_not_have(gpt):
    with pytest.raises(openai.NotFoundError) as caught:
        gpt.chat.completions.create(model="gpt-nope", messages=HI)
    assert caught.value.body == {
        "message": "The model `gpt-nope` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": None,
        "code": "model_not_found",
    }


@pytest.mark.req("EM-1")
@pytest.mark.parametrize(
    "request_fields",
    [
        {"model": "gpt-4o", "logprobs": True, "top_logprobs": 5},
        {"model": "gpt-4o-mini", "max_tokens": 16_384, "tools": [function("read_file")], "tool_choice": "required"},
        {
            "model": "gpt-4o-mini",
            "tools": [function("f")],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        },
        {"model": "gpt-4o-mini", "response_format": {"type": "json_object"}},
        # An OpenAI-compatible server's own model, as vLLM or llama.cpp serve it.
        {"model": "qwen2.5-7b-instruct", "max_tokens": 100_000},
    ],
)
def test_rule_the_chat_route_answers_what_openai_accepts(gpt, request_fields):
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "low"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]
    assert gpt.chat.completions.create(messages=messages, **request_fields).choices


@pytest.mark.req("EM-1")
def test_rule_a_request_with_only_a_system_message_is_answered(gpt):
    reply = gpt.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "system", "content": "Be brief."}])
    assert reply.choices[0].message.content and reply.choices[0].finish_reason == "stop"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
KEYS = st.sampled_from(
    [
        "model",
        "messages",
        "max_tokens",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "stream",
        "stop_sequences",
        "role",
        "content",
        "type",
        "text",
        "tool_use_id",
        "tool_calls",
        "cache_control",
        "source",
        "temperature",
    ]
)


@st.composite
def _mutated(draw: st.DrawFn, base: dict[str, Any]) -> Any:
    """A valid request with one value somewhere replaced by arbitrary JSON (or a key added)."""
    request = json.loads(json.dumps(base))
    node: Any = request
    for _ in range(draw(st.integers(0, 4))):
        children = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        containers = [value for _key, value in children if isinstance(value, dict | list) and value]
        if not containers:
            break
        node = draw(st.sampled_from(containers))
    if isinstance(node, dict):
        node[draw(KEYS | st.sampled_from(sorted(node) or ["x"]))] = draw(JSON)
    elif node:
        node[draw(st.integers(0, len(node) - 1))] = draw(JSON)
    return request


MESSAGES_BASE = {
    "model": MODEL,
    "max_tokens": 50,
    "system": [{"type": "text", "text": "s"}],
    "tools": [TOOL],
    "messages": [
        *TOOL_TURN,
        user({"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "ok"}]}),
    ],
}
CHAT_BASE = {
    "model": "gpt-4o-mini",
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
    ],
}


def _post(port: int, path: str, body: Any) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        data = json.dumps(body).encode()
        headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
        connection.request("POST", path, body=data, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _answered_in_shape(status: int, raw: bytes, route: str, streaming: bool) -> None:
    assert status != 500, raw
    openai_route = route.endswith("completions")
    if status == 200 and route.endswith("count_tokens"):
        assert isinstance(json.loads(raw)["input_tokens"], int)
        return
    if status == 200:
        if streaming:
            assert raw.rstrip().endswith(b"data: [DONE]" if openai_route else b'data: {"type": "message_stop"}'), raw
        else:
            body = json.loads(raw)
            assert body["object" if openai_route else "type"] == ("chat.completion" if openai_route else "message")
        return
    body = json.loads(raw)
    if openai_route:
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    else:
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert 400 <= status < 500


@pytest.mark.req("EM-1")
@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_rule_every_request_of_any_shape_gets_an_answer_in_the_api_error_shape(server, data):
    route = data.draw(st.sampled_from(["/v1/messages", "/v1/chat/completions", "/v1/messages/count_tokens"]))
    base = CHAT_BASE if route == "/v1/chat/completions" else MESSAGES_BASE
    if route.endswith("count_tokens"):
        base = {k: v for k, v in base.items() if k != "max_tokens"}
    body = data.draw(JSON | _mutated(base) | st.just(base).map(lambda b: {**b, "stream": True}))
    status, raw = _post(server.port, route, body)
    streaming = isinstance(body, dict) and body.get("stream") is True and not route.endswith("count_tokens")
    _answered_in_shape(status, raw, route, streaming)


# --- EM-2: the Messages surface a harness meets --------------------------------------------------


@pytest.mark.req("EM-2")
def test_rule_max_tokens_cuts_the_reply_with_stop_reason_max_tokens_in_json_and_sse(claude):
    long = "word " * 400
    reply = claude.messages.create(model=MODEL, max_tokens=5, messages=[user(f"echo {long}")])
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens <= 5
    assert long.startswith(reply.content[0].text) and len(reply.content[0].text) <= 5 * 4
    with claude.messages.stream(model=MODEL, max_tokens=5, messages=[user(f"echo {long}")]) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "max_tokens" and streamed.content[0].text == reply.content[0].text


@pytest.mark.req("EM-2")
def test_rule_a_stop_sequence_ends_the_reply_before_it_and_is_reported(claude):
    request = {
        "model": MODEL,
        "max_tokens": 100,
        "stop_sequences": ["STOP", "END"],
        "messages": [user("echo one two END three STOP four")],
    }
    reply = claude.messages.create(**request)
    assert (reply.stop_reason, reply.stop_sequence, reply.content[0].text) == ("stop_sequence", "END", "one two ")
    with claude.messages.stream(**request) as stream:
        streamed = stream.get_final_message()
    assert (streamed.stop_reason, streamed.stop_sequence) == ("stop_sequence", "END")


@pytest.mark.req("EM-2")
def test_rule_thinking_blocks_come_signed_and_stream_as_thinking_deltas(claude):
    request = {
        "model": MODEL,
        "max_tokens": 3000,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tools": [TOOL],
        "messages": [user("call read_file")],
    }
    reply = claude.messages.create(**request)
    assert [b.type for b in reply.content] == ["thinking", "tool_use"]
    assert reply.content[0].signature == sign_thinking(reply.content[0].thinking)
    kinds = set()
    with claude.messages.stream(**request) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                kinds.add(event.delta.type)
        streamed = stream.get_final_message()
    assert {"thinking_delta", "signature_delta", "input_json_delta"} <= kinds
    assert streamed.content[0].thinking == reply.content[0].thinking
    # The thinking goes back with the tool result; without it, the API refuses.
    result = user({"type": "tool_result", "tool_use_id": reply.content[1].id, "content": "ok"})
    turn = [*request["messages"], {"role": "assistant", "content": [b.model_dump() for b in reply.content]}, result]
    assert claude.messages.create(**{**request, "messages": turn}).stop_reason == "end_turn"
    without = [*request["messages"], {"role": "assistant", "content": [reply.content[1].model_dump()]}, result]
    assert "Expected `thinking` or `redacted_thinking`" in refused(claude, **{**request, "messages": without})


@pytest.mark.req("EM-2")
def test_rule_thinking_from_earlier_turns_is_not_counted(claude):
    thought = {
        "type": "thinking",
        "thinking": "long deliberation " * 50,
        "signature": sign_thinking("long deliberation " * 50),
    }

    def turns(first_reply):
        return [user("first"), {"role": "assistant", "content": first_reply}, user("second")]

    with_thinking = claude.messages.count_tokens(model=MODEL, messages=turns([thought, {"type": "text", "text": "ok"}]))
    without = claude.messages.count_tokens(model=MODEL, messages=turns([{"type": "text", "text": "ok"}]))
    assert with_thinking.input_tokens == without.input_tokens


def _cached_pair(claude, marker: str, **changes: Any) -> tuple[Any, Any]:
    system = [{"type": "text", "text": f"{marker} system rules " * 150, "cache_control": {"type": "ephemeral"}}]
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "the question " * 150, "cache_control": {"type": "ephemeral"}}],
        }
    ]
    request = {"model": MODEL, "max_tokens": 3000, "system": system, "tools": [TOOL], "messages": messages}
    first = claude.messages.create(**request)
    second = claude.messages.create(**{**request, **changes})
    return first, second


@pytest.mark.req("EM-2")
def test_rule_a_change_of_tool_choice_invalidates_the_messages_but_not_tools_and_system(claude):
    first, second = _cached_pair(claude, "choice", tool_choice={"type": "any"})
    prefix = first.usage.cache_creation_input_tokens
    assert 0 < second.usage.cache_read_input_tokens < prefix  # tools and system read, messages written again
    assert second.usage.cache_creation_input_tokens > 0


@pytest.mark.req("EM-2")
def test_rule_a_change_of_thinking_settings_invalidates_the_messages_but_not_tools_and_system(claude):
    first, second = _cached_pair(claude, "thinking", thinking={"type": "enabled", "budget_tokens": 2000})
    assert 0 < second.usage.cache_read_input_tokens < first.usage.cache_creation_input_tokens
    unchanged = claude.messages.create(
        **{
            "model": MODEL,
            "max_tokens": 3000,
            "tools": [TOOL],
            "system": [
                {"type": "text", "text": "thinking system rules " * 150, "cache_control": {"type": "ephemeral"}}
            ],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "the question " * 150, "cache_control": {"type": "ephemeral"}}
                    ],
                }
            ],
        }
    )
    assert unchanged.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens


@pytest.mark.req("EM-2")
def test_rule_a_cache_control_nested_in_a_tool_result_is_written_and_read(claude):
    nested = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": "file contents " * 200, "cache_control": {"type": "ephemeral"}}],
    }
    request = {"model": MODEL, "max_tokens": 100, "tools": [TOOL], "messages": [*TOOL_TURN, user(nested)]}
    first = claude.messages.create(**request)
    second = claude.messages.create(
        **{**request, "messages": [*request["messages"], {"role": "assistant", "content": "noted"}, user("and?")]}
    )
    assert first.usage.cache_creation_input_tokens > 400
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens


@pytest.mark.req("EM-2")
@pytest.mark.parametrize(
    ("model", "choice", "added"),
    [(MODEL, None, 346), (MODEL, {"type": "any"}, 313), ("claude-3-5-haiku-latest", None, 264)],
)
def test_rule_the_tool_use_system_prompt_is_counted_per_model(claude, model, choice, added):
    plain = claude.messages.count_tokens(model=model, messages=[user("hi")]).input_tokens
    extra = {"tool_choice": choice} if choice else {}
    with_tool = claude.messages.count_tokens(model=model, messages=[user("hi")], tools=[TOOL], **extra).input_tokens
    assert with_tool - plain == estimate_json_tokens(TOOL) + added


@pytest.mark.req("EM-2")
@pytest.mark.req("EM-5")
@pytest.mark.parametrize(("width", "height"), [(200, 200), (1000, 1000), (3000, 1000)])
def test_rule_an_image_costs_the_documented_formula_the_context_view_uses(claude, width, height):
    block = image(png(width, height))
    plain = claude.messages.count_tokens(model=MODEL, messages=[user("look")]).input_tokens
    counted = claude.messages.count_tokens(model=MODEL, messages=[user("look", block)]).input_tokens
    assert counted - plain == image_tokens(width, height) == block_tokens(block)
    assert counted - plain < 1_700  # never the base64 length / 4 (a 1000 x 1000 PNG is not "too long")


@pytest.mark.req("EM-5")
def test_rule_offline_usage_counts_images_as_the_context_view_does():
    from engine.providers.offline import OfflineProvider
    from engine.request import ModelRequestSpec

    emulator = Emulator(clock=TestClock())
    block = image(png(640, 480))

    def usage(messages):
        spec = ModelRequestSpec(model="offline-1", system=[], tools=[], messages=messages)
        return [e for e in OfflineProvider(emulator=emulator).stream(spec)][-1].usage.input_tokens

    assert usage([user("look", block)]) - usage([user("look")]) == block_tokens(block) == image_tokens(640, 480)


DEFERRED = [
    {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "defer_loading": True,
        "input_schema": {"type": "object", "properties": {"city": {"type": "string", "description": "city name"}}},
    },
    {
        "name": "send_email",
        "description": "Send an email message to a recipient.",
        "defer_loading": True,
        "input_schema": {"type": "object", "properties": {"to": {"type": "string"}}},
    },
]


@pytest.mark.req("EM-2")
@pytest.mark.parametrize(
    ("kind", "ask", "found"),
    [("bm25", "search weather in a city", "get_weather"), ("regex", "regex (?i)email", "send_email")],
)
def test_rule_server_side_tool_search_returns_tool_references_to_deferred_tools(claude, kind, ask, found):
    searcher = {"type": f"tool_search_tool_{kind}_20251119", "name": f"tool_search_tool_{kind}"}
    request = {"model": MODEL, "max_tokens": 500, "tools": [searcher, *DEFERRED], "messages": [user(ask)]}
    reply = claude.messages.create(**request)
    call, result = reply.content[0], reply.content[1].model_dump()
    assert call.type == "server_tool_use" and result["type"] == "tool_search_tool_result"
    assert result["tool_use_id"] == call.id
    assert result["content"]["type"] == "tool_search_tool_search_result"
    assert result["content"]["tool_references"][0] == {"type": "tool_reference", "tool_name": found}
    # Sent back, the reference loads the deferred definition into the prompt where it stands.
    follow = [*request["messages"], {"role": "assistant", "content": [call.model_dump(), result]}, user("go on")]
    before = claude.messages.count_tokens(model=MODEL, tools=request["tools"], messages=[user(ask)]).input_tokens
    after = claude.messages.count_tokens(model=MODEL, tools=request["tools"], messages=follow).input_tokens
    assert after - before > 30


# --- EM-3: faults and latency over HTTP ------------------------------------------------------------


@pytest.mark.req("EM-3")
def test_rule_a_fault_header_gives_429_with_retry_after_on_both_routes(claude, gpt):
    headers = {"x-emulator-fault": "rate_limit;retry_after=7"}
    with pytest.raises(anthropic.RateLimitError) as caught:
        claude.messages.create(model=MODEL, max_tokens=10, messages=[user("hi")], extra_headers=headers)
    assert caught.value.response.headers["retry-after"] == "7"
    with pytest.raises(openai.RateLimitError) as limited:
        gpt.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], extra_headers=headers)
    assert limited.value.response.headers["retry-after"] == "7" and limited.value.code == "rate_limit_exceeded"


@pytest.mark.req("EM-3")
def test_rule_the_admin_route_queues_529_for_the_next_requests(server, claude, gpt):
    status, raw = _post(server.port, "/_emulator/faults", {"faults": [{"kind": "overloaded", "retry_after": 1}] * 2})
    assert status == 200 and json.loads(raw)["queued_faults"] == ["overloaded", "overloaded"]
    with pytest.raises(anthropic.InternalServerError) as caught:
        claude.messages.create(model=MODEL, max_tokens=10, messages=[user("hi")])
    assert caught.value.status_code == 529 and caught.value.body["error"]["type"] == "overloaded_error"
    with pytest.raises(openai.InternalServerError) as overloaded:
        gpt.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert overloaded.value.status_code == 529
    assert _post(server.port, "/_emulator/faults", {"kind": "nonsense"})[0] == 400


@pytest.mark.req("EM-3")
def test_rule_overloaded_arrives_mid_stream_on_both_routes(claude, gpt):
    headers = {"x-emulator-fault": "stream_overloaded;after_chars=10"}
    text = []
    ask = {"model": MODEL, "max_tokens": 100, "messages": [user("echo alpha beta gamma delta")]}
    with (
        pytest.raises(anthropic.APIStatusError, match="Overloaded"),
        claude.messages.stream(**ask, extra_headers=headers) as stream,
    ):
        text.extend(stream.text_stream)
    assert "".join(text) == "alpha beta "[: len("".join(text))] and text
    with pytest.raises(openai.APIError, match="Overloaded"):  # noqa: PT012
        for _chunk in gpt.chat.completions.create(
            model="m",
            stream=True,
            extra_headers=headers,
            messages=[{"role": "user", "content": "echo alpha beta gamma"}],
        ):
            pass


@pytest.mark.req("EM-3")
def test_rule_a_stream_cut_on_both_routes_and_both_modes(claude, gpt):
    headers = {"x-emulator-fault": "stream_cut;after_chars=6"}
    with pytest.raises(openai.APIConnectionError):
        list(
            gpt.chat.completions.create(
                model="m",
                stream=True,
                extra_headers=headers,
                messages=[{"role": "user", "content": "echo alpha beta gamma"}],
            )
        )
    with pytest.raises(openai.APIConnectionError):
        gpt.chat.completions.create(
            model="m", extra_headers=headers, messages=[{"role": "user", "content": "echo alpha"}]
        )
    with pytest.raises(anthropic.APIConnectionError):
        claude.messages.create(model=MODEL, max_tokens=50, extra_headers=headers, messages=[user("echo alpha beta")])
    # Mid-iteration the SDK lets the transport's error through: the body ended before its last chunk.
    ask = {"model": MODEL, "max_tokens": 50, "messages": [user("echo alpha beta")]}
    with (
        pytest.raises(Exception, match="incomplete chunked read"),  # noqa: B017
        claude.messages.stream(**ask, extra_headers=headers) as stream,
    ):
        list(stream.text_stream)


@pytest.mark.req("EM-3")
def test_rule_latency_delays_whole_answers_so_concurrent_requests_all_miss(claude, gpt):
    headers = {"x-emulator-first-token-ms": "300"}
    system = [{"type": "text", "text": "latency rules " * 200, "cache_control": {"type": "ephemeral"}}]
    replies: list[Any] = []

    def ask() -> None:
        replies.append(
            claude.messages.create(
                model=MODEL, max_tokens=10, system=system, messages=[user("hi")], extra_headers=headers
            )
        )

    started = time.monotonic()
    threads = [threading.Thread(target=ask) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert time.monotonic() - started >= 0.3
    assert [r.usage.cache_read_input_tokens for r in replies] == [0, 0, 0]
    started = time.monotonic()
    gpt.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], extra_headers=headers)
    assert time.monotonic() - started >= 0.3
