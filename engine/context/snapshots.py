"""Snapshots: render discarded history into dense pages of bitmap glyphs (CH-3, CH-4).

A vision model bills an image by its area (or a flat rate), not by how many
characters are drawn on it, so a page of small glyphs carries several times more
text than its image costs. Pages are always rendered from the retained source
text, never from an earlier pass's pixels: re-imaging an image loses a generation
of glyph quality per compaction until nothing can read it (CH-4).

The glyphs are the X11 misc-fixed 6x12 font (public domain, shipped in
`engine/context/fonts/`, ~4,500 glyphs: Latin with its extensions, Greek, Cyrillic,
Hebrew, punctuation, arrows, maths, box drawing), so rendering needs no key and no
network. A character the font lacks is drawn as the font's replacement glyph (U+FFFD)
and counted in the report, never silently dropped or turned into '?'.
"""

from __future__ import annotations

import base64
import io
import json
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from engine.context.transcript import Msg, image_size, image_tokens
from engine.tokens import estimate_text_tokens

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
    # The glyph cell is the font's (misc-fixed 6x12); the narrow margin keeps 88 rows on an `area` page.
    cell_width: int = 6
    cell_height: int = 12
    margin: int = 2

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


def page_for_window(pixels: int) -> PageShape:
    """The `area` page, or a smaller square one so a page stays a small share of a small window (LM-2)."""
    area = PAGE_SHAPES["area"]
    return area if pixels >= area.width else PageShape(f"area-{pixels}", pixels, pixels)


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
    # Characters the font has no glyph for, drawn as the replacement glyph: how many, and which.
    missing_chars: int = 0
    missing: dict[str, int] = field(default_factory=dict)

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
            "missing_chars": self.missing_chars,
            "missing": self.missing,
        }


FONT_FILE = Path(__file__).parent / "fonts" / "misc-fixed-6x12.npz"
REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class GlyphFont:
    """A single-width bitmap font: sorted code points and one cell bitmap (0/1) per glyph."""

    codepoints: np.ndarray
    glyphs: np.ndarray  # glyphs x cell height x cell width, uint8 0/1
    replacement: int  # index of U+FFFD, drawn for every character the font lacks

    def indices(self, text: str) -> np.ndarray:
        """Glyph index per character of `text`, the replacement glyph where the font has none."""
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        found = np.minimum(np.searchsorted(self.codepoints, codes), len(self.codepoints) - 1)
        return np.where(self.codepoints[found] == codes, found, self.replacement)


@cache
def font() -> GlyphFont:
    with np.load(FONT_FILE) as data:
        codepoints, rows = data["codepoints"], data["rows"]
    # One byte per pixel row, the cell's columns in the high bits.
    glyphs = np.unpackbits(rows[:, :, None], axis=2)[:, :, :6]
    replacement = int(np.searchsorted(codepoints, ord(REPLACEMENT)))
    return GlyphFont(codepoints, np.ascontiguousarray(glyphs), replacement)


def _printable(text: str) -> str:
    # Composed form, so a base letter plus a combining accent takes the one precomposed glyph;
    # a tab is four cells, other control characters fall to the replacement glyph.
    return unicodedata.normalize("NFC", text).replace("\t", "    ")


def missing_chars(text: str) -> Counter[str]:
    """The characters of `text` the font has no glyph for (each drawn as the replacement glyph)."""
    text = _printable(text)
    glyphs = font()
    drawn_as_replacement = np.flatnonzero(glyphs.indices(text) == glyphs.replacement)
    return Counter(text[i] for i in drawn_as_replacement.tolist() if text[i] != REPLACEMENT)


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
    glyphs = font()
    count, columns = len(rows), shape.columns
    texts = ["".join(segment.text for segment in row) for row in rows]
    # The page as a grid of glyph indices and inks, then every cell's bitmap in one numpy gather.
    cells = glyphs.indices("".join(text.ljust(columns) for text in texts)).reshape(count, columns)
    inks = np.ones((count, columns), dtype=np.uint8)
    for row_index, row in enumerate(rows):
        column = 0
        for segment in row:
            if segment.dim:
                inks[row_index, column : column + len(segment.text)] = 2
            column += len(segment.text)
    height, width = glyphs.glyphs.shape[1:]
    pixels = (glyphs.glyphs[cells] * inks[:, :, None, None]).transpose(0, 2, 1, 3).reshape(count * height, -1)
    page = np.zeros((shape.height, shape.width), dtype=np.uint8)
    page[shape.margin : shape.margin + pixels.shape[0], shape.margin : shape.margin + pixels.shape[1]] = pixels
    # Three inks in a 2-bit palette: encoding a quarter of the bytes of a grey image is
    # what keeps a 2048-px page under 100 ms (PNG compression dominates rendering).
    image = Image.frombytes("P", (shape.width, shape.height), page.tobytes())
    image.putpalette([PAPER] * 3 + [INK] * 3 + [DIM_INK] * 3)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", bits=2, compress_level=1)
    return Page(buffer.getvalue(), sum(len(text) for text in texts), shape.width, shape.height)


def render(
    messages: Sequence[Msg], *, shape: PageShape = PAGE_SHAPES["area"], image_rule: str = "area"
) -> tuple[list[Page], SnapshotReport]:
    """Pages for `messages`, and what they cost against the same characters as text."""
    lines = source_lines(messages)
    pages = [render_page(chunk, shape) for chunk in layout(lines, shape)]
    per_page = image_tokens(shape.width, shape.height, rule=image_rule)
    source_text = "\n".join(line.text for line in lines)
    missing = missing_chars(" ".join(line.text for line in lines))
    report = SnapshotReport(
        shape=shape.name,
        image_rule=image_rule,
        pages=len(pages),
        chars_per_page=[page.chars for page in pages],
        image_tokens_per_page=per_page,
        text_tokens=estimate_text_tokens(source_text),
        image_tokens=per_page * len(pages),
        missing_chars=sum(missing.values()),
        missing=dict(missing.most_common(20)),
    )
    return pages, report
