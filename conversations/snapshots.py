"""Snapshots: render discarded history into dense pages of bitmap glyphs (CH-3, CH-4).

A vision model bills an image by its area (or a flat rate), not by how many
characters are drawn on it, so a page of small glyphs carries several times more
text than its image costs. Pages are always rendered from the retained source
text, never from an earlier pass's pixels: re-imaging an image loses a generation
of glyph quality per compaction until nothing can read it (CH-4).

The glyphs are Pillow's built-in bitmap font (6 x 11 px cells, public domain,
shipped inside Pillow), so rendering needs no font file, no key and no network.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from agents.runtime.tokens import estimate_text_tokens
from conversations.transcript import Msg, image_size, image_tokens

INK = 0
DIM_INK = 96
PAPER = 255
RESULT_CAP = 2000


@dataclass(frozen=True)
class PageShape:
    """A page size and glyph cell; shapes are configuration, chosen per provider's image billing."""

    name: str
    width: int
    height: int
    cell_width: int = 6
    cell_height: int = 11
    margin: int = 4

    @property
    def columns(self) -> int:
        return (self.width - 2 * self.margin) // self.cell_width

    @property
    def rows(self) -> int:
        return (self.height - 2 * self.margin) // self.cell_height


# The area rule bills up to about 1.15 MP; the fixed rule one flat rate up to 2048 px.
PAGE_SHAPES: dict[str, PageShape] = {
    "area": PageShape("area", 1072, 1072),
    "fixed": PageShape("fixed", 2048, 2048),
}


@dataclass(frozen=True)
class Line:
    text: str
    dim: bool = False


@dataclass(frozen=True)
class Page:
    png: bytes
    chars: int
    width: int
    height: int

    def as_block(self) -> dict[str, Any]:
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(self.png).decode()},
        }


@dataclass
class SnapshotReport:
    shape: str
    image_rule: str
    pages: int = 0
    chars_per_page: list[int] = field(default_factory=list)
    image_tokens_per_page: int = 0
    text_tokens: int = 0
    image_tokens: int = 0

    @property
    def tokens_saved(self) -> int:
        return self.text_tokens - self.image_tokens

    def as_dict(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "image_rule": self.image_rule,
            "pages": self.pages,
            "chars_per_page": self.chars_per_page,
            "image_tokens_per_page": self.image_tokens_per_page,
            "text_tokens": self.text_tokens,
            "image_tokens": self.image_tokens,
            "tokens_saved": self.tokens_saved,
        }


@cache
def _font() -> ImageFont.ImageFont:
    return ImageFont.load_default_imagefont()


def _printable(text: str) -> str:
    # The bitmap font covers Latin-1; anything else becomes '?' rather than a blank cell.
    return "".join(ch if 32 <= ord(ch) < 256 and ord(ch) != 127 else ("    " if ch == "\t" else "?") for ch in text)


BREAK = " \u00b6 "  # a pilcrow marks a line break, so short lines do not waste the rest of a row


def source_lines(messages: Sequence[Msg], *, result_cap: int = RESULT_CAP) -> list[Line]:
    """The retained source text of `messages`, flowed for density.

    Each message starts with its role marker; its narrative flows on in black ink,
    line breaks shown as a pilcrow; each tool result is its own dimmer paragraph,
    capped at `result_cap` characters.
    """
    lines: list[Line] = []
    for message in messages:
        marker = f"[{message.get('role', '?')}" + (f" #{message['id']}" if message.get("id") is not None else "") + "]"
        narrative = [marker]
        for block in message.get("content") or []:
            kind = block.get("type")
            if kind == "text":
                narrative.append(_flow(block.get("text", "")))
            elif kind == "tool_use":
                arguments = json.dumps(block.get("input") or {}, sort_keys=True, ensure_ascii=False)
                narrative.append(f"-> {block.get('name')} {arguments}")
            elif kind == "image":
                size = image_size(block)
                narrative.append(f"[image {size[0]}x{size[1]}]" if size else "[image]")
            elif kind == "tool_result":
                if narrative:
                    lines.append(Line(" ".join(narrative)))
                    narrative = []
                lines.append(_result_line(block, result_cap))
            else:
                narrative.append(json.dumps(block, sort_keys=True, ensure_ascii=False)[:result_cap])
        if narrative:
            lines.append(Line(" ".join(narrative)))
    return lines


