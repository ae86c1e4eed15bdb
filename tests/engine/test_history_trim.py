"""Trim for resume: the most recent messages within a budget, never an orphan (CH-6)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.context import ladder
from engine.context.transcript import pairing_problems, transcript_tokens, trim_for_resume


@st.composite
def transcripts(draw, *, broken: bool = True):
    """Random turns: prompts, answers, tool rounds with one or more calls, sometimes a broken pair."""
    messages = []
    counter = 0
    for _ in range(draw(st.integers(0, 12))):
        messages.append({"role": "user", "content": [{"type": "text", "text": draw(st.text(max_size=200))}]})
        for _ in range(draw(st.integers(0, 3))):
            ids = []
            for _ in range(draw(st.integers(1, 3))):
                counter += 1
                ids.append(f"toolu_{counter}")
            messages.append(
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": i, "name": "t", "input": {}} for i in ids],
                }
            )
            # Sometimes a result is missing: a transcript saved by a buggy writer.
            kept = [i for i in ids if not broken or draw(st.booleans()) or not draw(st.booleans())]
            if kept:
                body = draw(st.text(max_size=400))
                messages.append(
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": i, "content": body} for i in kept],
                    }
                )
        messages.append({"role": "assistant", "content": [{"type": "text", "text": draw(st.text(max_size=200))}]})
    return messages


@pytest.mark.req("CH-6")
@settings(max_examples=300, deadline=None)
@given(messages=transcripts(), budget=st.integers(0, 3000))
def test_trim_keeps_a_suffix_within_budget_with_no_orphan_and_no_call_without_result(messages, budget):
    trimmed = trim_for_resume(messages, budget_tokens=budget)
    kept = trimmed.messages
    assert kept == messages[trimmed.start :]
    assert transcript_tokens(kept) <= budget
    assert pairing_problems(kept) == []
    if kept:
        assert kept[0]["role"] == "user"
    # Maximal: no longer suffix would also have been valid and within budget.
    for start in range(trimmed.start):
        longer = messages[start:]
        assert not (
            transcript_tokens(longer) <= budget and not pairing_problems(longer) and longer[0]["role"] == "user"
        )


@pytest.mark.req("CH-6")
def test_trim_never_starts_on_a_tool_result_even_when_it_would_fit():
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "x" * 4000}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "t", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "ok"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
    ]
    trimmed = trim_for_resume(messages, budget_tokens=100)
    # Starting at the result (index 2) fits but orphans it; the only valid cut inside the budget is none.
    assert trimmed.messages == [] and trimmed.dropped == 4
    assert trim_for_resume(messages, budget_tokens=10_000).messages == messages


@pytest.mark.req("CH-1")
@pytest.mark.req("CH-6")
@settings(max_examples=60, deadline=None)
@given(messages=transcripts(broken=False), tail=st.integers(0, 400), rungs=st.sampled_from(["free", "all"]))
def test_the_ladder_never_produces_a_transcript_a_provider_would_reject(messages, tail, rungs):
    for index, message in enumerate(messages):
        message["id"] = index + 1
    chosen = ladder.FREE_RUNGS if rungs == "free" else ("elide", "drop_images", "snapshot")
    result = ladder.compact(messages, rungs=chosen, tail_tokens=tail)
    assert pairing_problems(result.messages) == []
    roles = [message["role"] for message in result.messages]
    assert all(a != b for a, b in zip(roles, roles[1:], strict=False))
    assert not roles or roles[0] == "user"
    assert result.tokens_after <= result.tokens_before
