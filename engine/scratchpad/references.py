"""`{{stepN.field}}` references in tool arguments (SP-9).

A reference names the observation of step N of the current turn (N counts the
turn's tool calls from 1) and a path into it: dotted keys and list indexes
(`{{step3.items.0.url}}`). An argument that is exactly one reference takes the
referenced value as it is (a 14 KB string stays byte-identical, a dict stays a
dict); a reference inside a longer string is replaced by the value's text.
Resolution is one pass: text pulled in by a reference is never scanned again.

Pure: the caller supplies `lookup(step) -> full observation`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

REFERENCE = re.compile(r"\{\{\s*step(\d+)((?:\.[^.{}\s]+)*)\s*\}\}")


class UnresolvableReference(Exception):
    """A reference names a step or a field that does not exist; the message says which."""


Lookup = Callable[[int], Any]


def has_references(value: Any) -> bool:
    if isinstance(value, str):
        return REFERENCE.search(value) is not None
    if isinstance(value, dict):
        return any(has_references(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(has_references(item) for item in value)
    return False


def resolve(arguments: Any, lookup: Lookup) -> Any:
    """A copy of `arguments` with every reference replaced; raises UnresolvableReference."""
    if isinstance(arguments, str):
        return _resolve_string(arguments, lookup)
    if isinstance(arguments, dict):
        return {key: resolve(item, lookup) for key, item in arguments.items()}
    if isinstance(arguments, list | tuple):
        return [resolve(item, lookup) for item in arguments]
    return arguments


def _resolve_string(text: str, lookup: Lookup) -> Any:
    whole = REFERENCE.fullmatch(text)
    if whole:
        return _value(whole, lookup)
    return REFERENCE.sub(lambda match: _as_text(_value(match, lookup), match.group(0)), text)


def _value(match: re.Match[str], lookup: Lookup) -> Any:
    step = int(match.group(1))
    path = [part for part in match.group(2).split(".") if part]
    try:
        current = lookup(step)
    except KeyError as exc:
        raise UnresolvableReference(f"{match.group(0)}: {exc.args[0] if exc.args else f'no step {step}'}") from None
    walked = f"step{step}"
    for part in path:
        current = _child(current, part, walked, match.group(0))
        walked = f"{walked}.{part}"
    return current


def _child(current: Any, part: str, walked: str, reference: str) -> Any:
    if isinstance(current, dict):
        if part in current:
            return current[part]
        fields = ", ".join(sorted(map(str, current))) or "none"
        raise UnresolvableReference(f"{reference}: {walked} has no field {part!r} (its fields: {fields}).")
    if isinstance(current, list | tuple):
        if not re.fullmatch(r"-?\d+", part):
            raise UnresolvableReference(f"{reference}: {walked} is a list; {part!r} is not an index.")
        index = int(part)
        if not -len(current) <= index < len(current):
            raise UnresolvableReference(
                f"{reference}: index {index} is out of range for {walked} ({len(current)} items)."
            )
        return current[index]
    raise UnresolvableReference(f"{reference}: {walked} is a {type(current).__name__}, it has no field {part!r}.")


def _as_text(value: Any, reference: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        raise UnresolvableReference(
            f"{reference} is binary content; it can only be passed as a whole argument, not inside text."
        )
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        # Found by tests/controlcenter/test_fuzz_inputs.py: an observation holding binary content deeper
        # down (a rebuilt offloaded result) cannot become text; say so instead of crashing.
        raise UnresolvableReference(
            f"{reference} holds binary content; pass the binary field itself as a whole argument."
        ) from None