def _flow(text: str) -> str:
    return BREAK.join(part.rstrip() for part in text.splitlines())


def _result_line(block: dict[str, Any], cap: int) -> Line:
    content = block.get("content")
    if isinstance(content, list):
        text = "\n".join(
            inner.get("text", "") if inner.get("type") == "text" else f"[{inner.get('type')}]" for inner in content
        )
    elif isinstance(content, str):
        text = content
    else:
        text = json.dumps(content, sort_keys=True, ensure_ascii=False)
    status = "error" if block.get("is_error") else "result"
    if len(text) > cap:
        text = text[:cap] + f" ... [{len(text) - cap} more chars in the transcript]"
    return Line(f"<- {status}: {_flow(text)}", dim=True)


Row = list[Line]


def layout(lines: Sequence[Line], shape: PageShape) -> list[list[Row]]:
    """Flow the lines into one stream, wrap it to the page's columns, and cut it into pages.

    Messages follow each other on the same row (their role markers show where one
    starts), so short messages do not leave half-empty rows; ink changes mid-row.
    """
    pieces, inks = [], []
    for line in lines:
        text = _printable(line.text) + " "
        pieces.append(text)
        inks.append((len(text), line.dim))
    stream = "".join(pieces)
    dim_at = bytearray()
    for length, dim in inks:
        dim_at.extend([dim] * length)
    rows: list[Row] = []
    position, total, columns = 0, len(stream), shape.columns
    while position < total:
        end = min(position + columns, total)
        if end < total and stream[end] != " ":
            space = stream.rfind(" ", position, end)
            if space > position + columns // 2:
                end = space + 1
        rows.append(_segments(stream, dim_at, position, end))
        # A row never starts with the space the previous row broke at.
        position = end + 1 if end < total and stream[end] == " " else end
    return [rows[i : i + shape.rows] for i in range(0, len(rows), shape.rows)]


def _segments(stream: str, dim_at: bytearray, start: int, end: int) -> Row:
    segments: Row = []
    run_start = start
    for index in range(start + 1, end + 1):
        if index == end or dim_at[index] != dim_at[run_start]:
            segments.append(Line(stream[run_start:index], bool(dim_at[run_start])))
            run_start = index
    return segments


def render_page(rows: Sequence[Row], shape: PageShape) -> Page:
    # Three inks in a 2-bit palette: encoding a quarter of the bytes of a grey image is
    # what keeps a 2048-px page under 100 ms (PNG compression dominates rendering).
    image = Image.new("P", (shape.width, shape.height), 0)
    image.putpalette([PAPER] * 3 + [INK] * 3 + [DIM_INK] * 3)
    draw = ImageDraw.Draw(image)
    font = _font()
    for row_index, row in enumerate(rows):
        y = shape.margin + row_index * shape.cell_height
        column = 0
        for segment in row:
            x = shape.margin + column * shape.cell_width
            draw.text((x, y), segment.text, font=font, fill=2 if segment.dim else 1)
            column += len(segment.text)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", bits=2, compress_level=1)
    chars = sum(len(segment.text) for row in rows for segment in row)
    return Page(buffer.getvalue(), chars, shape.width, shape.height)


def render(
    messages: Sequence[Msg], *, shape: PageShape = PAGE_SHAPES["area"], image_rule: str = "area"
) -> tuple[list[Page], SnapshotReport]:
    """Pages for `messages`, and what they cost against the same characters as text."""
    lines = source_lines(messages)
    pages = [render_page(chunk, shape) for chunk in layout(lines, shape)]
    per_page = image_tokens(shape.width, shape.height, rule=image_rule)
    source_text = "\n".join(line.text for line in lines)
    report = SnapshotReport(
        shape=shape.name,
        image_rule=image_rule,
        pages=len(pages),
        chars_per_page=[page.chars for page in pages],
        image_tokens_per_page=per_page,
        text_tokens=estimate_text_tokens(source_text),
        image_tokens=per_page * len(pages),
    )
    return pages, report
