"""Cancel means stop (OP-3): the tool's processes die, the run ends cancelled, the transcript stays valid.

One real Celery worker and the emulator over HTTP (Anthropic adapter) serve the whole module;
the emulator refuses an invalid request (a tool_use without its tool_result, say) with a 400,
so every request it records is one the provider accepted.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection, transaction
from django.utils import timezone

from agents import approvals, heartbeat
from agents.lifecycle import enqueue_run, run_execute
from agents.models import Approval, ModelRequest, Run, RunEvent, Subagent
from agents.services import compaction_start, run_cancel
from controlcenter.processes import WorkerProcess, services_env
from conversations.models import Compaction, Conversation, Message
from engine.emulator import Emulator
from engine.emulator.server import EmulatorServer
from tests.support.history import add_turn
from tests.support.timing import scaled
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

MODEL = "claude-sonnet-4-5"
# Writes a numbered line every 0.1 s for 30 s: whether it still runs shows in the file.
TICKING = "for i in $(seq 1 300); do echo $i; echo $i >> {file}; sleep 0.1; done"
RECEIVED: list[dict[str, Any]] = []


def _last_text(payload: dict[str, Any]) -> str:
    content = payload["messages"][-1]["content"]
    blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
    texts = [block["text"] for block in blocks if block.get("type") == "text"]
    return texts[-1] if texts else ""


def policy(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The parent ticks, fans out or asks for bash by its prompt; a child ticks; after a result, text."""
    RECEIVED.append(payload)
    child = "subagent" in payload["system"][0]["text"]
    text = _last_text(payload)
    if not text:  # the last message holds tool results only
        return [{"type": "text", "text": "Done."}]
    if text.startswith("Summarize this part"):  # a compaction's summary call
        return [{"type": "text", "text": "The conversation so far: " + "a finding was made, " * 80}]
    if child:
        return [{"type": "tool_use", "name": "bash", "input": {"command": TICKING.format(file="child-ticks.txt")}}]
    if "tick" in text:
        return [{"type": "tool_use", "name": "bash", "input": {"command": TICKING.format(file="ticks.txt")}}]
    if "fan out" in text:
        return [{"type": "tool_use", "name": "spawn_agents", "input": {"tasks": ["count in the workspace"]}}]
    if "story" in text:
        return [{"type": "text", "text": "Once upon a time " + "and then it went on " * 60 + "the end."}]
    if "proof" in text:
        return [{"type": "tool_use", "name": "bash", "input": {"command": "echo approved > proof.txt"}}]
    return [{"type": "text", "text": "Noted."}]


@pytest.fixture(scope="module")
def cancel_worker(django_db_setup, django_db_blocker, tmp_path_factory):
    """The emulator and one worker on a queue of its own (the session's worker has no key for it)."""
    from django.db import connection

    with django_db_blocker.unblock():
        name = connection.settings_dict["NAME"]
    root = tmp_path_factory.mktemp("cancel")
    server = EmulatorServer(Emulator(policy=policy)).start()
    queue = f"cancel-test-{uuid.uuid4().hex[:8]}"
    env = services_env(name)
    env.update(
        ANTHROPIC_API_KEY="test-key",
        ANTHROPIC_BASE_URL=server.base_url,
        CC_WORKSPACE_ROOT=str(root / "workspaces"),
        CC_RUN_QUEUE=queue,
        CC_TOOL_AUTO_APPROVE="bash",
    )
    worker = WorkerProcess(env, f"cancel-{uuid.uuid4().hex[:6]}@%h", root / "worker.log", concurrency=4)
    try:
        worker.wait_ready()
        yield {"server": server, "queue": queue, "root": root / "workspaces"}
    finally:
        worker.stop()
        server.stop()


@pytest.fixture
def setup(cancel_worker, settings):
    settings.CC_RUN_QUEUE = cancel_worker["queue"]
    settings.CC_WORKSPACE_ROOT = cancel_worker["root"]
    settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "test-key", cancel_worker["server"].base_url
    settings.CC_MODELS = {**settings.CC_MODELS, MODEL: "anthropic"}
    settings.CC_TOOL_AUTO_APPROVE = []  # for runs executed in this process: bash waits for a person
    RECEIVED.clear()
    return cancel_worker


