"""The one count of a request by part, and its calibration by measured usage (CH-12). Pure."""

from __future__ import annotations

import pytest

from engine.context.calibration import CALIBRATION_BOUNDS, Calibration, calibration_from
from engine.context.transcript import RequestCount, request_count, request_tokens, transcript_tokens
from engine.tokens import estimate_json_tokens, tool_prompt_tokens

TOOLS = [{"name": "bash", "description": "Run a command.", "input_schema": {"type": "object"}}]
SYSTEM = [{"type": "text", "text": "You are an agent."}]


def _messages(output: str) -> list[dict]:
    return [
        {"role": "user", "content": [{"type": "text", "text": "Run the build."}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": output}]},
    ]


@pytest.mark.req("CH-12")
def test_the_count_has_every_part_of_the_request_and_the_providers_tool_prompt():
    messages = _messages("build ok\n" * 50)
    count = request_count(SYSTEM, TOOLS, messages, tool_prompt=346)
    assert count.tool_prompt == 346 and count.tools == estimate_json_tokens(TOOLS[0])
    assert count.tool_results > 100 and count.messages > 0 and count.system > 0 and count.images == 0
    assert count.total == request_tokens(SYSTEM, TOOLS, messages, tool_prompt=346)
    assert count.total - count.system - count.tools - count.tool_prompt == transcript_tokens(messages)
    # No tools, no tool prompt: the provider adds it only to a request that has tools.
    assert request_count(SYSTEM, [], messages, tool_prompt=346).tool_prompt == 0
    # A cache marker is read and dropped by the API, never billed.
    marked = [{**TOOLS[0], "cache_control": {"type": "ephemeral"}}]
    assert request_count(SYSTEM, marked, messages).tools == count.tools
    assert RequestCount.from_dict(count.as_dict()) == count


@pytest.mark.req("CH-12")
def test_the_tool_prompt_is_the_documented_size_for_providers_that_count_like_the_messages_api():
    assert tool_prompt_tokens("anthropic", "claude-sonnet-4-5") == 346
    assert tool_prompt_tokens("anthropic", "claude-sonnet-4-5", forced=True) == 313
    assert tool_prompt_tokens("anthropic", "claude-3-5-haiku-latest") == 264
    # The offline model accounts through the emulator, which counts unknown models like Sonnet 4.5.
    assert tool_prompt_tokens("offline", "offline-1") == 346
    # An OpenAI-compatible server's chat template is its own: calibration absorbs it.
    assert tool_prompt_tokens("openai", "gpt-4o-mini") == 0


@pytest.mark.req("CH-12")
def test_one_request_calibrates_the_heuristic_parts_and_leaves_the_formula_parts_alone():
    assert calibration_from([]) == Calibration()
    answered = RequestCount(system=100, tools=900, tool_prompt=346, messages=1000, images=1533)
    # The provider counted 10 % more text than we did; the tool prompt and the page as documented.
    calibration = calibration_from([(answered, 346 + 1533 + 2200)])
    assert calibration.factors == pytest.approx((1.1, 1.1, 1.1))
    pages_only = RequestCount(system=100, tools=900, tool_prompt=346, messages=50, images=3066)
    assert calibration.tokens(pages_only) == 346 + 3066 + round(1.1 * 1050)
    assert calibration.factor(pages_only) == calibration.tokens(pages_only) / pages_only.total
    # A ratio past the bounds is held at them.
    low, high = CALIBRATION_BOUNDS
    assert calibration_from([(RequestCount(messages=1000), 3000)]).factors == (high, high, high)
    assert calibration_from([(RequestCount(messages=1000), 100)]).factors == (low, low, low)


def _provider(count: RequestCount) -> int:
    """A tokenizer that reads tool output (logs, JSON) denser than prose: 1.2 against 1.05."""
    return round(count.formula + 1.05 * (count.system + count.tools + count.messages) + 1.2 * count.tool_results)


@pytest.mark.req("CH-12")
def test_each_part_gets_its_own_factor_once_the_requests_mix_differs():
    overhead = RequestCount(system=200, tools=1800, tool_prompt=346)
    # A turn: the question, then the same request with a large tool result, then the answer's turn.
    requests = [
        overhead + RequestCount(messages=300),
        overhead + RequestCount(messages=340, tool_results=3000),
        overhead + RequestCount(messages=700, tool_results=3000),
        overhead + RequestCount(messages=740, tool_results=6000),
    ]
    measured = [(count, _provider(count)) for count in requests]
    # Compaction elides the tool output and puts two pages in: the mix the requests were fitted on is gone.
    compacted = overhead + RequestCount(messages=900, tool_results=80, images=3066)
    truth = _provider(compacted)
    per_part = calibration_from(measured).tokens(compacted)
    assert abs(per_part - truth) / truth < 0.01
    # One factor from the latest request (mostly tool output) would miss it by more than the target.
    latest, tokens = measured[-1]
    single = (tokens - latest.formula) / latest.counted
    assert abs(compacted.formula + single * compacted.counted - truth) / truth > 0.03


@pytest.mark.req("CH-12")
def test_parts_the_requests_never_tell_apart_keep_the_common_factor():
    same_mix = [
        (RequestCount(system=100, tools=900, messages=n, tool_results=2 * n), 1.1 * 1000 + 3.3 * n)
        for n in (100, 200, 400)
    ]
    assert calibration_from(same_mix).factors == pytest.approx((1.1, 1.1, 1.1), abs=1e-6)
