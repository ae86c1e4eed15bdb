"""A deleted conversation's workspace goes with it (SB-3: the quota counts live conversations)."""

from __future__ import annotations

import pytest

from agents.models import Run
from tests.support.factories import ConversationFactory, RunFactory
from toolcatalog import quota
from toolcatalog.builtins import WorkspaceToolBox
from toolcatalog.tools.base import ToolContext
from toolcatalog.workspace import workspace_root


def _filled(conversation_id: int, size: int = 300_000) -> None:
    (workspace_root(conversation_id) / "data.bin").write_bytes(b"x" * size)


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("SB-3")
def test_deleting_a_conversation_removes_its_files_so_the_quota_cannot_be_dodged(alice, alice_api, settings, tmp_path):
    # QA: fill a conversation to the quota, delete it (204), and write as much again in a new one:
    # 1.5 GB against a 1 GB quota, and the deleted conversation's files on disk for good.
    settings.CC_WORKSPACE_ROOT, settings.CC_WORKSPACE_QUOTA_MB = tmp_path / "workspaces", 1
    first = ConversationFactory(owner=alice)
    _filled(first.pk, 700_000)
    second = ConversationFactory(owner=alice)
    box = WorkspaceToolBox(workspace_root(second.pk), conversation_id=second.pk, user_id=alice.pk)
    refused = box.execute("write_file", {"path": "more.bin", "content": "y" * 500_000})
    assert refused["ok"] is False and "quota" in refused["error"]

    assert alice_api.delete(f"/api/conversations/{first.pk}/").status_code == 204

    assert not (tmp_path / "workspaces" / f"conversation-{first.pk}").exists()
    context = ToolContext(workspace_root(second.pk), second.pk, alice.pk)
    assert quota.remaining_bytes(context) > 900_000
    written = box.execute("write_file", {"path": "more.bin", "content": "y" * 500_000})
    assert written["ok"], written


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("SB-3")
def test_a_refused_deletion_keeps_the_files_and_a_deleted_user_takes_hers(alice, alice_api, settings, tmp_path):
    settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
    busy = RunFactory(conversation__owner=alice, status=Run.Status.RUNNING).conversation
    _filled(busy.pk)
    assert alice_api.delete(f"/api/conversations/{busy.pk}/").status_code == 409
    assert (workspace_root(busy.pk) / "data.bin").stat().st_size == 300_000

    Run.objects.filter(conversation=busy).update(status=Run.Status.SUCCEEDED)
    other = ConversationFactory(owner=alice)
    _filled(other.pk)
    alice.delete()
    assert list((tmp_path / "workspaces").iterdir()) == []
