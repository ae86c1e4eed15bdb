"""The `scratchpad_read` tool: schema and execution (SP-6). Pure.

The runtime offers it (SP-7) and the REST API serves the same reads; both call
`run_read` with a function that opens an entry of the caller's scope, so an id
outside that scope answers exactly like an id that never existed (SP-11). Every
bad input becomes an error observation that names what was wrong.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import regex

from engine.patterns import PatternError, compile_pattern
from engine.scratchpad.reader import ChunkSource, ReadError, grep, read_lines, read_slice

NAME = "scratchpad_read"
MODES = ("full", "head", "tail", "range", "lines", "grep")
DEFAULT_N = 2000
DEFAULT_LINES = 50
DEFAULT_MAX_MATCHES = 50
MAX_MATCHES_LIMIT = 500
MAX_CONTEXT = 10
DEFAULT_READ_MAX_CHARS = 20_000
DEFAULT_GREP_TIMEOUT_SECONDS = 2.0

SCHEMA: dict[str, Any] = {
    "name": NAME,
    "description": (
        "Read an observation that was too large for the context and was saved in the scratchpad. "
        "Use the 'scratchpad_id' of that observation. Modes: head (default) and tail read the first or last n "
        "characters; range reads characters [start, end); lines reads lines start..end (1-based, inclusive); "
        "grep returns the lines matching a regular expression, with line numbers and optional context; full "
        "returns everything and only suits small entries. Binary entries are read as base64 byte ranges "
        "(head, tail, range, full). Calling it again with other modes or ranges is expected."
    ),
    "input_schema": {
        "type": "object",
        "required": ["scratchpad_id"],
        "properties": {
            "scratchpad_id": {
                "type": "string",
                "description": "The 'scratchpad_id' field of an earlier observation (16 hex characters).",
            },
            "mode": {"type": "string", "enum": list(MODES), "default": "head"},
            "n": {"type": "integer", "description": "head/tail: how many characters (bytes if binary). Default 2000."},
            "start": {
                "type": "integer",
                "description": "range: first character (0-based). lines: first line (1-based).",
            },
            "end": {
                "type": "integer",
                "description": "range: end character, exclusive. lines: last line, inclusive (default start+49).",
            },
            "pattern": {"type": "string", "description": "grep: regular expression searched line by line."},
            "ignore_case": {"type": "boolean", "description": "grep: case-insensitive match. Default false."},
            "context": {"type": "integer", "description": "grep: lines of context around each match (0-10)."},
            "max_matches": {"type": "integer", "description": "grep: at most this many matches (1-500, default 50)."},
        },
    },
}

OpenEntry = Callable[[str], ChunkSource | None]

# The arguments only some modes read, and those modes.
_MODE_ONLY = {
    "n": ("head", "tail"),
    "start": ("range", "lines"),
    "end": ("range", "lines"),
    "pattern": ("grep",),
    "ignore_case": ("grep",),
    "context": ("grep",),
    "max_matches": ("grep",),
}
_MODE_ONLY_FOR = {mode: {name for name, modes in _MODE_ONLY.items() if mode in modes} for mode in MODES}


def mode_arguments(mode: str) -> set[str]:
    """The arguments a read in `mode` takes besides scratchpad_id and mode (none for an unknown mode)."""
    return set(_MODE_ONLY_FOR.get(mode, ()))


class BadRead(Exception):
    pass


def error(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message}


def run_read(
    arguments: dict[str, Any],
    open_entry: OpenEntry,
    *,
    max_chars: int = DEFAULT_READ_MAX_CHARS,
    grep_timeout_seconds: float = DEFAULT_GREP_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Execute one read; never raises for bad input."""
    try:
        return _run(arguments, open_entry, max_chars, grep_timeout_seconds)
    except (BadRead, ReadError) as exc:
        return error(str(exc))


