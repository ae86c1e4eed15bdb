"""Images a tool hands the model, only as the Messages API takes them: JPEG, PNG, GIF or WebP, valid
base64, at most 5 MB and 8000 px a side. One image the API refuses fails the whole request, and so
the run: an MCP server's SVG or broken image is left out with the reason instead."""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

from PIL import Image

MEDIA_TYPES = {"JPEG": "image/jpeg", "PNG": "image/png", "GIF": "image/gif", "WEBP": "image/webp"}
MAX_BYTES = 5 * 1024 * 1024
MAX_EDGE = 8000


def image_block(data: str, media_type: str) -> tuple[dict[str, Any] | None, str]:
    """An image block of the base64 `data`, or None and why the model cannot be shown it. The media
    type is the one the bytes are: a PNG a server labelled image/jpeg is sent as image/png."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None, "its data is not valid base64"
    if len(raw) > MAX_BYTES:
        return None, f"it is {len(raw):,} bytes, over the model's limit of 5 MB"
    try:
        with Image.open(io.BytesIO(raw)) as image:
            found = MEDIA_TYPES.get(image.format or "")
            width, height = image.size
    except (OSError, ValueError, Image.DecompressionBombError):
        found, width, height = None, 0, 0
    if found is None:
        return None, f"it is no JPEG, PNG, GIF or WebP image (labelled {media_type or 'with no type'})"
    if max(width, height) > MAX_EDGE:
        return None, f"it is {width}x{height} px, over the model's limit of {MAX_EDGE} px a side"
    return {"type": "image", "source": {"type": "base64", "media_type": found, "data": data}}, ""
