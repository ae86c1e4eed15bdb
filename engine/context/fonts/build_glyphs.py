"""Rebuild `misc-fixed-6x12.npz` from the X11 misc-fixed font (public domain).

    apt-get download xfonts-base && dpkg-deb -x xfonts-base_*.deb x
    python engine/context/fonts/build_glyphs.py x/usr/share/fonts/X11/misc/6x12.pcf.gz \
        engine/context/fonts/misc-fixed-6x12.npz

Keeps every single-width glyph of the font except control characters, each placed in the font's 6 x 12 character
cell, one byte per pixel row (the 6 columns in the high bits): `codepoints` (sorted
uint32) and `rows` (uint8, glyphs x 12). Compressed, ~4,500 glyphs take ~25 KB.
"""

from __future__ import annotations

import gzip
import io
import sys
import unicodedata

import numpy as np
from PIL import Image, PcfFontFile


class _UnicodePcf(PcfFontFile.PcfFontFile):
    """Pillow's PCF reader keeps 256 glyphs of one 8-bit charset; this keeps the whole encoding table."""

    def _load_encoding(self) -> list[int | None]:
        fp, _, i16, _ = self._getformat(PcfFontFile.PCF_BDF_ENCODINGS)
        first_col, last_col, first_row, last_row, _default = (i16(fp.read(2)) for _ in range(5))
        columns = last_col - first_col + 1
        offsets = [i16(fp.read(2)) for _ in range(columns * (last_row - first_row + 1))]
        self.unicode = {
            ((index // columns + first_row) << 8) | (index % columns + first_col): offset
            for index, offset in enumerate(offsets)
            if offset != 0xFFFF
        }
        return []


def build(source: str, target: str) -> None:
    with gzip.open(source) as packed:
        font = _UnicodePcf(io.BytesIO(packed.read()))
    metrics = font._load_metrics()
    bitmaps = font._load_bitmaps(metrics)
    ascent, descent = max(m[5] for m in metrics), max(m[6] for m in metrics)
    cell_width = metrics[font.unicode[ord("M")]][4]
    codepoints, rows = [], []
    for codepoint, index in sorted(font.unicode.items()):
        _, _, left, _, width, glyph_ascent, _, _ = metrics[index]
        if width != cell_width or unicodedata.category(chr(codepoint)) == "Cc":
            # Double-width glyphs do not fit the one-cell grid; a control character's picture
            # (the font's default glyph at U+0000) should count as missing, not pass as text.
            continue
        cell = Image.new("1", (cell_width, ascent + descent), 0)
        cell.paste(bitmaps[index], (left, ascent - glyph_ascent))
        rows.append(np.packbits(np.array(cell, dtype=np.uint8), axis=1)[:, 0])
        codepoints.append(codepoint)
    np.savez_compressed(target, codepoints=np.array(codepoints, dtype=np.uint32), rows=np.array(rows, dtype=np.uint8))


if __name__ == "__main__":
    build(sys.argv[1], sys.argv[2])
