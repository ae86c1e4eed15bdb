"""The chat-completions route counts images as OpenAI documents them, through the official SDK over HTTP
(EM-2, EM-5).

QA: a 200 x 100 PNG cost 34 tokens on /v1/messages but 20,092 on /v1/chat/completions (its base64
length over four), and a conversation with 3 snapshot pages switched to gpt-4o-mini was refused as
"29854 tokens against a maximum of 12000" while the app estimated about 6,000.
"""

from __future__ import annotations

import base64
import io
import random
from typing import Any

import openai
import pytest
from PIL import Image

from engine.context.snapshots import render
from engine.context.transcript import block_tokens
from engine.emulator import Emulator, TestClock
from engine.emulator.server import EmulatorServer

WINDOW = 12_000
MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def gpt():
    with EmulatorServer(Emulator(clock=TestClock(), context_window=WINDOW)) as server:
        yield openai.OpenAI(api_key="k", base_url=f"{server.base_url}/v1", max_retries=0)


def noise_png(width: int, height: int) -> str:
    """A PNG that does not compress, so its base64 is as long as QA's (80,244 characters at 200 x 100)."""
    raw = random.Random(width * height).randbytes(width * height * 3)
    buffer = io.BytesIO()
    Image.frombytes("RGB", (width, height), raw).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def plain_png(width: int, height: int) -> str:
    # One colour: the token count depends on the size alone, and a 4096 px upload stays small.
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def image_part(data: str, detail: str | None = None) -> dict[str, Any]:
    image_url = {"url": f"data:image/png;base64,{data}", **({"detail": detail} if detail else {})}
    return {"type": "image_url", "image_url": image_url}


def prompt_tokens(gpt: openai.OpenAI, *parts: dict[str, Any]) -> int:
    content = [{"type": "text", "text": "Notes 7: what is on these pages?"}, *parts]
    reply = gpt.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}])
    assert reply.usage is not None
    return reply.usage.prompt_tokens


# Width, height, detail and the tokens OpenAI's vision guide gives ("Calculating costs": 85 + 170 a
# 512 px tile after fitting 2048 x 2048 and a 768 px shortest side; `low` is 85 whatever the size).
DOCUMENTED = [
    (200, 100, None, 255),
    (1024, 1024, "high", 765),
    (2048, 4096, "high", 1105),
    (4096, 4096, "low", 85),
]


@pytest.mark.req("EM-2")
@pytest.mark.parametrize(("width", "height", "detail", "tokens"), DOCUMENTED)
def test_an_image_url_costs_what_openai_documents_never_its_base64_length(gpt, width, height, detail, tokens):
    assert prompt_tokens(gpt, image_part(plain_png(width, height), detail)) - prompt_tokens(gpt) == tokens


@pytest.mark.req("EM-2")
def test_qa_png_is_answered_under_a_small_window_and_counted_as_one_tile(gpt):
    data = noise_png(200, 100)
    assert len(data) > 4 * WINDOW  # counted as text, it alone would overflow the window
    assert prompt_tokens(gpt, image_part(data)) - prompt_tokens(gpt) == 255


@pytest.mark.req("EM-5")
def test_snapshot_pages_fit_the_window_and_cost_no_more_than_the_app_estimates(gpt):
    words = random.Random(7).choices(["release", "plan", "review", "date", "owner", "risk", "docs", "ship"], k=9000)
    pages, _ = render([{"role": "user", "content": [{"type": "text", "text": " ".join(words)}]}])
    blocks = [page.as_block() for page in pages[:3]]
    data = [block["source"]["data"] for block in blocks]
    assert len(blocks) == 3 and sum(map(len, data)) > 4 * WINDOW  # as text, QA's refusal

    counted = prompt_tokens(gpt, *map(image_part, data)) - prompt_tokens(gpt)

    # 1072 x 1072 pages: 768 x 768 after scaling, 4 tiles each.
    assert counted == 3 * 765
    # The app's own estimate (the Context view's formula) never counts these pages as cheaper than the route does.
    assert counted <= sum(block_tokens(block) for block in blocks)
