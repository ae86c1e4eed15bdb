"""Regular expressions from users and models, compiled without letting the compile itself run away.

Matching is bounded by the `regex` engine's timeout. Compiling is not: `regex` writes a counted
repetition out in full, so `a{99999999}` took 23 GB and the web process with it before a single
character was matched. A pattern whose counted repetitions, multiplied through their nesting,
add up to more than `MAX_EXPANSION` is refused before it reaches the compiler.
"""

from __future__ import annotations

import re
from re import _constants as sre_constants  # type: ignore[attr-defined]
from re import _parser as sre_parser  # type: ignore[attr-defined]
from typing import Any

import regex

# `a{100000}` compiles in 0.1 s and 38 MB; ten times that took 1 s and 274 MB.
MAX_EXPANSION = 100_000
_COUNTED = re.compile(r"\{\s*(\d+)\s*(?:,\s*\d*\s*)?\}")
_REPEATS = (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, sre_constants.POSSESSIVE_REPEAT)


class PatternError(ValueError):
    """The pattern is not one we compile; the message says why, for the person or model who wrote it."""


def compile_pattern(text: str, flags: int = 0) -> regex.Pattern[str]:
    expansion = _expansion(text)
    if expansion > MAX_EXPANSION:
        raise PatternError(
            f"its counted repetitions ({{n}}, {{n,}}, {{n,m}}) would write out up to {expansion:,} copies of what "
            f"they repeat, and at most {MAX_EXPANSION:,} are allowed; use a smaller count, or + or * where any "
            "length will do"
        )
    try:
        return regex.compile(text, flags)
    except (regex.error, ValueError, OverflowError) as exc:
        raise PatternError(str(exc)) from None


def _expansion(text: str) -> int:
    """How many copies of its atoms compiling `text` writes out (an upper bound where unsure)."""
    try:
        parsed = sre_parser.parse(text)
    except (re.error, OverflowError, RecursionError):
        # Syntax only `regex` knows (fuzzy matching, \p{…}, …): every count as if nested in all the others.
        total = 1
        for match in _COUNTED.finditer(text):
            total *= max(1, int(match.group(1)))
            if total > MAX_EXPANSION:
                break
        return total
    return _cost(parsed)


def _cost(items: Any) -> int:
    total = 0
    for op, value in items:
        if op in _REPEATS:
            low, _, inner = value
            total += max(1, low) * _cost(inner)
        elif op == sre_constants.SUBPATTERN:
            total += _cost(value[-1])
        elif op == sre_constants.BRANCH:
            total += sum(_cost(branch) for branch in value[1])
        elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            total += _cost(value[1])
        elif op == sre_constants.ATOMIC_GROUP:
            total += _cost(value)
        elif op == sre_constants.GROUPREF_EXISTS:
            total += sum(_cost(branch) for branch in value[1:] if branch is not None)
        else:
            total += 1
        if total > MAX_EXPANSION:
            return total
    return total
