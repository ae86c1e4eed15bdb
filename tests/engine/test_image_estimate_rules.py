"""Images are estimated by the billing rule of the provider the request goes to (CH-12).

QA: an image sent to an OpenAI-compatible provider was estimated by Anthropic's area rule
(a 1024 x 1024 screenshot: 1,399 tokens) while the chat route bills 765, so the compaction
trigger, the window fit and the Context view were off until calibration caught up.
"""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from engine.context.transcript import block_parts, image_tokens, messages_count, provider_image_rule
from engine.emulator.openai_route import chat_part_tokens
from engine.providers.openai_compat import to_chat_payload
from engine.request import ModelRequestSpec


def png_block(width: int, height: int) -> dict:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (20, 120, 200)).save(buffer, format="PNG")
    data = base64.b64encode(buffer.getvalue()).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def route_image_tokens(block: dict, detail: str | None = None) -> int:
    """What the emulator's chat route bills for this image, sent as the OpenAI provider sends it."""
    request = ModelRequestSpec(
        model="gpt-4o",
        system=[],
        tools=[],
        messages=[{"role": "user", "content": [{"type": "text", "text": "What is on it?"}, block]}],
    )
    (message,) = to_chat_payload(request)["messages"]
    if detail is not None:
        message["content"][1]["image_url"]["detail"] = detail
    without = {**message, "content": message["content"][:1]}
    return chat_part_tokens(message) - chat_part_tokens(without)


# Width, height, detail, and OpenAI's documented tokens (vision guide, "Calculating costs").
SIZES = [
    (200, 100, "auto", 255),
    (1024, 1024, "high", 765),
    (1072, 1072, "auto", 765),  # a snapshot page
    (2048, 4096, "high", 1105),
    (3000, 500, "auto", 765),  # 2048 x 341: 4 x 1 tiles
    (4096, 4096, "low", 85),
]


@pytest.mark.req("CH-12")
@pytest.mark.parametrize(("width", "height", "detail", "documented"), SIZES)
def test_the_openai_rule_counts_an_image_as_the_emulators_chat_route_bills_it(width, height, detail, documented):
    estimated = image_tokens(width, height, rule="openai", detail=detail)
    assert estimated == documented
    assert estimated == route_image_tokens(png_block(width, height), detail)


@pytest.mark.req("CH-12")
def test_each_provider_gets_its_own_rule_and_a_request_counts_its_images_by_it():
    assert provider_image_rule("openai") == "openai"
    assert {provider_image_rule(name) for name in ("anthropic", "offline", "emulator", "")} == {"area"}
    block = png_block(1024, 1024)
    # The app's blocks carry no detail and the provider sends none: the route counts it as `auto`.
    assert block_parts(block, image_rule="openai") == {"images": route_image_tokens(block)} == {"images": 765}
    assert block_parts(block) == {"images": 1399}  # Anthropic's area rule, as before
    nested = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [block]}]}]
    assert messages_count(nested, image_rule="openai").images == 765
    with pytest.raises(ValueError, match="area, fixed, openai"):
        image_tokens(10, 10, rule="tiles")
