"""Reads over a chunked entry: ranges, lines and grep (SP-6, SP-12). Pure.

Every read locates its first chunk through the chunk index (character offsets,
newline counts) and then walks forward only as far as it needs, so its cost follows
the size of what it returns, not the size of the entry. `grep` streams the chunks
one by one and keeps only the current block, a few context lines and the matches.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import regex

from engine.scratchpad.chunks import EncodedChunk, decode

GREP_DISPLAY_LINE_CHARS = 1000
GREP_LONG_LINE_CHARS = 1_000_000
GREP_OVERLAP_CHARS = 1000


class ReadError(Exception):
    """The read cannot be done as asked; the message says what was wrong."""


@dataclass(frozen=True)
class Chunk:
    index: int
    start: int  # character offset (byte offset for binary)
    line_start: int  # newlines before the chunk
    value: str | bytes


@dataclass(frozen=True)
class Shape:
    kind: str  # "text" | "binary"
    length: int  # characters for text, bytes for binary
    newline_count: int
    line_count: int


class ChunkSource(Protocol):
    shape: Shape

    def index_at_offset(self, offset: int) -> int:
        """The chunk holding character (or byte) `offset`."""
        ...

    def index_for_line(self, newlines_before: int) -> int:
        """The last chunk with fewer than `newlines_before` newlines before it (0 if none)."""
        ...

    def chunks(self, first_index: int) -> Iterator[Chunk]:
        """Decoded chunks from `first_index` on, fetched lazily in order."""
        ...


class MemoryChunkSource:
    """A ChunkSource over already-encoded chunks: for pure code paths and property tests."""

    def __init__(self, encoded: list[EncodedChunk], shape: Shape) -> None:
        self.encoded = encoded
        self.shape = shape
        self.decoded = 0

    def index_at_offset(self, offset: int) -> int:
        best = 0
        for chunk in self.encoded:
            if chunk.char_start <= offset:
                best = chunk.index
        return best

    def index_for_line(self, newlines_before: int) -> int:
        best = 0
        for chunk in self.encoded:
            if chunk.line_start < newlines_before:
                best = chunk.index
        return best

    def chunks(self, first_index: int) -> Iterator[Chunk]:
        for chunk in self.encoded[first_index:]:
            self.decoded += 1
            value = decode(chunk.data, text=self.shape.kind == "text")
            yield Chunk(chunk.index, chunk.char_start, chunk.line_start, value)


def shape_of(content: str | bytes) -> Shape:
    if isinstance(content, bytes):
        return Shape("binary", len(content), 0, 0)
    newlines = content.count("\n")
    return Shape("text", len(content), newlines, newlines + (1 if content and not content.endswith("\n") else 0))


def read_slice(source: ChunkSource, start: int, end: int) -> str | bytes:
    """Characters (bytes) `[start, end)`; the caller has checked the bounds."""
    parts: list[Any] = []
    if end <= start:
        return b"" if source.shape.kind == "binary" else ""
    for chunk in source.chunks(source.index_at_offset(start)):
        if chunk.start >= end:
            break
        parts.append(chunk.value[max(0, start - chunk.start) : max(0, end - chunk.start)])
        if chunk.start + len(chunk.value) >= end:
            break
    return (b"" if source.shape.kind == "binary" else "").join(parts)


def read_lines(source: ChunkSource, first: int, last: int, max_chars: int) -> str:
    """Lines `first..last` (1-based, inclusive) exactly as stored, newlines included."""
    to_skip = first - 1
    wanted = last - first + 1
    parts: list[str] = []
    size = 0
    chunks = source.chunks(source.index_for_line(to_skip))
    for chunk in chunks:
        text = chunk.value
        assert isinstance(text, str)
        pos = 0
        if to_skip:
            skip_here = to_skip - chunk.line_start
            if skip_here > 0:
                for _ in range(skip_here):
                    pos = text.index("\n", pos) + 1
            to_skip = 0
        while wanted and pos < len(text):
            newline = text.find("\n", pos)
            stop = len(text) if newline == -1 else newline + 1
            parts.append(text[pos:stop])
            size += stop - pos
            if size > max_chars:
                raise ReadError(
                    f"lines {first}..{last} hold more than {max_chars} characters, more than one read may return; "
                    "ask for fewer lines, or read a character range with mode=range."
                )
            pos = stop
            if newline != -1:
                wanted -= 1
        if not wanted:
            break
    return "".join(parts)


@dataclass
class GrepResult:
    content: str
    matches: int
    more: bool
    split_lines: list[int] = field(default_factory=list)
    # Set when the lines shown reached `max_chars`: the first line left out.
    full_at_line: int | None = None


class _Full(Exception):
    pass


def grep(
    source: ChunkSource,
    pattern: regex.Pattern[str],
    *,
    context: int,
    max_matches: int,
    timeout_seconds: float,
    max_chars: int,
    total_seconds: float = 60.0,
) -> GrepResult:
    """Lines matching `pattern`, `grep -n` style, with `context` lines around each match.

    Raises TimeoutError when one search over a block takes more than `timeout_seconds`
    (catastrophic backtracking), or the pattern more than `total_seconds` in all; time
    spent fetching chunks does not count. A match is reported at the line where it starts.
    The lines shown stop before they would pass `max_chars`, as any read does (SP-6).
    """
    spent = [0.0]
    out: list[str] = []
    state = {"matches": 0, "more": False, "last": 0, "after": 0}
    before: deque[tuple[int, str, int]] = deque(maxlen=max(context, 1))
    split_lines: list[int] = []
    shown = [0]

    def emit(number: int, text: str, is_match: bool, offset: int) -> None:
        if len(text) > GREP_DISPLAY_LINE_CHARS:
            # mode=lines refuses a line longer than one read, and grep gives no offset otherwise.
            extra, rest = len(text) - GREP_DISPLAY_LINE_CHARS, offset + GREP_DISPLAY_LINE_CHARS
            text = f"{text[:GREP_DISPLAY_LINE_CHARS]} [... {extra} more characters: mode=range from start={rest}]"
        line = f"{number}{':' if is_match else '-'}{text}"
        separator = ["--"] if out and number > state["last"] + 1 else []
        added = sum(len(part) + 1 for part in (*separator, line))
        if shown[0] + added > max_chars:
            raise _Full(number)
        out.extend((*separator, line))
        shown[0] += added
        state["last"] = number

    def matching_lines(block: str) -> set[int]:
        found_lines: set[int] = set()
        pos = counted_to = line = 0
        while pos <= len(block) and len(found_lines) <= max_matches:
            budget = min(timeout_seconds, total_seconds - spent[0])
            if budget <= 0:
                raise TimeoutError
            started = time.monotonic()
            found = pattern.search(block, pos, timeout=budget)
            spent[0] += time.monotonic() - started
            if found is None:
                break
            line += block.count("\n", counted_to, found.start())
            counted_to = found.start()
            found_lines.add(line)
            newline = block.find("\n", found.start())
            if newline == -1:
                break
            pos = newline + 1
        return found_lines

    def scan(block: str, first_line: int, block_offset: int) -> bool:
        """Scan one block of whole lines; False once more than `max_matches` were found."""
        hits = matching_lines(block)
        lines = block.split("\n")
        if block.endswith("\n"):
            lines.pop()
        if not hits and not state["after"]:
            # Nothing to show here: only remember the last lines as context for later.
            at = block_offset + sum(len(text) + 1 for text in lines[: max(0, len(lines) - context)])
            for offset in range(max(0, len(lines) - context), len(lines)):
                before.append((first_line + offset, lines[offset], at))
                at += len(lines[offset]) + 1
            return True
        at = block_offset
        for offset, text in enumerate(lines):
            number, line_offset = first_line + offset, at
            at += len(text) + 1
            if number <= state["last"]:
                continue
            if offset in hits:
                if state["matches"] >= max_matches:
                    state["more"] = True
                    return False
                for ctx_number, ctx_text, ctx_offset in before:
                    if ctx_number > state["last"] and ctx_number >= number - context:
                        emit(ctx_number, ctx_text, False, ctx_offset)
                emit(number, text, True, line_offset)
                state["matches"] += 1
                state["after"] = context
            elif state["after"]:
                emit(number, text, False, line_offset)
                state["after"] -= 1
            if context:
                before.append((number, text, line_offset))
        return True

    carry, carry_line, carry_offset = "", 1, 0  # `carry` starts at line `carry_line`, offset `carry_offset`
    finished = True
    full_at: int | None = None
    try:
        for chunk in source.chunks(0):
            assert isinstance(chunk.value, str)
            block, block_offset = carry + chunk.value, carry_offset
            cut = block.rfind("\n") + 1
            if cut == 0:
                carry = block
                if len(carry) > GREP_LONG_LINE_CHARS:
                    # A line with no end in sight: search it in overlapping pieces and say so.
                    if not split_lines or split_lines[-1] != carry_line:
                        split_lines.append(carry_line)
                    if not scan(carry, carry_line, carry_offset):
                        finished = False
                        break
                    carry_offset += len(carry) - GREP_OVERLAP_CHARS
                    carry = carry[-GREP_OVERLAP_CHARS:]
                continue
            if not scan(block[:cut], carry_line, block_offset):
                finished = False
                break
            carry_line += block.count("\n", 0, cut)
            carry, carry_offset = block[cut:], block_offset + cut
        if finished and carry:
            scan(carry, carry_line, carry_offset)
    except _Full as full:
        full_at = full.args[0]
    return GrepResult("\n".join(out), int(state["matches"]), bool(state["more"]), split_lines, full_at)
