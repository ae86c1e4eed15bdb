"""Chunked, compressed storage layout of an entry's content (SP-12). Pure.

Text is cut every CHUNK_CHARS characters, binary every CHUNK_BYTES bytes; each
chunk is compressed on its own and records its character offset and how many
newlines precede and fall inside it. A read of a range or of a few lines then
decompresses only the chunks it touches, whatever the size of the entry.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

CHUNK_CHARS = 128 * 1024
CHUNK_BYTES = 128 * 1024
# Level 3 keeps `put` above 100 MB/s on one core and still compresses logs about 4-5x.
COMPRESS_LEVEL = 3
# zlib releases the GIL, so a big put compresses on several cores.
_PARALLEL_FROM_CHUNKS = 8
_WORKERS = 4


@dataclass(frozen=True)
class EncodedChunk:
    index: int
    char_start: int  # bytes for binary content
    char_count: int
    line_start: int  # newlines before this chunk
    line_count: int  # newlines inside this chunk
    data: bytes  # compressed


def _raw_pieces(content: str | bytes, size: int) -> Iterator[tuple[int, int, bytes]]:
    for start in range(0, len(content), size):
        piece = content[start : start + size]
        raw = piece.encode("utf-8") if isinstance(piece, str) else piece
        yield start, len(piece), raw


def encode(content: str | bytes, *, chunk_size: int | None = None) -> list[EncodedChunk]:
    """Cut and compress `content`; str is stored as UTF-8 text, bytes as they are."""
    size = chunk_size or (CHUNK_CHARS if isinstance(content, str) else CHUNK_BYTES)
    pieces = list(_raw_pieces(content, size))
    if len(pieces) >= _PARALLEL_FROM_CHUNKS:
        with ThreadPoolExecutor(max_workers=_WORKERS) as pool:
            compressed = list(pool.map(lambda piece: zlib.compress(piece[2], COMPRESS_LEVEL), pieces))
    else:
        compressed = [zlib.compress(raw, COMPRESS_LEVEL) for _, _, raw in pieces]
    chunks = []
    lines_before = 0
    for index, ((start, count, raw), data) in enumerate(zip(pieces, compressed, strict=True)):
        newlines = raw.count(b"\n") if isinstance(content, str) else 0
        chunks.append(EncodedChunk(index, start, count, lines_before, newlines, data))
        lines_before += newlines
    return chunks


def decode(data: bytes, *, text: bool) -> str | bytes:
    raw = zlib.decompress(data)
    return raw.decode("utf-8") if text else raw