def _run(arguments: dict[str, Any], open_entry: OpenEntry, max_chars: int, grep_timeout: float) -> dict[str, Any]:
    if not isinstance(arguments, dict):
        raise BadRead("The arguments of scratchpad_read must be an object.")
    entry_id = arguments.get("scratchpad_id")
    if entry_id is not None and not isinstance(entry_id, str):
        raise BadRead(
            f"scratchpad_id must be a string (the 'scratchpad_id' of an earlier observation); got {entry_id!r}."
        )
    if not entry_id:
        raise BadRead("scratchpad_id is required: the 'scratchpad_id' of an earlier observation.")
    mode = arguments.get("mode", "head")
    if mode is None:
        mode = "head"
    if mode not in MODES:
        raise BadRead(f"mode must be one of {', '.join(MODES)}; got {mode!r}.")
    known = set(SCHEMA["input_schema"]["properties"])
    unknown = sorted(set(arguments) - known)
    if unknown:
        raise BadRead(f"Unknown argument(s) {', '.join(unknown)}; scratchpad_read takes {', '.join(sorted(known))}.")
    # An argument of another mode was ignored, and the read answered something else than asked (QA:
    # start and end without mode=range read the head).
    others = _MODE_ONLY.keys() - _MODE_ONLY_FOR[mode]
    stray = [name for name in _MODE_ONLY if name in others and arguments.get(name) is not None]
    if stray:
        owners = sorted({owner for name in stray for owner in _MODE_ONLY[name]})
        default = " (the default)" if "mode" not in arguments else ""
        raise BadRead(
            f"{' and '.join(stray)} {'is' if len(stray) == 1 else 'are'} read by mode {' or '.join(owners)} only, "
            f"and this read's mode is {mode}{default}: give the mode that uses {'it' if len(stray) == 1 else 'them'}."
        )
    source = open_entry(entry_id)
    if source is None:
        raise BadRead(
            f"There is no scratchpad entry {entry_id!r} in this turn (unknown, expired, or from another turn)."
        )
    shape = source.shape
    binary = shape.kind == "binary"
    unit = "bytes" if binary else "characters"
    # base64 grows bytes by 4/3: keep the returned text within the same cap.
    cap = max_chars * 3 // 4 if binary else max_chars
    base = {"ok": True, "scratchpad_id": entry_id, "mode": mode, "kind": shape.kind}

    if mode in ("lines", "grep") and binary:
        raise BadRead(f"mode={mode} reads text; entry {entry_id} is binary: use head, tail or range (bytes).")
    if mode == "lines":
        return {**base, **_lines(arguments, source, max_chars)}
    if mode == "grep":
        return {**base, **_grep(arguments, source, grep_timeout, max_chars)}

    if mode == "full":
        start, end = 0, shape.length
        if shape.length > cap:
            raise BadRead(
                f"Entry {entry_id} holds {shape.length} {unit}, more than the {cap} one read may return; "
                "use head, tail, range, lines or grep."
            )
    elif mode in ("head", "tail"):
        n = _int(arguments, "n", DEFAULT_N, minimum=1)
        if n > cap:
            raise BadRead(f"n={n} is more than the {cap} {unit} one read may return; read in smaller pieces.")
        start, end = (0, min(n, shape.length)) if mode == "head" else (max(0, shape.length - n), shape.length)
    else:
        start = _int(arguments, "start", None, minimum=0)
        end = _int(arguments, "end", None, minimum=0)
        if end <= start:
            raise BadRead(f"range needs start < end; got start={start}, end={end}.")
        if end > shape.length:
            raise BadRead(
                f"end={end} is past the end of entry {entry_id}, which holds {shape.length} {unit} "
                f"(valid: 0 <= start < end <= {shape.length})."
            )
        if end - start > cap:
            raise BadRead(f"range of {end - start} {unit} is more than the {cap} one read may return.")
    value = read_slice(source, start, end)
    result = {**base, "start": start, "end": end, f"total_{unit}": shape.length}
    if isinstance(value, bytes):
        result["content_base64"] = base64.b64encode(value).decode("ascii")
    else:
        result["content"] = value
    return result


