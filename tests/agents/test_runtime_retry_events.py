"""A refused request asked again is said in the run's log as it happens (RN-2, UX-4)."""

from __future__ import annotations

import pytest

from agents.lifecycle import run_execute
from agents.models import ModelRequest, Run, RunEvent
from engine.emulator import Emulator, Fault, ScriptedPolicy
from engine.emulator.server import EmulatorServer
from tests.support.factories import RunFactory


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("RN-2")
def test_each_retried_refusal_is_a_model_retry_event_before_the_answer(settings, tmp_path, alice):
    # QA: a 429 and two 529s before a 200 left one row and nothing else: the wait was silence
    # on the page, and the run's log did not say the provider had refused it three times.
    emulator = Emulator(policy=ScriptedPolicy(["Answered at last."]))
    for fault in (Fault("rate_limit"), Fault("overloaded"), Fault("overloaded")):
        emulator.inject(fault)
    with EmulatorServer(emulator) as server:
        settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "test-key", server.base_url
        settings.CC_WORKSPACE_ROOT = tmp_path
        run = RunFactory(conversation__owner=alice, provider="anthropic", model="claude-sonnet-4-5")
        run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    events = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", "payload"))
    retries = [payload for kind, payload in events if kind == "model_retry"]
    assert [(item["step"], item["attempt"]) for item in retries] == [(1, 1), (1, 2), (1, 3)]
    assert "rate" in retries[0]["reason"].lower() and "overloaded" in retries[1]["reason"].lower()
    assert all(0 <= item["wait_seconds"] <= 8 for item in retries)
    kinds = [kind for kind, _payload in events]
    assert kinds.index("model_retry") < kinds.index("text_delta")
    # Refused before any answer, they were not taken: no request row of their own.
    assert list(ModelRequest.objects.filter(run=run).values_list("stop_reason", flat=True)) == ["end_turn"]
