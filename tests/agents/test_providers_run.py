"""A whole run on the offline model records the usage the emulator's cache accounts."""

from __future__ import annotations

import pytest

from agents.chat import message_send
from agents.lifecycle import run_execute
from agents.models import ModelRequest, Run
from conversations.services import conversation_create
from tests.support.waiting import run_finished


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("RN-2")
def test_offline_run_records_the_usage_the_emulator_accounts(alice, settings, tmp_path):
    settings.CC_WORKSPACE_ROOT = tmp_path
    conversation = conversation_create(owner=alice, title="usage")
    _, run = message_send(conversation=conversation, text="which files are in the workspace?")
    # Whatever executes runs in this mode may already have claimed it; otherwise this does.
    run_execute(run_id=run.pk, worker="test")
    run = run_finished(run.pk)
    assert run.status == Run.Status.SUCCEEDED, run.error
    requests = list(ModelRequest.objects.filter(run=run).order_by("step"))
    assert len(requests) == 2  # the list_dir call, then the reply
    for request in requests:
        assert request.prompt_tokens > 0
        assert request.output_tokens > 0
    # The runtime places the TD-13 markers; the second request reads what the first wrote.
    assert all("system" in r.breakpoints and "current_turn" in r.breakpoints for r in requests)
    assert requests[1].cache_read_input_tokens > 0