@contextlib.contextmanager
def beating(name: str) -> Iterator[None]:
    """This process beats as a worker while it runs a turn itself."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            heartbeat.beat(heartbeat.redis_client(), name)
            stop.wait(heartbeat.interval_seconds())

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def make_run(owner, text: str) -> Run:
    conversation = Conversation.objects.create(owner=owner, title="cancel", model=MODEL)
    trigger = Message.objects.create(conversation=conversation, role="user", content=[{"type": "text", "text": text}])
    conversation.tip = trigger
    conversation.save()
    return Run.objects.create(conversation=conversation, trigger=trigger, provider="anthropic", model=MODEL)


def ticks(root: Path, run: Run, name: str) -> int:
    path = root / f"conversation-{run.conversation_id}" / name
    return len(path.read_text().split()) if path.exists() else 0


def stopped_writing(root: Path, run: Run, name: str) -> bool:
    before = ticks(root, run, name)
    time.sleep(0.5)
    return ticks(root, run, name) == before


def cancelled(run: Run) -> Run:
    return wait_until(
        lambda: Run.objects.filter(pk=run.pk, status=Run.Status.CANCELLED).first(), 10, "the run to end cancelled"
    )


def timeline(run: Run, asked: datetime) -> list[tuple[str, float]]:
    """The run's events after the cancel, in seconds since it (for a failure's message)."""
    events = RunEvent.objects.filter(run=run, created_at__gte=asked).order_by("seq")
    return [(event.type, seconds_since(asked, event.created_at)) for event in events]


def seconds_since(asked: datetime, finished_at: datetime) -> float:
    # Measured on the database's clock of the same host: the test's own polling on a busy machine does not count.
    return (finished_at - asked).total_seconds()


def _run_finished(run: Run) -> dict[str, Any]:
    """The run_finished event's payload: the worker stores the run's end, then publishes the event,
    a moment apart (CI once read the event between the two)."""
    event = wait_until(lambda: RunEvent.objects.filter(run=run, type="run_finished").first(), 10, "run_finished")
    return event.payload


def path_of(conversation_id: int) -> list[Message]:
    tip = Conversation.objects.get(pk=conversation_id).tip
    path = []
    while tip is not None:
        path.append(tip)
        tip = tip.parent
    return path[::-1]


@pytest.mark.req("OP-3")
def test_a_cancelled_command_ends_the_run_and_its_partial_output_is_a_cancelled_result_the_next_turn_sends(
    setup, alice, alice_api
):
    run = make_run(alice, "please tick")
    enqueue_run(run.pk)
    wait_until(lambda: ticks(setup["root"], run, "ticks.txt") >= 5, 60, "the command to start writing")

    at_cancel, asked = ticks(setup["root"], run, "ticks.txt"), timezone.now()
    run_cancel(run=run)  # what POST /api/runs/<id>/cancel/ calls (an in-process request takes seconds on a busy host)
    assert seconds_since(asked, cancelled(run).finished_at) < scaled(2.0), timeline(run, asked)
    assert stopped_writing(setup["root"], run, "ticks.txt"), "the command outlived its run"
    # At most 10 ticks a second: more than 10 after the cancel would mean it lived longer than 1 s.
    assert ticks(setup["root"], run, "ticks.txt") - at_cancel <= 10

    # The transcript keeps the call and its partial output, marked cancelled; the tip moved there.
    prompt, call, result = path_of(run.conversation_id)
    assert (prompt.pk, call.role, result.role) == (run.trigger_id, "assistant", "user")
    [tool_use] = [block for block in call.content if block["type"] == "tool_use"]
    [closed] = result.content
    assert closed["tool_use_id"] == tool_use["id"] and closed["is_error"] is True
    output = json.loads(closed["content"])
    assert output["cancelled"] is True and output["stdout"].startswith("1\n2\n3\n")
    finished = _run_finished(run)
    assert finished == {"status": "cancelled", "error": "", "message_id": result.pk}

    # The next message's request carries the cancelled result, and the provider accepts it.
    sent = alice_api.post(
        f"/api/conversations/{run.conversation_id}/messages/", {"text": "what happened?"}, format="json"
    )
    assert sent.status_code == 201, sent.content
    nxt = wait_until(lambda: Run.objects.filter(pk=sent.json()["run"]["id"], status="succeeded").first(), 30, "a reply")
    assert nxt.error == ""
    request = RECEIVED[-1]
    assert _last_text(request) == "what happened?"
    results = [
        b for m in request["messages"] for b in m["content"] if isinstance(b, dict) and b["type"] == "tool_result"
    ]
    assert [b["tool_use_id"] for b in results] == [tool_use["id"]]
    assert json.loads(results[0]["content"])["cancelled"] is True


@pytest.mark.req("OP-3")
def test_cancelling_a_parent_kills_its_childs_command_and_both_end_cancelled(setup, alice, alice_api):
    run = make_run(alice, "fan out please")
    enqueue_run(run.pk)
    wait_until(lambda: ticks(setup["root"], run, "child-ticks.txt") >= 5, 60, "the child's command to start writing")

    at_cancel, asked = ticks(setup["root"], run, "child-ticks.txt"), timezone.now()
    run_cancel(run=run)
    assert seconds_since(asked, cancelled(run).finished_at) < scaled(2.0), timeline(run, asked)
    child = wait_until(lambda: Subagent.objects.filter(parent=run, status=Run.Status.CANCELLED).first(), 10, "a child")
    assert seconds_since(asked, child.finished_at) < scaled(2.0)
    assert stopped_writing(setup["root"], run, "child-ticks.txt"), "the child's command outlived its run"
    assert ticks(setup["root"], run, "child-ticks.txt") - at_cancel <= 10  # it died within 1 s

    # The parent's turn is kept: spawn_agents answered by the cancelled fan-out.
    _prompt, call, result = path_of(run.conversation_id)
    assert [b["name"] for b in call.content if b["type"] == "tool_use"] == ["spawn_agents"]
    observation = json.loads(result.content[0]["content"])
    assert observation["cancelled"] is True and observation["results"][0]["ok"] is False


@pytest.mark.req("OP-3")
def test_cancelling_a_run_waiting_for_approval_closes_the_approval_and_nothing_runs_later(setup, alice, alice_api):
    run = make_run(alice, "write the proof file")
    with beating("test-cancel@host"):  # alive, for the module worker's reaper
        run_execute(run.pk, worker="test-cancel@host")  # here, where bash waits for a person
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING, run.error
    approval = Approval.objects.get(run=run)

    assert alice_api.post(f"/api/runs/{run.pk}/cancel/").status_code == 200
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED and run.pending_turn is None
    approval.refresh_from_db()
    assert approval.status == Approval.Status.EXPIRED
    late = alice_api.post(f"/api/approvals/{approval.pk}/approve/")
    assert late.status_code == 409, late.content

    # The call it waited for is closed in the transcript as cancelled, never run.
    _prompt, call, result = path_of(run.conversation_id)
    assert result.content[0]["tool_use_id"] == call.content[-1]["id"] == approval.tool_use_id
    assert json.loads(result.content[0]["content"])["cancelled"] is True
    sent = alice_api.post(f"/api/conversations/{run.conversation_id}/messages/", {"text": "never mind"}, format="json")
    assert sent.status_code == 201, sent.content
    wait_until(lambda: Run.objects.filter(pk=sent.json()["run"]["id"], status="succeeded").first(), 30, "a reply")
    assert not (setup["root"] / f"conversation-{run.conversation_id}" / "proof.txt").exists()
    assert Run.objects.get(pk=run.pk).status == Run.Status.CANCELLED
    assert [e for e in RunEvent.objects.filter(run=run).values_list("type", flat=True)][-2:] == [
        "tool_result",
        "run_finished",
    ]


@pytest.mark.req("OP-3", "RN-4")
@pytest.mark.parametrize("decision", ["approved", "denied"])
def test_a_cancel_just_after_a_decision_closes_the_call_with_what_was_decided(setup, alice, alice_api, decision):
    """QA: approve and cancel sent together both answered 200; the approval stayed "approved" and
    the call said it was cancelled while it waited for approval."""
    run = make_run(alice, "write the proof file")
    with beating("test-cancel@host"):
        run_execute(run.pk, worker="test-cancel@host")
    approval = Approval.objects.get(run=run)
    # The decision commits first (the run queued again, its task not yet taken), then the cancel.
    with transaction.atomic():
        approvals.approval_record(approval_id=approval.pk, user=alice, decision=decision)
    assert Run.objects.get(pk=run.pk).status == Run.Status.QUEUED
    assert alice_api.post(f"/api/runs/{run.pk}/cancel/").status_code == 200

    approval.refresh_from_db()
    assert approval.status == decision
    _prompt, call, result = path_of(run.conversation_id)
    closed = json.loads(result.content[0]["content"])
    expected = (
        "The run was cancelled after this call was approved, before it ran; it did not run."
        if decision == "approved"
        else "A person denied this call of bash; it did not run."
    )
    assert closed["error"] == expected
    assert not (setup["root"] / f"conversation-{run.conversation_id}" / "proof.txt").exists()


@contextlib.contextmanager
def _emulator_latency(setup: dict[str, Any], **latency_ms: int) -> Iterator[dict[str, Any]]:
    """The module's emulator answers with these latencies (`first_token_ms`, `delta_ms`) meanwhile."""
    url = f"{setup['server'].base_url}/_emulator/latency"
    httpx.post(url, json=latency_ms, timeout=30).raise_for_status()
    try:
        yield setup
    finally:
        httpx.post(url, json=dict.fromkeys(latency_ms, 0), timeout=30).raise_for_status()


