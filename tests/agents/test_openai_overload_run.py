"""A gpt run whose stream is overloaded mid-answer succeeds, as a Claude run does (EM-3): the broken
attempt is recorded as a retried request, never reported as an internal error."""

from __future__ import annotations

import pytest

from agents.lifecycle import run_execute
from agents.models import ModelRequest, Run
from conversations.models import Message
from engine.emulator import Emulator, Fault, ScriptedPolicy
from engine.emulator.server import EmulatorServer
from tests.support.factories import RunFactory

ANSWER = "This is the whole answer, after one overload."


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("EM-3")
def test_a_gpt_run_overloaded_mid_stream_is_retried_and_succeeds(settings, tmp_path, alice):
    emulator = Emulator(policy=ScriptedPolicy([ANSWER]))
    emulator.inject(Fault("stream_overloaded", after_chars=10))
    with EmulatorServer(emulator) as server:
        settings.OPENAI_API_KEY, settings.OPENAI_BASE_URL = "test-key", f"{server.base_url}/v1"
        settings.CC_WORKSPACE_ROOT = tmp_path
        run = RunFactory(conversation__owner=alice, provider="openai", model="gpt-4o")
        run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert list(ModelRequest.objects.filter(run=run).values_list("step", "stop_reason")) == [
        (1, "retried"),
        (1, "end_turn"),
    ]
    (reply,) = Message.objects.filter(conversation=run.conversation, role=Message.Role.ASSISTANT)
    assert reply.content == [{"type": "text", "text": ANSWER}]  # "This is " once, not twice
