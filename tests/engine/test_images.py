"""Tool images as the Messages API takes them (engine.images)."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from engine.images import MAX_EDGE, image_block


def _encoded(kind: str, size: tuple[int, int] = (2, 2)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, "red").save(buffer, kind)
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.req("MC-2")
@pytest.mark.parametrize(
    ("kind", "media_type"), [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("GIF", "image/gif"), ("WEBP", "image/webp")]
)
def test_the_four_formats_go_as_what_their_bytes_are_whatever_they_were_labelled(kind, media_type):
    data = _encoded(kind)
    assert image_block(data, "application/octet-stream") == (
        {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}},
        "",
    )


@pytest.mark.req("MC-2")
def test_what_the_api_refuses_is_left_out_with_the_reason():
    svg = base64.b64encode(b"<svg xmlns='http://www.w3.org/2000/svg'/>").decode()
    assert image_block(svg, "image/svg+xml") == (None, "it is no JPEG, PNG, GIF or WebP image (labelled image/svg+xml)")
    assert image_block("not base64!", "image/png") == (None, "its data is not valid base64")
    huge = base64.b64encode(b"\0" * (5 * 1024 * 1024 + 1)).decode()
    assert image_block(huge, "image/png") == (None, "it is 5,242,881 bytes, over the model's limit of 5 MB")
    wide = _encoded("PNG", (MAX_EDGE + 1, 1))
    assert image_block(wide, "image/png") == (
        None,
        f"it is {MAX_EDGE + 1}x1 px, over the model's limit of 8000 px a side",
    )
