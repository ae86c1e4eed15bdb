"""The runtime's toolbox: one run of the offline model lists the conversation's own workspace (RN-5)."""

from __future__ import annotations

import pytest

from agents.chat import message_send
from agents.lifecycle import run_execute
from agents.models import Run
from conversations.models import Message
from conversations.services import conversation_create
from toolcatalog.workspace import workspace_root

pytestmark = pytest.mark.django_db


@pytest.mark.req("RN-5")
def test_a_run_lists_its_own_conversation_workspace(alice, bob, settings, tmp_path):
    settings.CC_WORKSPACE_ROOT = tmp_path
    mine = conversation_create(owner=alice, title="mine")
    other = conversation_create(owner=bob, title="other")
    (workspace_root(mine.pk) / "report.md").write_text("# hi\n")
    (workspace_root(other.pk) / "bobs-secret.txt").write_text("x")
    _, run = message_send(conversation=mine, text="Which files are in the workspace?")
    run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    results = [
        block
        for message in Message.objects.filter(conversation=mine, role="user")
        for block in message.content
        if block.get("type") == "tool_result"
    ]
    assert len(results) == 1 and '"name": "report.md"' in results[0]["content"]
    reply = Message.objects.filter(conversation=mine, role="assistant").order_by("-id").first()
    assert "report.md" in reply.content[0]["text"]
    assert "bobs-secret" not in reply.content[0]["text"]