def _lines(arguments: dict[str, Any], source: ChunkSource, max_chars: int) -> dict[str, Any]:
    total = source.shape.line_count
    first = _int(arguments, "start", None, minimum=1, hint="the first line, 1-based")
    last = _int(arguments, "end", min(first + DEFAULT_LINES - 1, max(total, first)), minimum=1)
    if last < first:
        raise BadRead(f"lines needs start <= end; got start={first}, end={last}.")
    if first > total or last > total:
        raise BadRead(f"lines {first}..{last} are out of range: the entry has {total} lines.")
    content = read_lines(source, first, last, max_chars)
    return {"start": first, "end": last, "total_lines": total, "content": content}


def _grep(arguments: dict[str, Any], source: ChunkSource, timeout: float, max_chars: int) -> dict[str, Any]:
    pattern_text = arguments.get("pattern")
    if not isinstance(pattern_text, str) or not pattern_text:
        raise BadRead("grep needs a non-empty 'pattern' (a regular expression).")
    ignore_case = arguments.get("ignore_case", False)
    if not isinstance(ignore_case, bool):
        raise BadRead(f"ignore_case must be true or false; got {ignore_case!r}.")
    context = _int(arguments, "context", 0, minimum=0, maximum=MAX_CONTEXT)
    max_matches = _int(arguments, "max_matches", DEFAULT_MAX_MATCHES, minimum=1, maximum=MAX_MATCHES_LIMIT)
    flags = regex.MULTILINE | regex.VERSION0 | (regex.IGNORECASE if ignore_case else 0)
    try:
        pattern = compile_pattern(pattern_text, flags)
    except PatternError as exc:
        raise BadRead(f"pattern {pattern_text!r} is not a valid regular expression: {exc}.") from None
    try:
        found = grep(
            source, pattern, context=context, max_matches=max_matches, timeout_seconds=timeout, max_chars=max_chars
        )
    except TimeoutError:
        raise BadRead(
            f"pattern {pattern_text!r} took more than {timeout:g} s and was stopped (it backtracks too much on "
            "this content); use a simpler pattern, for example without nested repetition."
        ) from None
    result: dict[str, Any] = {
        "pattern": pattern_text,
        "matches": found.matches,
        "more_matches": found.more,
        "content": found.content,
        **({"stopped_before_line": found.full_at_line} if found.full_at_line is not None else {}),
    }
    notes = []
    if found.matches == 0:
        notes.append("No line matches.")
    if found.more:
        notes.append(
            f"More matches follow: only the first {found.matches} are shown. Narrow the pattern, raise max_matches "
            "(up to 500), or read further with mode=lines."
        )
    if found.full_at_line is not None:
        notes.append(
            f"The lines shown fill the {max_chars} characters one read may return; they stop before line "
            f"{found.full_at_line}. Narrow the pattern, lower max_matches or context, or read on with mode=lines."
        )
    if found.split_lines:
        notes.append(
            f"Line(s) {', '.join(map(str, found.split_lines))} are longer than a million characters and were "
            "searched in overlapping pieces; a match longer than 1000 characters across a piece boundary can be missed."
        )
    if notes:
        result["_note"] = " ".join(notes)
    return result


def _int(
    arguments: dict[str, Any],
    name: str,
    default: int | None,
    *,
    minimum: int,
    maximum: int | None = None,
    hint: str = "",
) -> int:
    value = arguments.get(name)
    if value is None:
        if default is None:
            raise BadRead(f"{name} is required for mode={arguments.get('mode', 'head')}{f' ({hint})' if hint else ''}.")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRead(f"{name} must be an integer; got {value!r}.")
    if value < minimum:
        raise BadRead(f"{name} must be at least {minimum}; got {value}.")
    if maximum is not None and value > maximum:
        raise BadRead(f"{name} must be at most {maximum}; got {value}.")
    return value
