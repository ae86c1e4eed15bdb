"""Snapshot benchmark (CH-3): density, token saving, render time and OCR legibility per page shape.

    python manage.py bench snapshots --json [--pages 3 --upscale 3]

For each shape in `engine.context.snapshots.PAGE_SHAPES`: characters per page, image
tokens per page and the saving ratio (text tokens of the same characters / image
tokens) under both billing rules (area: about w*h/750; fixed: 1,120 per page up to
2048 px), render time per page, and `ocr_char_accuracy`: the first page read back by
Tesseract (a stand-in for a vision model), upscaled, against its source text. `font`
says how many glyphs the font has and which characters of a multilingual sample it
lacks (each drawn as the replacement glyph).
"""

from __future__ import annotations

import difflib
import io
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from PIL import Image

from bench._options import positive
from engine.context import snapshots
from engine.context.transcript import image_tokens
from engine.tokens import estimate_text_tokens

_SAMPLE = [
    ("user", "Port the CSV parser to the new reader API. Keep the public functions and their signatures unchanged."),
    ("assistant", "I will read parser.py first, then the tests, and list what depends on the old reader."),
    ("result", '{"ok": true, "path": "src/parser.py", "lines": 412, "text": "def parse(stream, *, delimiter=\',\'):"}'),
    ("assistant", "The parser calls reader.next_row() in three places; the new API yields rows from iter_rows()."),
    ("user", "Good. Change the three call sites, run the test suite and report which tests fail, if any."),
    ("result", '{"ok": false, "error": "2 failed, 118 passed: test_quoted_newline, test_bom_header"}'),
]


# The seeds' languages and the scripts users write in; the last two characters are outside the font.
_MULTILINGUAL = (
    "Perché no? Città, però. Árvíztűrő tükörfúrógép, ŐŰ. Não, ação, coração. "
    "Ελληνικά γράμματα. Русский текст, Україна. “quotes” — dash … → ≤ ≥ € ✓ 中😀"
)


def add_arguments(parser) -> None:
    parser.add_argument("--pages", type=positive, default=3, help="pages rendered per shape for timing")
    parser.add_argument("--upscale", type=positive, default=3, help="upscale factor before OCR")
    parser.add_argument("--ocr-rows", type=positive, default=16, help="rows of the first page read back by OCR")


def _messages(chars: int) -> list[dict[str, Any]]:
    messages, total, index = [], 0, 0
    while total < chars:
        kind, text = _SAMPLE[index % len(_SAMPLE)]
        text = f"{text} (step {index})"
        if kind == "result":
            block = {"type": "tool_result", "tool_use_id": f"t{index}", "content": text}
            messages.append({"id": index, "role": "user", "content": [block]})
        else:
            messages.append({"id": index, "role": kind, "content": [{"type": "text", "text": text}]})
        total += len(text) + 12
        index += 1
    return messages


def _ocr_accuracy(
    page: snapshots.Page, rows: list[snapshots.Row], shape: snapshots.PageShape, upscale: int, sample_rows: int
) -> float | None:
    """Read a band of full-width rows back with Tesseract; the whole page would take minutes."""
    if shutil.which("tesseract") is None:
        return None
    rows = rows[:sample_rows]
    with Image.open(io.BytesIO(page.png)) as image:
        band = image.crop((0, 0, image.width, 2 * shape.margin + len(rows) * shape.cell_height))
        big = band.resize((band.width * upscale, band.height * upscale), Image.Resampling.NEAREST)
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "page.png"
            big.save(path)
            read = subprocess.run(
                ["tesseract", str(path), "stdout", "--psm", "6"], capture_output=True, text=True, check=True
            ).stdout
    source = " ".join("\n".join("".join(segment.text for segment in row) for row in rows).split())
    seen = " ".join(read.split())
    matcher = difflib.SequenceMatcher(None, source, seen, autojunk=False)
    matched = sum(block.size for block in matcher.get_matching_blocks())
    return round(matched / max(1, len(source)), 4)


def run(options: dict[str, Any]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for name, shape in snapshots.PAGE_SHAPES.items():
        messages = _messages(shape.columns * shape.rows * options["pages"])
        laid_out = snapshots.layout(snapshots.source_lines(messages), shape)[: options["pages"]]
        times, pages = [], []
        for chunk in laid_out:
            started = time.perf_counter()
            pages.append(snapshots.render_page(chunk, shape))
            times.append((time.perf_counter() - started) * 1000)
        chars = pages[0].chars
        text_tokens = estimate_text_tokens("x" * chars)
        by_rule = {}
        for rule in ("area", "fixed"):
            per_page = image_tokens(shape.width, shape.height, rule=rule)
            by_rule[rule] = {
                "image_tokens_per_page": per_page,
                "token_saving_ratio": round(text_tokens / per_page, 2),
            }
        figures[name] = {
            "width": shape.width,
            "height": shape.height,
            "chars_per_page": chars,
            "text_tokens_per_page": text_tokens,
            "rules": by_rule,
            "render_ms_per_page": round(statistics.median(times), 2),
            "ocr_char_accuracy": _ocr_accuracy(pages[0], laid_out[0], shape, options["upscale"], options["ocr_rows"]),
            "ocr_rows_sampled": min(options["ocr_rows"], len(laid_out[0])),
        }
    missing = snapshots.missing_chars(_MULTILINGUAL)
    return {
        "shapes": figures,
        "sample": json.dumps(_SAMPLE[0][1])[:60],
        "font": {
            "glyphs": len(snapshots.font().codepoints),
            "multilingual_sample_chars": len(_MULTILINGUAL),
            "multilingual_missing": dict(missing),
        },
    }
