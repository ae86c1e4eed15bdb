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
# Level 1: about 240 MB/s of CPU per core and still about 5x on server logs; higher levels
# cost more CPU in `put` than they save in storage.
COMPRESS_LEVEL = 1
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
    raw_size: int  # bytes before compression


def _raw_pieces(content: str | bytes, size: int) -> Iterator[tuple[int, int, bytes]]:
    for start in range(0, len(content), size):
        piece = content[start : start + size]
        raw = piece.encode("utf-8") if isinstance(piece, str) else piece
        yield start, len(piece), raw


def chunk_size_for(content: str | bytes) -> int:
    return CHUNK_CHARS if isinstance(content, str) else CHUNK_BYTES


def encode_iter(content: str | bytes, *, chunk_size: int | None = None) -> Iterator[EncodedChunk]:
    """Cut and compress `content` in order; str is stored as UTF-8 text, bytes as they are.

    Chunks come out as soon as they are compressed, so the caller can write the
    first ones while later ones are still being compressed on other threads.
    """
    size = chunk_size or chunk_size_for(content)
    text = isinstance(content, str)
    pieces = _raw_pieces(content, size)
    if len(content) < size * _PARALLEL_FROM_CHUNKS:
        compressed: Iterator[tuple[tuple[int, int, bytes], bytes]] = (
            (piece, zlib.compress(piece[2], COMPRESS_LEVEL)) for piece in pieces
        )
        yield from _numbered(compressed, text)
        return
    with ThreadPoolExecutor(max_workers=_WORKERS) as pool:
        yield from _numbered(pool.map(_compress, pieces), text)


def _compress(piece: tuple[int, int, bytes]) -> tuple[tuple[int, int, bytes], bytes]:
    return piece, zlib.compress(piece[2], COMPRESS_LEVEL)


def _numbered(compressed: Iterator[tuple[tuple[int, int, bytes], bytes]], text: bool) -> Iterator[EncodedChunk]:
    lines_before = 0
    for index, ((start, count, raw), data) in enumerate(compressed):
        newlines = raw.count(b"\n") if text else 0
        yield EncodedChunk(index, start, count, lines_before, newlines, data, len(raw))
        lines_before += newlines


def encode(content: str | bytes, *, chunk_size: int | None = None) -> list[EncodedChunk]:
    return list(encode_iter(content, chunk_size=chunk_size))


def decode(data: bytes, *, text: bool) -> str | bytes:
    raw = zlib.decompress(data)
    return raw.decode("utf-8") if text else raw
