"""The emulator follows the documented prompt-cache rules, one test per rule.

In process (no socket): the HTTP route and the SDKs are tested in
test_providers_http.py. Each test names the rule it proves.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.emulator import (
    ApiError,
    Emulator,
    Fault,
    ScriptedPolicy,
    StreamCut,
    TestClock,
)

MODEL = "claude-sonnet-4-5"


def tool(name: str, words: int = 60) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"{name} " + "does things " * words,
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }


def cc(block: dict[str, Any], ttl: str | None = None) -> dict[str, Any]:
    return {**block, "cache_control": {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}}


def text(words: int, tag: str = "") -> dict[str, Any]:
    return {"type": "text", "text": (f"{tag} " + "lorem ipsum " * words).strip()}


def user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def request(*, tools=(), system=(), messages, model: str = MODEL) -> dict[str, Any]:
    payload: dict[str, Any] = {"model": model, "max_tokens": 256, "system": list(system), "messages": list(messages)}
    if tools:
        payload["tools"] = list(tools)
    return payload


def tool_use(n: int) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{n:03d}", "name": "read", "input": {"path": f"f{n}.txt"}}


def tool_result(n: int) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": f"toolu_{n:03d}", "content": f"contents of f{n}"}


@pytest.fixture
def clock() -> TestClock:
    return TestClock()


@pytest.fixture
def emulator(clock: TestClock) -> Emulator:
    return Emulator(clock=clock, min_cache_tokens=100)


def usage(emulator: Emulator, payload: dict[str, Any]) -> dict[str, Any]:
    return emulator.create(payload)["usage"]


BASE_TOOLS = [tool("read"), tool("write")]
BASE_SYSTEM = [text(200, "system")]


def cached_prefix_request(*more: dict[str, Any]) -> dict[str, Any]:
    """Tools (1h), system (1h), first user message (5m) marked; `more` appended unmarked."""
    return request(
        tools=[BASE_TOOLS[0], cc(BASE_TOOLS[1], "1h")],
        system=[cc(BASE_SYSTEM[0], "1h")],
        messages=[user(cc(text(100, "question"))), *more],
    )


# --- serialization and prefix hash ------------------------------------------------


@pytest.mark.req("TD-11")
def test_rule_prefix_order_is_tools_system_messages_so_new_messages_keep_the_cache(emulator):
    first = usage(emulator, cached_prefix_request())
    assert first["cache_read_input_tokens"] == 0
    follow_up = cached_prefix_request(assistant(text(5, "answer")), user(cc(text(5, "next"))))
    second = usage(emulator, follow_up)
    assert second["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    assert second["cache_read_input_tokens"] > 0


@pytest.mark.req("TD-11")
def test_rule_changing_a_tool_definition_invalidates_everything_after_it(emulator):
    usage(emulator, cached_prefix_request())
    changed = cached_prefix_request()
    changed["tools"][0] = tool("read", words=61)
    after = usage(emulator, changed)
    assert after["cache_read_input_tokens"] == 0
    assert after["cache_creation_input_tokens"] == emulator.prompt_tokens(changed) - after["input_tokens"]


def test_rule_changing_the_system_prompt_keeps_the_tool_block_cached(emulator):
    usage(emulator, cached_prefix_request())
    changed = cached_prefix_request()
    changed["system"] = [cc(text(201, "system"), "1h")]
    tools_only = request(tools=[BASE_TOOLS[0], cc(BASE_TOOLS[1], "1h")], messages=[user(text(1))])
    after = usage(emulator, changed)
    assert after["cache_read_input_tokens"] == emulator.prompt_tokens(tools_only) - emulator.prompt_tokens(
        request(messages=[user(text(1))])
    )


def test_rule_cache_control_markers_are_not_part_of_the_prefix_hash(emulator):
    written = usage(emulator, request(system=BASE_SYSTEM, messages=[user(cc(text(100, "q")))]))
    # Same blocks, the old marker removed and a new one placed further on.
    moved = request(system=BASE_SYSTEM, messages=[user(text(100, "q")), assistant(text(3)), user(cc(text(3, "n")))])
    assert usage(emulator, moved)["cache_read_input_tokens"] == written["cache_creation_input_tokens"]


def test_rule_the_cache_is_per_model(emulator):
    usage(emulator, cached_prefix_request())
    other = {**cached_prefix_request(), "model": "claude-opus-4-1"}
    assert usage(emulator, other)["cache_read_input_tokens"] == 0


# --- breakpoints and TTLs ------------------------------------------------------------


@pytest.mark.req("TD-13")
def test_rule_at_most_four_breakpoints_a_fifth_is_a_400(emulator):
    four = request(
        tools=[cc(tool("a"), "1h")],
        system=[cc(text(50), "1h")],
        messages=[user(cc(text(50))), assistant(text(2)), user(cc(text(2)))],
    )
    assert usage(emulator, four)["cache_creation_input_tokens"] > 0
    five = request(
        tools=[cc(tool("a"), "1h")],
        system=[cc(text(50), "1h")],
        messages=[user(cc(text(50))), assistant(cc(text(2))), user(cc(text(2)))],
    )
    with pytest.raises(ApiError) as error:
        emulator.create(five)
    assert (error.value.status, error.value.error_type) == (400, "invalid_request_error")
    assert "maximum of 4 blocks with cache_control" in error.value.message


def test_rule_ttl_defaults_to_5m_and_expires_after_it(emulator, clock):
    payload = request(system=[cc(text(200))], messages=[user(text(3))])
    written = usage(emulator, payload)
    assert written["cache_creation"] == {
        "ephemeral_5m_input_tokens": written["cache_creation_input_tokens"],
        "ephemeral_1h_input_tokens": 0,
    }
    clock.advance(299)
    assert usage(emulator, payload)["cache_read_input_tokens"] > 0
    clock.advance(300.5)  # 599.5 s after the write, 300.5 s after the read that refreshed it
    assert usage(emulator, payload)["cache_read_input_tokens"] == 0


def test_rule_ttl_1h_outlives_a_5m_entry(emulator, clock):
    payload = request(system=[cc(text(200), "1h")], messages=[user(cc(text(100)))])
    written = usage(emulator, payload)
    assert written["cache_creation"]["ephemeral_1h_input_tokens"] > 0
    assert written["cache_creation"]["ephemeral_5m_input_tokens"] > 0
    clock.advance(3000)
    later = usage(emulator, payload)
    assert later["cache_read_input_tokens"] == written["cache_creation"]["ephemeral_1h_input_tokens"]
    assert later["cache_creation_input_tokens"] == written["cache_creation"]["ephemeral_5m_input_tokens"]


def test_rule_ttl_counts_from_the_start_of_the_request_not_the_end_of_its_stream(emulator, clock):
    payload = request(system=[cc(text(200))], messages=[user(text(3))])
    response = emulator.begin(payload)
    clock.advance(240)  # a long streamed answer
    response.start()
    clock.advance(61)  # 301 s after the request started, 61 s after streaming began
    assert usage(emulator, payload)["cache_read_input_tokens"] == 0


def test_rule_each_read_refreshes_the_ttl(emulator, clock):
    payload = request(system=[cc(text(200))], messages=[user(text(3))])
    usage(emulator, payload)
    clock.advance(200)
    assert usage(emulator, payload)["cache_read_input_tokens"] > 0
    clock.advance(250)  # 450 s after the write: alive only because the read refreshed it
    assert usage(emulator, payload)["cache_read_input_tokens"] > 0


@pytest.mark.req("TD-13")
def test_rule_a_longer_ttl_must_not_follow_a_shorter_one(emulator):
    wrong = request(system=[cc(text(200))], messages=[user(cc(text(3), "1h"))])
    with pytest.raises(ApiError) as error:
        emulator.create(wrong)
    assert error.value.status == 400
    assert "longer TTLs must precede shorter ones" in error.value.message
    right = request(system=[cc(text(200), "1h")], messages=[user(cc(text(3)))])
    assert usage(emulator, right)["cache_creation_input_tokens"] > 0


def test_rule_ttl_other_than_5m_or_1h_is_a_400_and_stores_nothing(emulator):
    with pytest.raises(ApiError) as error:
        emulator.create(request(system=[cc(text(200), "10m")], messages=[user(text(3))]))
    assert error.value.status == 400
    assert emulator.entry_count() == 0


# --- reads, lookback, writes ------------------------------------------------------------


def _alternating_history(pairs: int) -> list[dict[str, Any]]:
    """`pairs` exchanges after the first user message: 2 block positions each."""
    messages: list[dict[str, Any]] = []
    for n in range(pairs):
        messages += [assistant(text(2, f"a{n}")), user(text(2, f"u{n}"))]
    return messages


@pytest.mark.req("TD-13")
def test_rule_lookback_reaches_19_positions_back_but_not_20(emulator, clock):
    first = request(system=BASE_SYSTEM, messages=[user(cc(text(100, "q")))])
    written = usage(emulator, first)  # the entry sits at position 1 (system is 0)
    near = request(
        system=BASE_SYSTEM, messages=[user(text(100, "q")), *_alternating_history(9), assistant(cc(text(2, "x")))]
    )
    assert usage(emulator, near)["cache_read_input_tokens"] == written["cache_creation_input_tokens"]  # marker at 20
    other = Emulator(clock=clock, min_cache_tokens=100)
    usage(other, first)
    far = request(
        system=BASE_SYSTEM,
        messages=[user(text(100, "q")), *_alternating_history(9), assistant(text(2, "x")), user(cc(text(2, "y")))],
    )
    assert usage(other, far)["cache_read_input_tokens"] == 0  # marker at 21


@pytest.mark.req("TD-13")
def test_rule_a_run_of_tool_use_blocks_and_a_run_of_tool_results_each_count_as_one_position(emulator):
    written = usage(emulator, request(system=BASE_SYSTEM, messages=[user(cc(text(100, "q")))]))
    calls = [tool_use(n) for n in range(30)]
    results = [tool_result(n) for n in range(30)]
    results[-1] = cc(results[-1])
    parallel = request(system=BASE_SYSTEM, messages=[user(text(100, "q")), assistant(*calls), user(*results)])
    assert usage(emulator, parallel)["cache_read_input_tokens"] == written["cache_creation_input_tokens"]


@pytest.mark.req("TD-13")
def test_rule_previous_turn_marker_makes_the_hit_structural_beyond_the_lookback(emulator):
    """TD-13: a turn that emits more than 20 positions misses with only the end marker."""
    history = [user(text(100, "q"))]
    first = request(system=BASE_SYSTEM, messages=[*history[:-1], user(cc(text(100, "q")))])
    written = usage(emulator, first)
    interleaved: list[dict[str, Any]] = []
    for n in range(12):  # text, tool_use, text, tool_use ...: 24 positions, no runs
        interleaved += [text(1, f"step {n}"), tool_use(n)]
    results = [tool_result(n) for n in range(12)]
    end_only = request(
        system=BASE_SYSTEM,
        messages=[user(text(100, "q")), assistant(*interleaved), user(*results[:-1], cc(results[-1]))],
    )
    assert usage(emulator, end_only)["cache_read_input_tokens"] == 0
    fresh = Emulator(clock=TestClock(), min_cache_tokens=100)
    usage(fresh, first)
    both = request(
        system=BASE_SYSTEM,
        messages=[user(cc(text(100, "q"))), assistant(*interleaved), user(*results[:-1], cc(results[-1]))],
    )
    assert usage(fresh, both)["cache_read_input_tokens"] == written["cache_creation_input_tokens"]


def test_rule_one_write_per_breakpoint_beyond_the_deepest_hit(emulator):
    first = usage(emulator, cached_prefix_request())
    assert emulator.entry_count() == 3  # tools, system, first message
    assert first["cache_read_input_tokens"] == 0
    follow_up = cached_prefix_request(assistant(text(50, "answer")), user(cc(text(50, "next"))))
    second = usage(emulator, follow_up)
    assert emulator.entry_count() == 4  # only the new end was written
    assert second["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    assert second["cache_creation_input_tokens"] == second["cache_creation"]["ephemeral_5m_input_tokens"]
    assert second["input_tokens"] == 0


def test_rule_nothing_is_cached_below_the_models_minimum_prefix(clock):
    emulator = Emulator(clock=clock)  # documented per-model minimums
    short = request(system=[cc(text(450))], messages=[user(text(3))])  # ~ 1.4k tokens
    assert 1024 < emulator.prompt_tokens(short) < 2048
    sonnet = usage(emulator, short)
    assert sonnet["cache_creation_input_tokens"] > 0
    haiku = {**short, "model": "claude-3-5-haiku-latest"}
    below = usage(emulator, haiku)
    assert below["cache_creation_input_tokens"] == 0
    assert below["input_tokens"] == emulator.prompt_tokens(haiku)
    assert usage(emulator, haiku)["cache_read_input_tokens"] == 0


@pytest.mark.req("TD-14")
def test_rule_an_entry_is_readable_only_once_its_response_starts_streaming(emulator):
    payload = cached_prefix_request()
    first_child = emulator.begin(payload)
    sibling = emulator.begin(payload)  # a simultaneous fan-out: both miss, both write
    assert first_child.usage.cache_read_input_tokens == 0
    assert sibling.usage.cache_read_input_tokens == 0
    assert sibling.usage.cache_creation_input_tokens == first_child.usage.cache_creation_input_tokens > 0
    first_child.start()
    released = emulator.begin(payload)  # a sibling released once the first child streams
    assert released.usage.cache_read_input_tokens == first_child.usage.cache_creation_input_tokens


def test_rule_usage_fields_are_disjoint_and_add_up_to_the_prompt(emulator):
    usage(emulator, cached_prefix_request())
    payload = cached_prefix_request(
        assistant(text(40, "a")), user(cc(text(40, "b"))), assistant(text(5)), user(text(30))
    )
    result = usage(emulator, payload)
    total = emulator.prompt_tokens(payload)
    assert result["input_tokens"] + result["cache_creation_input_tokens"] + result["cache_read_input_tokens"] == total
    split = result["cache_creation"]
    assert (
        split["ephemeral_5m_input_tokens"] + split["ephemeral_1h_input_tokens"] == result["cache_creation_input_tokens"]
    )
    # input_tokens is what follows the last breakpoint: the unmarked last exchange.
    tail = request(messages=[assistant(text(5)), user(text(30))])
    assert result["input_tokens"] == emulator.prompt_tokens(tail)
    assert result["input_tokens"] > 0


# --- deferred tools ------------------------------------------------------------------


def deferred(name: str) -> dict[str, Any]:
    return {**tool(name, words=200), "defer_loading": True}


@pytest.mark.req("TD-11")
def test_rule_defer_loading_tools_are_outside_the_prefix(emulator):
    payload = cached_prefix_request()
    written = usage(emulator, payload)
    with_deferred = cached_prefix_request()
    with_deferred["tools"] = [*with_deferred["tools"], deferred("tickets_create"), deferred("memory_search")]
    assert emulator.prompt_tokens(with_deferred) == emulator.prompt_tokens(payload)
    assert usage(emulator, with_deferred)["cache_read_input_tokens"] == written["cache_creation_input_tokens"]


@pytest.mark.req("TD-11")
def test_rule_a_tool_reference_in_a_tool_result_expands_inline_where_it_stands(emulator):
    tools = [BASE_TOOLS[0], cc(BASE_TOOLS[1], "1h"), deferred("tickets_create")]
    search = {"type": "tool_use", "id": "toolu_s", "name": "read", "input": {"path": "tickets"}}
    reference = {
        "type": "tool_result",
        "tool_use_id": "toolu_s",
        "content": [{"type": "tool_reference", "tool_name": "tickets_create"}],
    }
    before = request(tools=tools, system=BASE_SYSTEM, messages=[user(cc(text(100, "q")))])
    written = usage(emulator, before)
    after = request(
        tools=tools, system=BASE_SYSTEM, messages=[user(text(100, "q")), assistant(search), user(cc(reference))]
    )
    result = usage(emulator, after)
    # The prefix before the reference is intact: the earlier entry is read.
    assert result["cache_read_input_tokens"] == written["cache_creation_input_tokens"]
    # The loaded schema is paid where it stands, not in the tool block.
    plain = request(
        tools=tools,
        system=BASE_SYSTEM,
        messages=[user(text(100, "q")), assistant(search), user({**reference, "content": "x"})],
    )
    assert emulator.prompt_tokens(after) - emulator.prompt_tokens(plain) >= 200
    unknown = request(
        tools=tools,
        messages=[
            user(text(1)),
            assistant(search),
            user({**reference, "content": [{"type": "tool_reference", "tool_name": "nope"}]}),
        ],
    )
    with pytest.raises(ApiError) as error:
        emulator.create(unknown)
    assert error.value.status == 400 and "nope" in error.value.message


# --- errors as the API sends them ----------------------------------------------------------


def test_rule_prompt_too_long_is_a_400_with_tokens_and_maximum(clock):
    emulator = Emulator(clock=clock, context_window=500)
    payload = request(system=[text(400)], messages=[user(text(3))])
    with pytest.raises(ApiError) as error:
        emulator.create(payload)
    assert error.value.status == 400
    assert error.value.message == f"prompt is too long: {emulator.prompt_tokens(payload)} tokens > 500 maximum"


def test_rule_a_tool_result_without_its_tool_use_is_a_400(emulator):
    orphan = request(messages=[user(text(3)), assistant(text(2)), user(tool_result(7))])
    with pytest.raises(ApiError) as error:
        emulator.create(orphan)
    assert error.value.status == 400
    assert "unexpected `tool_use_id` found in `tool_result` blocks: toolu_007" in error.value.message


def test_rule_a_tool_use_without_its_result_is_a_400(emulator):
    unanswered = request(messages=[user(text(3)), assistant(tool_use(1), tool_use(2)), user(tool_result(1))])
    with pytest.raises(ApiError) as error:
        emulator.create(unanswered)
    assert error.value.status == 400
    assert "`tool_use` ids were found without `tool_result` blocks immediately after: toolu_002" in error.value.message


def test_rule_rate_limit_is_a_429_with_retry_after_and_stores_nothing(emulator):
    emulator.inject(Fault("rate_limit", retry_after=7))
    with pytest.raises(ApiError) as error:
        emulator.create(cached_prefix_request())
    assert (error.value.status, error.value.error_type, error.value.headers) == (
        429,
        "rate_limit_error",
        {"retry-after": "7"},
    )
    assert emulator.entry_count() == 0


def test_rule_overloaded_is_a_529(emulator):
    emulator.inject(Fault("overloaded"))
    with pytest.raises(ApiError) as error:
        emulator.create(cached_prefix_request())
    assert (error.value.status, error.value.error_type) == (529, "overloaded_error")


def test_rule_a_stream_can_be_cut_mid_response(emulator):
    emulator.policy = ScriptedPolicy(["one two three four five six"])
    emulator.inject(Fault("stream_cut", after_chars=9))
    streamed = []
    with pytest.raises(StreamCut):
        for _event, data in emulator.begin(cached_prefix_request()).sse_events():
            if data["type"] == "content_block_delta":
                streamed.append(data["delta"]["text"])
    assert "".join(streamed) == "one two "


def test_rule_scripted_policy_answers_in_order_and_repeats_for_the_same_conversation(emulator):
    call = {"type": "tool_use", "name": "read", "input": {"path": "a"}}
    emulator.policy = ScriptedPolicy(["first", [call], "third"])
    one = emulator.create(request(messages=[user(text(1, "a"))]))
    again = emulator.create(request(messages=[user(text(1, "a"))]))
    two = emulator.create(request(messages=[user(text(1, "b"))]))
    assert one["content"] == again["content"] == [{"type": "text", "text": "first"}]
    assert two["stop_reason"] == "tool_use" and two["content"][0]["id"].startswith("toolu_")
    assert emulator.policy.remaining == 1


def test_rule_default_policy_answers_with_text(emulator):
    message = emulator.create(request(messages=[user({"type": "text", "text": "hello there"})]))
    assert message["stop_reason"] == "end_turn"
    assert "emulator" in message["content"][0]["text"]


def test_rule_bad_requests_get_a_clear_400(emulator):
    for bad, needle in [
        ({"max_tokens": 5, "messages": [user(text(1))]}, "model"),
        (request(messages=[]), "at least one message"),
        (request(messages=[{"role": "system", "content": "x"}]), "role"),
        ({**request(messages=[user(text(1))]), "tools": [tool("a"), tool("a")]}, "unique"),
    ]:
        with pytest.raises(ApiError) as error:
            emulator.create(bad)
        assert error.value.status == 400 and needle in error.value.message
    assert emulator.entry_count() == 0


# --- the OpenAI-compatible route -------------------------------------------------------------


def chat(system_words: int, *more: dict[str, Any]) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": [{"role": "system", "content": "rule " * system_words}, *more]}


def test_rule_openai_automatic_prefix_cache_needs_1024_tokens_and_hits_in_128_token_steps(emulator):
    small = chat(500, {"role": "user", "content": "hi"})  # ~ 630 tokens
    emulator.openai_begin(small).start()
    assert emulator.openai_begin(small).cached_tokens == 0
    big = chat(3000, {"role": "user", "content": "hi"})
    first = emulator.openai_begin(big)
    assert first.cached_tokens == 0
    first.start()
    again = emulator.openai_begin(
        chat(
            3000,
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "more"},
        )
    )
    assert again.cached_tokens >= 1024
    assert again.cached_tokens % 128 == 0
    assert again.cached_tokens <= first.prompt_tokens < again.cached_tokens + 128 + 16


def test_rule_overloaded_can_arrive_mid_stream_as_an_error_event(emulator):
    emulator.policy = ScriptedPolicy(["one two three four five six"])
    emulator.inject(Fault("stream_overloaded", after_chars=9))
    events = list(emulator.begin(cached_prefix_request()).sse_events())
    assert events[-1] == ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    assert "".join(d["delta"]["text"] for e, d in events if e == "content_block_delta") == "one two "
    assert "message_stop" not in [e for e, _ in events]
