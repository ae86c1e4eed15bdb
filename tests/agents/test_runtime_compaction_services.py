"""Compaction past the first pass, end to end (CH-2, CH-4, CH-11, CH-12, CH-13).

A long session through the API in services mode: a real Celery worker, the Anthropic
adapter talking to the emulator over HTTP, a 20,000-token window and large `bash`
outputs. Every turn asks for a command, reads its output and answers, so the path grows
by about 1,700 tokens a turn and the runtime compacts again and again.

The emulator's window is the session's: a request past it is refused as "prompt is too
long", as a real provider would, and it counts snapshot pages by the documented formula,
as the runtime does.
"""

from __future__ import annotations

import copy
import hashlib
import time
import uuid
from typing import Any

import pytest
from django.db import connection

from agents.models import ModelRequest, Run
from agents.turns import CALIBRATION_REQUESTS
from controlcenter.processes import WorkerProcess, services_env
from conversations import selectors
from conversations.compaction import tail_budget
from conversations.models import Compaction, Conversation
from engine.context import ladder
from engine.context.calibration import calibration_from
from engine.context.snapshots import page_for_window
from engine.context.transcript import RequestCount, api_messages, request_tokens
from engine.emulator import Emulator
from engine.emulator.server import EmulatorServer
from engine.tokens import tool_prompt_tokens
from engine.window import budget_for_window

MODEL = "claude-sonnet-4-5"
WINDOW = 20_000
TURNS = 40
# A model's answers are prose the free rungs cannot shorten: only pages (or a summary) can.
NOTES = "What I checked, step by step, and what I would look at next before changing the build. " * 12
# The system prompt the API adds to a request with tools (EM-2): part of every request's count.
TOOL_PROMPT = tool_prompt_tokens("anthropic", MODEL)
STUBS = ("[elided", "[snapshot", "[image dropped")