@pytest.fixture
def slow_first_token(setup):
    """The model takes 20 s before its first token, as a long prompt on a local model does."""
    with _emulator_latency(setup, first_token_ms=20_000):
        yield setup


@pytest.mark.req("OP-3")
def test_a_cancel_while_the_model_has_sent_nothing_yet_ends_the_run_within_2_s(slow_first_token, alice):
    run = make_run(alice, "hello")
    enqueue_run(run.pk)
    # The request is out (the model has it); its first token is 20 s away.
    wait_until(lambda: any(_last_text(payload) == "hello" for payload in RECEIVED), 30, "the model request")

    asked = timezone.now()
    run_cancel(run=run)
    assert seconds_since(asked, cancelled(run).finished_at) < scaled(2.0), timeline(run, asked)
    # Nothing of the turn came back, so nothing of it is kept: the path still ends at the prompt.
    assert [m.pk for m in path_of(run.conversation_id)] == [run.trigger_id]
    assert _run_finished(run)["status"] == "cancelled"


@pytest.fixture
def slow_stream(setup):
    """The model writes its answer slowly: 300 ms between chunks."""
    with _emulator_latency(setup, delta_ms=300):
        yield setup


@pytest.mark.req("OP-3", "RN-2")
def test_a_cancel_while_the_answer_streams_ends_the_run_and_records_the_request_it_cut(slow_stream, alice):
    run = make_run(alice, "tell me a story")
    enqueue_run(run.pk)
    wait_until(lambda: RunEvent.objects.filter(run=run, type="text_delta").exists(), 30, "the answer to start")
    # Recorded as soon as the answer began: what a worker killed now would leave behind.
    [began] = ModelRequest.objects.filter(run=run)
    assert began.stop_reason == "incomplete" and began.output_tokens == 0
    # The prompt's figures as the API sent them when its answer began (message_start), cache split included.
    assert began.usage_source == "partial" and began.cache_reported and began.prompt_tokens > 1000

    asked = timezone.now()
    run_cancel(run=run)
    assert seconds_since(asked, cancelled(run).finished_at) < scaled(2.0), timeline(run, asked)
    assert [m.pk for m in path_of(run.conversation_id)] == [run.trigger_id]  # a cut answer is not kept
    # The request was taken and answered in part: paid for, so recorded with the prompt as reported.
    [cut] = ModelRequest.objects.filter(run=run)  # the same record, completed: counted once
    assert cut.pk == began.pk and cut.stop_reason == "cancelled" and cut.usage_source == "partial"
    assert (cut.input_tokens, cut.cache_creation_input_tokens, cut.cache_read_input_tokens) == (
        began.input_tokens,
        began.cache_creation_input_tokens,
        began.cache_read_input_tokens,
    )
    assert 0 < cut.output_tokens < 300  # the words that came, as our estimate


