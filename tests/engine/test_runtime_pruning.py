"""Stale tool output is pruned in rare deep rewrites, never as a steady cache miss (TD-12)."""

from __future__ import annotations

import json

import pytest

from engine.pruning import prune_stale_tool_output
from engine.request import canonical_json

pytestmark = pytest.mark.req("TD-12")


def _turn(number: int, output_chars: int, *, scratchpad_id: str | None = None) -> list[dict]:
    observation = {"ok": True, "stdout": f"turn {number} " + "x" * output_chars}
    if scratchpad_id:
        observation = {"ok": True, "scratchpad_id": scratchpad_id, "summary": "head … tail"}
    return [
        {"role": "user", "content": [{"type": "text", "text": f"task {number}"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": f"toolu_{number}", "name": "bash", "input": {"command": "ls"}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": f"toolu_{number}", "content": json.dumps(observation)}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": f"done {number}"}]},
    ]


def _session(turns: int, output_chars: int = 8000) -> list[dict]:
    return [message for number in range(turns) for message in _turn(number, output_chars)]


def test_nothing_is_pruned_until_enough_would_be_freed():
    history = _session(3, output_chars=4000)  # about 1k tokens per result
    result = prune_stale_tool_output(history, keep_turns=2, min_tokens=5000)
    assert result.messages == history
    assert result.results_pruned == 0 and not result.rewrote_now


def test_older_results_become_stubs_with_calls_and_results_still_paired():
    history = _session(8)  # 2k tokens per result
    result = prune_stale_tool_output(history, keep_turns=2, min_tokens=5000)
    assert result.results_pruned > 0 and result.tokens_freed >= 5000
    uses = [b["id"] for m in result.messages for b in m["content"] if b.get("type") == "tool_use"]
    results = [b["tool_use_id"] for m in result.messages for b in m["content"] if b.get("type") == "tool_result"]
    assert uses == results  # every call keeps its result, in order
    recent = result.messages[-8:]  # the last two turns are never touched
    assert recent == history[-8:]
    first_result = result.messages[2]["content"][0]
    assert json.loads(first_result["content"])["_pruned"] is True
    assert "bash" in json.loads(first_result["content"])["note"]


def test_a_pruned_result_whose_output_is_in_the_scratchpad_points_there():
    history = _turn(0, 0, scratchpad_id="0123456789abcdef") + _session(6)[4:]
    result = prune_stale_tool_output(history, keep_turns=2, min_tokens=1)
    stub = json.loads(result.messages[2]["content"][0]["content"])
    assert stub["scratchpad_id"] == "0123456789abcdef"


def test_across_a_long_session_requests_only_append_except_at_rare_rewrites():
    previous: bytes | None = None
    rewrites = 0
    for turns in range(1, 41):
        history = _session(turns)
        sent = prune_stale_tool_output(history, keep_turns=2, min_tokens=10_000)
        # What was sent at the previous turn, serialized message by message.
        serialized = b"".join(canonical_json(m) for m in sent.messages)
        if previous is not None and not serialized.startswith(previous):
            assert sent.rewrote_now, f"turn {turns} rewrote the prefix without a pruning step"
            rewrites += 1
        elif previous is not None:
            assert not sent.rewrote_now
        previous = serialized
    # 40 turns of 2k-token results: a step needs 10k tokens, so about one rewrite every 5 turns.
    assert 1 <= rewrites <= 8


def test_the_same_history_always_prunes_the_same_way():
    history = _session(12)
    first = prune_stale_tool_output(history, keep_turns=3, min_tokens=6000)
    second = prune_stale_tool_output(history, keep_turns=3, min_tokens=6000)
    assert canonical_json(first.messages) == canonical_json(second.messages)
