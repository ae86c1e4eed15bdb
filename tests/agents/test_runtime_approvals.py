"""Tool approvals (RN-4): a run pauses in the database, a person decides, any worker resumes it."""

from __future__ import annotations

import json
import uuid

import pytest
from django.db import connection

from agents.lifecycle import run_execute
from agents.models import Approval, Run, RunEvent
from controlcenter.processes import WorkerProcess, services_env
from conversations.models import Conversation, Message
from engine.emulator import Emulator, ScriptedPolicy
from engine.emulator.server import EmulatorServer
from tests.support.catalog import CATALOG_PATH
from tests.support.waiting import run_in
from toolcatalog.models import ToolActivation
from toolcatalog.services import catalog_import
from toolcatalog.workspace import workspace_root

MODEL = "claude-sonnet-4-5"
BASH = {"type": "tool_use", "name": "bash", "input": {"command": "echo approved > proof.txt"}}


@pytest.fixture
def model_server(settings, tmp_path):
    """The emulator over HTTP, scripted to call bash once and then finish; runs use the Anthropic adapter."""
    emulator = Emulator(policy=ScriptedPolicy([[BASH], "Done with the shell."]))
    with EmulatorServer(emulator) as server:
        # A queue of its own: the session's shared worker has no key for the emulator.
        settings.CC_RUN_QUEUE = f"runtime-test-{uuid.uuid4().hex[:8]}"
        settings.ANTHROPIC_API_KEY = "test-key"
        settings.ANTHROPIC_BASE_URL = server.base_url
        settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
        settings.CC_TOOL_AUTO_APPROVE = []
        yield server


def make_run(owner) -> Run:
    conversation = Conversation.objects.create(owner=owner, title="approvals")
    trigger = Message.objects.create(
        conversation=conversation, role="user", content=[{"type": "text", "text": "write the proof file"}]
    )
    conversation.tip = trigger
    conversation.save()
    return Run.objects.create(conversation=conversation, trigger=trigger, provider="anthropic", model=MODEL)


wait_for = run_in


def transcript(run: Run) -> list[Message]:
    return list(Message.objects.filter(conversation=run.conversation).order_by("id"))


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("RN-4")
def test_a_call_that_requires_approval_pauses_the_run_outside_the_transcript_and_a_denial_resumes_it(
    model_server, alice, alice_api, bob_api
):
    run = make_run(alice)
    run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING
    approval = Approval.objects.get(run=run)
    assert (approval.tool_name, approval.input, approval.status) == ("bash", BASH["input"], "pending")
    # The partial turn is on the run; the transcript still ends at the trigger (CH-5).
    assert [m["role"] for m in run.pending_turn["messages"]] == ["assistant"]
    assert len(transcript(run)) == 1
    requested = RunEvent.objects.get(run=run, type="approval_requested").payload
    assert requested == {
        "approval_id": approval.pk,
        "tool_use_id": approval.tool_use_id,
        "name": "bash",
        "input": BASH["input"],
    }
    busy = alice_api.post(f"/api/conversations/{run.conversation_id}/messages/", {"text": "more"}, format="json")
    assert busy.status_code == 409  # a waiting run is still in flight
    listed = alice_api.get(f"/api/runs/{run.pk}/approvals/").json()
    assert [(a["id"], a["status"]) for a in listed] == [(approval.pk, "pending")]

    assert bob_api.post(f"/api/approvals/{approval.pk}/deny/").status_code == 404
    assert bob_api.get(f"/api/runs/{run.pk}/approvals/").status_code == 404
    approval.refresh_from_db()
    assert approval.status == "pending"  # bob's attempt changed nothing

    response = alice_api.post(f"/api/approvals/{approval.pk}/deny/")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "denied" and response.json()["decided_by"] == "alice"
    again = alice_api.post(f"/api/approvals/{approval.pk}/approve/")
    assert again.status_code == 409
    approval.refresh_from_db()
    assert approval.status == "denied"
    assert RunEvent.objects.get(run=run, type="approval_decided").payload == {
        "approval_id": approval.pk,
        "decision": "denied",
    }

    run_execute(run_id=run.pk, worker="test")  # whatever executes runs in this mode may have claimed it first
    run = wait_for(run, {Run.Status.SUCCEEDED, Run.Status.FAILED})
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert run.pending_turn is None
    messages = transcript(run)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    result = json.loads(messages[2].content[0]["content"])
    assert result["denied"] is True and "denied" in result["error"]
    assert not (workspace_root(run.conversation_id) / "proof.txt").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("TD-15")