@pytest.mark.req("OP-3", "CH-14")
def test_a_cancelled_compaction_run_stops_its_summary_within_2_s_and_keeps_what_it_cost(slow_stream, alice, settings):
    settings.CC_RUN_QUEUE = f"in-process-{uuid.uuid4().hex[:8]}"  # run here, by this test
    settings.CC_COMPACT_TAIL_TOKENS = 256
    conversation = Conversation.objects.create(owner=alice, title="summary", model=MODEL)
    for n in range(6):
        add_turn(conversation, f"Question {n}: " + "detail " * 200, f"Answer {n}: " + "finding " * 200)
    run = compaction_start(conversation=conversation, rungs=["summary"])
    worker = f"summary-{uuid.uuid4().hex[:6]}@host"

    def execute() -> None:
        try:
            run_execute(run_id=run.pk, worker=worker)
        finally:
            connection.close()

    with beating(worker):
        thread = threading.Thread(target=execute)
        thread.start()
        # The summary's answer began: recorded then, as every model call is.
        wait_until(lambda: ModelRequest.objects.filter(run=run, subagent="summary").exists(), 30, "the summary")
        asked = timezone.now()
        run_cancel(run=run)
        thread.join(timeout=10)
    assert seconds_since(asked, cancelled(run).finished_at) < scaled(2.0), timeline(run, asked)
    [summary] = ModelRequest.objects.filter(run=run)
    assert summary.subagent == "summary" and summary.stop_reason == "cancelled" and summary.output_tokens > 0
    assert not Compaction.objects.filter(conversation=conversation).exists()  # a cut summary is no pass
