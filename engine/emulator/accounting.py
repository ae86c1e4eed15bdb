"""Token counting and usage as the API reports it."""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from typing import Any

from PIL import Image

from engine.context.transcript import UNKNOWN_IMAGE_TOKENS, image_tokens
from engine.emulator.validation import (
    IMAGE_MAX_BYTES,
    IMAGE_MAX_EDGE,
    MANY_IMAGES,
    MANY_IMAGES_MAX_EDGE,
    MAX_IMAGES,
    invalid_request,
)
from engine.tokens import estimate_json_tokens, estimate_text_tokens


@dataclass
class Usage:
    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    cache_creation_5m: int
    cache_creation_1h: int
    output_tokens: int = 0

    def as_anthropic(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.cache_creation_5m,
                "ephemeral_1h_input_tokens": self.cache_creation_1h,
            },
            "output_tokens": self.output_tokens,
        }

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens


def output_tokens(content: list[dict[str, Any]]) -> int:
    total = 0
    for block in content:
        if block.get("type") == "text":
            total += estimate_text_tokens(block["text"])
        else:
            total += estimate_json_tokens(block)
    return max(total, 1)


_FORMATS = {"JPEG": "image/jpeg", "PNG": "image/png", "GIF": "image/gif", "WEBP": "image/webp"}


def count_images(contents: list[list[dict[str, Any]]]) -> int:
    total = 0
    for content in contents:
        for block in content:
            if block.get("type") == "image":
                total += 1
            elif block.get("type") == "tool_result" and isinstance(block.get("content"), list):
                total += sum(1 for inner in block["content"] if inner.get("type") == "image")
    if total > MAX_IMAGES:
        raise invalid_request(f"messages: Too many images in request: {total} > {MAX_IMAGES} maximum")
    return total


def image_block_tokens(block: dict[str, Any], images_in_request: int, where: str) -> int:
    """Decode, check and count one image block with the documented formula (the Context view's own)."""
    source = block["source"]
    if source["type"] == "url":
        # The emulator fetches nothing: a URL image is counted at the largest size the formula allows.
        return UNKNOWN_IMAGE_TOKENS
    where = f"{where}.image.source.base64"
    try:
        data = base64.b64decode(source["data"], validate=True)
    except (binascii.Error, ValueError):
        raise invalid_request(f"{where}.data: The image data is not valid base64") from None
    if len(data) > IMAGE_MAX_BYTES:
        raise invalid_request(f"{where}: image exceeds 5 MB maximum: {len(data)} bytes > {IMAGE_MAX_BYTES} bytes")
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            found = _FORMATS.get(image.format or "")
    except (OSError, ValueError, Image.DecompressionBombError):
        raise invalid_request(f"{where}.data: Could not process image") from None
    if found is None:
        raise invalid_request(f"{where}.data: Could not process image")
    if found != source["media_type"]:
        raise invalid_request(
            f"{where}: The image was specified using the {source['media_type']} media type, "
            f"but the image appears to be a {found} image"
        )
    limit = MANY_IMAGES_MAX_EDGE if images_in_request > MANY_IMAGES else IMAGE_MAX_EDGE
    if max(width, height) > limit:
        raise invalid_request(
            f"{where}.data: At least one of the image dimensions exceed max allowed size: {limit} pixels"
        )
    return image_tokens(width, height)


def block_tokens(block: dict[str, Any], images_in_request: int, where: str) -> int:
    """A block's tokens: the shared JSON estimate, except images, which cost what their size says."""
    if block.get("type") == "image":
        return image_block_tokens(block, images_in_request, where)
    if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
        images = [(i, inner) for i, inner in enumerate(block["content"]) if inner.get("type") == "image"]
        if images:
            rest = {**block, "content": [inner for inner in block["content"] if inner.get("type") != "image"]}
            return estimate_json_tokens(rest) + sum(
                image_block_tokens(inner, images_in_request, f"{where}.tool_result.content.{i}") for i, inner in images
            )
    return estimate_json_tokens(block)
