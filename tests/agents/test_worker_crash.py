"""A worker killed mid-turn leaves the previous turn intact, the run retryable, and a retry completes (CH-5)."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

from agents.models import ModelRequest, Run
from controlcenter.processes import WorkerProcess, services_env
from conversations.models import Conversation, Message
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


_wait = wait_until


@pytest.fixture
def start_worker(celery_worker_process, tmp_path):
    """Extra real workers that may run the shell without a person approving, with a fast heartbeat."""
    started: list[WorkerProcess] = []

    def start() -> WorkerProcess:
        env = services_env(connection.settings_dict["NAME"])
        env.update(CC_TOOL_AUTO_APPROVE="bash", CC_WORKER_HEARTBEAT_SECONDS="1")
        worker = WorkerProcess(env, f"crash-{uuid.uuid4().hex[:6]}@%h", tmp_path / f"worker-{len(started)}.log")
        worker.wait_ready()
        started.append(worker)
        return worker

    # The session worker would also pick up the run; this test needs to know who runs it.
    celery_worker_process.stop()
    try:
        yield start
    finally:
        for worker in started:
            worker.stop()
        celery_worker_process.start()
        celery_worker_process.wait_ready()


@pytest.mark.req("CH-5")
def test_sigkill_mid_turn_keeps_the_previous_turn_and_a_retry_completes(start_worker, alice, alice_api):
    conversation = Conversation.objects.create(owner=alice, title="crash")
    question = Message.objects.create(conversation=conversation, role="user", content=[{"type": "text", "text": "hi"}])
    answer = Message.objects.create(
        conversation=conversation, parent=question, role="assistant", content=[{"type": "text", "text": "hello"}]
    )
    conversation.tip = answer
    conversation.save()
    first = start_worker()

    sent = alice_api.post(
        f"/api/conversations/{conversation.pk}/messages/", {"text": "please run `sleep 3; echo done`"}, format="json"
    ).json()
    run_id = sent["run"]["id"]
    # The call streamed and its request was stored (the reply is whole): the command runs now.
    _wait(lambda: ModelRequest.objects.filter(run_id=run_id).exists(), 20, "the tool call's request")
    first.kill()  # SIGKILL the whole worker while `sleep` runs: mid-turn

    # Nothing of the interrupted turn is stored: the path ends at the user message.
    ids = list(Message.objects.filter(conversation=conversation).order_by("id").values_list("id", flat=True))
    assert ids == [question.pk, answer.pk, sent["message"]["id"]]
    assert Run.objects.get(pk=run_id).status == Run.Status.RUNNING
    # The request that asked for the call was paid for: it is recorded though its turn is lost.
    assert list(ModelRequest.objects.filter(run_id=run_id).values_list("step", flat=True)) == [1]

    second = start_worker()  # its heartbeat notices the dead worker and fails the run as retryable
    run = _wait(lambda: Run.objects.filter(pk=run_id, status=Run.Status.FAILED).first(), 20, "the orphaned run to fail")
    assert run.retryable
    assert "stopped before the turn ended" in run.error
    detail = alice_api.get(f"/api/runs/{run_id}/").json()
    assert detail["retryable"] is True

    retried = alice_api.post(f"/api/runs/{run_id}/retry/")
    assert retried.status_code == 201, retried.content
    retry_id = retried.json()["id"]
    done = _wait(lambda: Run.objects.filter(pk=retry_id).exclude(status__in=["queued", "running"]).first(), 30, "retry")
    assert done.status == Run.Status.SUCCEEDED, done.error
    assert done.worker.startswith(second.hostname.split("@")[0])

    path = list(Message.objects.filter(conversation=conversation).order_by("id"))
    assert [m.role for m in path] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert path[4].content[0]["type"] == "tool_result" and "done" in path[4].content[0]["content"]
    conversation.refresh_from_db()
    assert conversation.tip_id == path[-1].pk


def test_retry_of_a_succeeded_or_running_run_is_refused_and_changes_nothing(alice, alice_api):
    conversation = Conversation.objects.create(owner=alice, title="no retry")
    trigger = Message.objects.create(conversation=conversation, role="user", content=[{"type": "text", "text": "x"}])
    run = Run.objects.create(
        conversation=conversation, trigger=trigger, provider="offline", model="m", status=Run.Status.SUCCEEDED
    )
    response = alice_api.post(f"/api/runs/{run.pk}/retry/")
    assert response.status_code == 409
    assert "only a failed or cancelled run" in response.json()["error"]["message"]
    assert Run.objects.count() == 1


@pytest.mark.req("CH-5", "CH-7")
def test_a_run_retried_after_the_conversation_moved_on_answers_on_the_path(celery_worker_process, alice, alice_api):
    """QA: the reply of such a retry went on a branch off the path, and the tip stayed where it was."""
    conversation = Conversation.objects.create(owner=alice, title="moved on")
    prompt = Message.objects.create(conversation=conversation, role="user", content=[{"type": "text", "text": "first"}])
    failed = Run.objects.create(
        conversation=conversation, trigger=prompt, provider="offline", model="offline-1", status=Run.Status.FAILED
    )
    later = Message.objects.create(
        conversation=conversation, parent=prompt, role="user", content=[{"type": "text", "text": "second"}]
    )
    answer = Message.objects.create(
        conversation=conversation, parent=later, role="assistant", content=[{"type": "text", "text": "answered"}]
    )
    Conversation.objects.filter(pk=conversation.pk).update(tip=answer)

    retried = alice_api.post(f"/api/runs/{failed.pk}/retry/")
    assert retried.status_code == 201, retried.content
    conversation.refresh_from_db()
    assert conversation.tip_id == prompt.pk  # as Regenerate: the path now ends at what the retry answers
    done = _wait(lambda: Run.objects.filter(pk=retried.json()["id"], status="succeeded").first(), 30, "the retry")
    reply = Message.objects.filter(conversation=conversation, parent=prompt, role="assistant").get()
    conversation.refresh_from_db()
    assert conversation.tip_id == reply.pk and done.trigger_id == prompt.pk
    assert Message.objects.filter(pk__in=[later.pk, answer.pk]).count() == 2  # the other branch stays
