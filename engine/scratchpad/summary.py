"""Summaries the model sees in place of an offloaded observation (SP-4, SP-5).

Pure functions: no Django, no I/O.
"""

from __future__ import annotations

import hashlib

HEAD_CHARS = 500
TAIL_CHARS = 500


def text_summary(text: str, *, head: int = HEAD_CHARS, tail: int = TAIL_CHARS) -> str:
    """The first `head` and last `tail` characters around a marker with the exact omitted count (SP-4)."""
    omitted = len(text) - head - tail
    if omitted <= 0:
        return text
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[len(text) - tail :]}"


def binary_summary(data: bytes) -> str:
    """Size and fingerprint only: a text preview of bytes would be noise (SP-5)."""
    return f"[BINARY: {len(data)} bytes, sha256={hashlib.sha256(data).hexdigest()}]"
