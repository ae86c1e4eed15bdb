"""A run and the Context view of a conversation on an OpenAI-routed model estimate its images as the
chat route bills them, not by Anthropic's area rule (CH-12).

QA: a 1024 x 1024 screenshot sent to gpt-4o was estimated at 1,399 tokens (w x h / 750) while the
provider bills 765, so the first estimate of an image-heavy request (compaction trigger, window fit,
Context view) was off until calibration corrected it from measured usage.
"""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from agents.lifecycle import run_execute
from agents.models import ModelRequest, Run
from agents.turns import context_view
from engine.emulator import Emulator, ScriptedPolicy
from engine.emulator.server import EmulatorServer
from tests.support.factories import ConversationFactory, MessageFactory, RunFactory

MODEL = "gpt-4o"
PROMPT = {"type": "text", "text": "What does this screenshot show?"}


def png_block(width: int, height: int) -> dict:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (30, 90, 160)).save(buffer, format="PNG")
    data = base64.b64encode(buffer.getvalue()).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def answered_request(alice, image: dict) -> ModelRequest:
    conversation = ConversationFactory(owner=alice, model=MODEL)
    trigger = MessageFactory(conversation=conversation, content=[PROMPT, image], as_tip=True)
    run = RunFactory(conversation=conversation, trigger=trigger, provider="openai", model=MODEL)
    run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    return ModelRequest.objects.get(run=run)


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("CH-12")
def test_an_openai_run_and_its_context_view_estimate_an_image_as_the_provider_bills_it(settings, tmp_path, alice):
    settings.CC_MODELS = {**settings.CC_MODELS, MODEL: "openai"}
    settings.CC_WORKSPACE_ROOT = tmp_path
    with EmulatorServer(Emulator(policy=ScriptedPolicy(["A chart.", "A dot."]))) as server:
        settings.OPENAI_API_KEY, settings.OPENAI_BASE_URL = "test-key", f"{server.base_url}/v1"
        screenshot = answered_request(alice, png_block(1024, 1024))
        dot = answered_request(alice, png_block(8, 8))

    # 85 + 170 a 512 px tile: four tiles, one tile (the area rule said 1,399 and 1).
    assert screenshot.estimated_parts["images"] == 765
    assert dot.estimated_parts["images"] == 255
    # The two requests differ in their image alone: the provider measured the same difference.
    assert screenshot.prompt_tokens - dot.prompt_tokens == 765 - 255
    assert screenshot.estimated_tokens - dot.estimated_tokens == 765 - 255

    # The next request of the conversation, as the Context view shows it, counts the image the same way.
    view = context_view(conversation=screenshot.run.conversation)
    categories = {category["name"]: category["tokens"] for category in view["categories"]}
    assert categories["images"] == 765
