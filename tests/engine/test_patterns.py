"""Patterns from people and models are refused before a counted repetition makes the compile run away."""

from __future__ import annotations

import pytest

from engine.patterns import MAX_EXPANSION, PatternError, compile_pattern


@pytest.mark.req("SB-4")
@pytest.mark.parametrize(
    ("pattern", "copies"),
    [
        # Seen against the web process: 23 GB before the kernel killed it.
        ("a{99999999}", "99,999,999"),
        # Nested counts multiply; an open count writes out its minimum.
        ("(?:x{1000}){1000}", "1,000,000"),
        ("(ab){200000,}", "400,000"),
        ("(?=a{100000})b{5}", "100,005"),
        # Syntax only the `regex` engine parses is counted as if every count were nested.
        (r"\p{L}{1000}(?(1)a{1000}|b)", "1,000,000"),
    ],
)
def test_a_pattern_whose_counted_repetitions_expand_too_far_is_refused_with_the_figure(pattern, copies):
    with pytest.raises(PatternError) as refused:
        compile_pattern(pattern)
    assert f"up to {copies} copies" in str(refused.value) and f"{MAX_EXPANSION:,} are allowed" in str(refused.value)


@pytest.mark.req("SB-4")
@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        (r"\d{4}-\d{2}-\d{2}", "on 2026-12-04"),
        ("a{100000}", "a" * 100_000),
        ("(?:ab){2,}", "xxababab"),
        ("(?:colour){e<=1}", "color"),
        (r"\p{Lu}{3}", "the ABC"),
    ],
)
def test_ordinary_counted_patterns_compile_and_match(pattern, text):
    assert compile_pattern(pattern).search(text)


def test_an_invalid_pattern_is_refused_with_the_engines_reason():
    with pytest.raises(PatternError, match="missing \\)"):
        compile_pattern("(unclosed")