class Script:
    """Stateless: a prompt gets a `bash` call with a large output, its result gets an answer."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []

    def __call__(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        self.payloads.append(copy.deepcopy(payload))
        last = payload["messages"][-1]["content"]
        if isinstance(last, list) and any(block.get("type") == "tool_result" for block in last):
            return [{"type": "text", "text": "The command ran; its output is above. " + NOTES}]
        return [{"type": "tool_use", "name": "bash", "input": {"command": "seq -f 'build log line %g: ok' 1 220"}}]


@pytest.fixture(scope="module")
def model_server():
    script = Script()
    with EmulatorServer(Emulator(policy=script, context_window=WINDOW)) as server:
        server.script = script
        yield server


@pytest.fixture
def worker(model_server, settings, tmp_path):
    if settings.CC_MODE != "services":
        pytest.fail("this test needs DATABASE_URL and REDIS_URL (a real Celery worker)")
    settings.CC_RUN_QUEUE = f"compaction-{uuid.uuid4().hex[:8]}"
    settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.CC_MODELS = {**settings.CC_MODELS, MODEL: "anthropic"}
    settings.CC_CONTEXT_WINDOW_TOKENS = WINDOW
    env = services_env(connection.settings_dict["NAME"])
    env.update(
        ANTHROPIC_API_KEY="test-key",
        ANTHROPIC_BASE_URL=model_server.base_url,
        CC_MODELS=f"{MODEL}=anthropic",
        CC_WORKSPACE_ROOT=str(settings.CC_WORKSPACE_ROOT),
        CC_RUN_QUEUE=settings.CC_RUN_QUEUE,
        CC_CONTEXT_WINDOW_TOKENS=str(WINDOW),
        CC_TOOL_AUTO_APPROVE="bash",
        # Outputs stay inline, so the history grows the way the sessions did.
        SCRATCHPAD_THRESHOLD_BYTES="100000",
    )
    process = WorkerProcess(env, f"compaction-{uuid.uuid4().hex[:6]}@%h", tmp_path / "w.log")
    process.wait_ready(timeout=90)  # a loaded machine
    yield process
    process.stop()


def _wait(run_id: int) -> Run:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        run = Run.objects.get(pk=run_id)
        if run.is_finished:
            return run
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not finish")


def _pages(view: list[dict[str, Any]]) -> list[str]:
    return [
        hashlib.sha256(block["source"]["data"].encode()).hexdigest()
        for message in view
        for block in message["content"]
        if isinstance(block, dict) and block.get("type") == "image"
    ]


def _texts(message: dict[str, Any]) -> list[str]:
    content = message["content"]
    if isinstance(content, str):
        return [content]
    return [block.get("text", "") for block in content if block.get("type") == "text"]


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
@pytest.mark.req("CH-2")
@pytest.mark.req("CH-4")
@pytest.mark.req("CH-11")
@pytest.mark.req("CH-12")
@pytest.mark.req("CH-13")
def test_a_long_session_keeps_compacting_from_the_stored_messages(worker, model_server, alice, alice_api):
    script = model_server.script
    conversation = Conversation.objects.create(owner=alice, title="long session", model=MODEL)
    url = f"/api/conversations/{conversation.pk}/messages/"
    first_payload = len(script.payloads)
    runs = []
    for turn in range(TURNS):
        response = alice_api.post(url, {"text": f"Step {turn}: run the build and tell me what it printed."})
        assert response.status_code == 201, response.json()
        runs.append(_wait(response.json()["run"]["id"]))
    assert [run.status for run in runs] == [Run.Status.SUCCEEDED] * TURNS, [run.error for run in runs]

    # Every request the runtime sent fits the window by its own whole-request count (CH-12),
    # and the question of its turn is text in it, never only on a page (CH-13).
    payloads = script.payloads[first_payload:]
    assert len(payloads) == 2 * TURNS
    for index, payload in enumerate(payloads):
        estimate = request_tokens(payload["system"], payload["tools"], payload["messages"], tool_prompt=TOOL_PROMPT)
        assert estimate <= WINDOW, (index, estimate)
        question = f"Step {index // 2}: run the build"
        assert any(question in text for message in payload["messages"] for text in _texts(message)), index

    # The runtime records its own count of every request beside the provider's, and calibrated by
    # the requests before it, it lands within 3 % (CH-12), pages included.
    requests = list(ModelRequest.objects.filter(run__in=runs).order_by("id"))
    assert len(requests) == len(payloads) and all(r.estimated_tokens > 0 for r in requests)
    assert all(r.prompt_tokens <= WINDOW for r in requests)
    measured = [(RequestCount.from_dict(r.estimated_parts), r.prompt_tokens) for r in requests]
    errors = []
    for index in range(1, len(measured)):
        count, prompt_tokens = measured[index]
        calibrated = calibration_from(measured[max(0, index - CALIBRATION_REQUESTS) : index]).tokens(count)
        errors.append(abs(calibrated - prompt_tokens) / prompt_tokens)
    assert len(errors) == len(requests) - 1 and max(errors) <= 0.03, sorted(errors)[-5:]

    # The runtime passed the threshold several times; each pass was worth recording (CH-11).
    compactions = list(Compaction.objects.filter(conversation=conversation).order_by("id"))
    assert len(compactions) >= 2
    assert len(compactions) < TURNS // 2  # not a no-op pass on every turn
    assert all(c.trigger == "proactive" and c.run_id is not None for c in compactions)

    # Each view is what a fresh pass over the stored messages gives (idempotent, rendered from the
    # source text, CH-4): never the previous view's pages or its frozen tail stacked on top.
    for earlier, compaction in zip([None, *compactions], compactions, strict=False):
        path = selectors.path_to(conversation_id=conversation.pk, tip_id=compaction.tip_id)
        source = selectors.source_of_path(conversation_id=conversation.pk, path=path)
        fresh = ladder.compact(
            source,
            rungs=("elide", "drop_images", "snapshot"),
            target_tokens=compaction.target_tokens,
            tail_tokens=tail_budget(compaction.target_tokens),
            # The worker's pages are sized to its window (LM-2).
            shape=page_for_window(budget_for_window(WINDOW).page_pixels),
        )
        assert api_messages(fresh.messages) == compaction.view, f"compaction {compaction.pk} is not from the source"
        if earlier is not None and _pages(earlier.view) and _pages(compaction.view):
            # The source grew between the passes, so the pages changed with it.
            assert _pages(compaction.view) != _pages(earlier.view)
        # Stubs and page headers name the stored messages they stand for.
        stubs = [text for message in compaction.view for text in _texts(message) if text.startswith(STUBS)]
        stubs += [
            block["content"]
            for message in compaction.view
            for block in message["content"]
            if block.get("type") == "tool_result" and isinstance(block.get("content"), str)
            and block["content"].startswith(STUBS)
        ]  # fmt: skip
        assert stubs and all("#" in stub for stub in stubs), stubs
    assert any(_pages(c.view) for c in compactions)  # the snapshot rung ran at least once