@pytest.mark.req("TS-3")
def test_a_deferred_tool_loaded_before_an_approval_pause_is_recorded_once(settings, tmp_path, alice, alice_api):
    # What the resident-set recommendation counts: a load before a pause used to be lost.
    catalog_import(text=CATALOG_PATH.read_text())
    remember = {"type": "tool_use", "name": "save_memory", "input": {"content": "The proof goes in proof.txt."}}
    with EmulatorServer(Emulator(policy=ScriptedPolicy([[remember], [BASH], "Done."]))) as server:
        settings.CC_RUN_QUEUE = f"runtime-test-{uuid.uuid4().hex[:8]}"
        settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "test-key", server.base_url
        settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
        settings.CC_TOOL_AUTO_APPROVE = []
        run = make_run(alice)
        run_execute(run_id=run.pk, worker="test")
        run.refresh_from_db()
        assert run.status == Run.Status.WAITING
        loaded = ToolActivation.objects.filter(run=run)
        assert list(loaded.values_list("tool_name", "trigger")) == [("save_memory", "direct")]
        approval = Approval.objects.get(run=run)
        assert alice_api.post(f"/api/approvals/{approval.pk}/approve/").status_code == 200
        run_execute(run_id=run.pk, worker="test")
        run = wait_for(run, {Run.Status.SUCCEEDED, Run.Status.FAILED})
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert list(loaded.values_list("tool_name", "trigger")) == [("save_memory", "direct")]


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("RN-4")
def test_deciding_an_unknown_approval_is_a_404_and_a_cancelled_run_cannot_be_approved(model_server, alice, alice_api):
    assert alice_api.post("/api/approvals/999999/approve/").status_code == 404
    run = make_run(alice)
    run_execute(run_id=run.pk, worker="test")
    approval = Approval.objects.get(run=run)
    assert alice_api.post(f"/api/runs/{run.pk}/cancel/").json()["status"] == "cancelled"
    late = alice_api.post(f"/api/approvals/{approval.pk}/approve/")
    assert late.status_code == 409 and "expired" in late.json()["error"]["message"]
    # Nobody waits for it any more: it is closed, not left pending forever.
    approval.refresh_from_db()
    assert approval.status == "expired" and approval.decided_by is None
    pending = alice_api.get(f"/api/conversations/{run.conversation_id}/approvals/", {"status": "pending"}).json()
    assert pending == [] or pending.get("results") == []


def worker_env(model_server, tmp_path) -> dict[str, str]:
    from django.conf import settings

    env = services_env(connection.settings_dict["NAME"])
    env.update(
        ANTHROPIC_API_KEY="test-key",
        ANTHROPIC_BASE_URL=model_server.base_url,
        CC_WORKSPACE_ROOT=str(settings.CC_WORKSPACE_ROOT),
        CC_RUN_QUEUE=settings.CC_RUN_QUEUE,
    )
    return env


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
@pytest.mark.req("RN-4")
def test_an_approval_pending_across_a_worker_restart_is_resumed_by_the_new_worker(
    model_server, alice, alice_api, tmp_path
):
    from django.conf import settings

    if settings.CC_MODE != "services":
        pytest.fail("this test needs DATABASE_URL and REDIS_URL (a real Celery worker)")
    from agents.lifecycle import enqueue_run

    env = worker_env(model_server, tmp_path)
    first = WorkerProcess(env, f"first-{uuid.uuid4().hex[:6]}@%h", tmp_path / "first.log")
    try:
        first.wait_ready()
        run = make_run(alice)
        enqueue_run(run.pk)
        run = wait_for(run, {Run.Status.WAITING, Run.Status.FAILED})
        assert run.status == Run.Status.WAITING, run.error
        assert run.worker.startswith("first-")
    finally:
        first.stop()
    assert first.process.poll() is not None

    second = WorkerProcess(env, f"second-{uuid.uuid4().hex[:6]}@%h", tmp_path / "second.log")
    try:
        second.wait_ready()
        approval = Approval.objects.get(run=run)
        assert alice_api.post(f"/api/approvals/{approval.pk}/approve/").status_code == 200
        run = wait_for(run, {Run.Status.SUCCEEDED, Run.Status.FAILED})
    finally:
        second.stop()
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert run.worker.startswith("second-")
    assert (workspace_root(run.conversation_id) / "proof.txt").read_text() == "approved\n"
    messages = transcript(run)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert json.loads(messages[2].content[0]["content"])["ok"] is True
    assert messages[3].content == [{"type": "text", "text": "Done with the shell."}]
    types = list(RunEvent.objects.filter(run=run).values_list("type", flat=True))
    assert types.count("run_started") == 2 and "approval_requested" in types and "approval_decided" in types


@pytest.fixture
def referencing_model_server(settings, tmp_path):
    """The emulator scripted to list the workspace, then ask for a bash call that references that step."""
    listing = {"type": "tool_use", "name": "list_dir", "input": {"path": "."}}
    shell = {"type": "tool_use", "name": "bash", "input": {"command": "echo {{step1.path}}/x > proof.txt"}}
    emulator = Emulator(policy=ScriptedPolicy([[listing], [shell], "Done with the shell."]))
    with EmulatorServer(emulator) as server:
        settings.CC_RUN_QUEUE = f"runtime-test-{uuid.uuid4().hex[:8]}"
        settings.ANTHROPIC_API_KEY = "test-key"
        settings.ANTHROPIC_BASE_URL = server.base_url
        settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
        settings.CC_TOOL_AUTO_APPROVE = []
        yield server


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("SB-5")
def test_the_approval_shows_resolved_references_and_they_still_resolve_when_the_run_resumes(
    referencing_model_server, alice, alice_api
):
    run = make_run(alice)
    run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING
    resolved = {"command": "echo ./x > proof.txt"}
    listed = alice_api.get(f"/api/runs/{run.pk}/approvals/").json()
    assert [a["input"] for a in listed] == [resolved]
    requested = RunEvent.objects.get(run=run, type="approval_requested").payload
    assert requested["input"] == resolved
    assert requested["requested_input"] == {"command": "echo {{step1.path}}/x > proof.txt"}

    assert alice_api.post(f"/api/approvals/{listed[0]['id']}/approve/").status_code == 200
    run_execute(run_id=run.pk, worker="test")  # a new toolbox, as on another worker
    run = wait_for(run, {Run.Status.SUCCEEDED, Run.Status.FAILED})
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert (workspace_root(run.conversation_id) / "proof.txt").read_text() == "./x\n"
