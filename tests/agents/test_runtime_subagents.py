"""Subagents (TD-14): spawn_agents fans out children that share one cached prefix."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from agents.lifecycle import run_execute
from agents.models import Approval, ModelRequest, Run, RunEvent, Subagent
from agents.subagents import SPAWN_AGENTS, fanout_observation
from controlcenter.processes import WorkerProcess, services_env
from conversations.models import Conversation, Message
from engine.emulator import Emulator
from engine.emulator.server import EmulatorServer
from tests.support.catalog import CATALOG_PATH
from tests.support.db import drop_this_connection
from tests.support.timing import scaled
from tests.support.waiting import wait_until as shared_wait_until
from toolcatalog.models import Mode, ToolActivation
from toolcatalog.services import catalog_import
from toolcatalog.toolbox import run_toolbox
from toolcatalog.workspace import workspace_root

# A test here starts its own worker and waits on a fan-out of several model turns: under CI's
# load (three test sessions, each with workers, on two cores) one has taken over 120 s. The
# waits below give up after 120 s with what they waited for, inside this larger bound.
pytestmark = pytest.mark.timeout(300)

MODEL = "claude-sonnet-4-5"
TASKS = [f"Summarise part {n} of the report." for n in range(5)]


def is_child(payload: dict[str, Any]) -> bool:
    return "subagent" in payload["system"][0]["text"]


def last_tool_result(payload: dict[str, Any]) -> dict[str, Any] | None:
    last = payload["messages"][-1]["content"]
    if last and last[0].get("type") == "tool_result":
        return json.loads(last[0]["content"])
    return None


def policy(payload: dict[str, Any]) -> list[dict[str, Any]]:
    last = payload["messages"][-1]["content"]
    if is_child(payload):
        return [{"type": "text", "text": f"answer to: {last[-1]['text']}"}]
    if last_tool_result(payload) is not None:
        return [{"type": "text", "text": "All parts are summarised."}]
    return [{"type": "tool_use", "name": "spawn_agents", "input": {"tasks": TASKS}}]


def make_run(owner, text: str = "go") -> Run:
    conversation = Conversation.objects.create(owner=owner, title="fan-out")
    trigger = Message.objects.create(conversation=conversation, role="user", content=[{"type": "text", "text": text}])
    conversation.tip = trigger
    conversation.save()
    return Run.objects.create(conversation=conversation, trigger=trigger, provider="anthropic", model=MODEL)


def observation_of(run: Run, position: int = 2) -> dict[str, Any]:
    messages = list(Message.objects.filter(conversation=run.conversation).order_by("id"))
    return json.loads(messages[position].content[0]["content"])


def wait_until(predicate, timeout: float = 120, what: str = "the condition"):
    # Generous: two CPUs are shared with other test sessions, and a load of 13 has been seen.
    return shared_wait_until(predicate, timeout, what, interval=0.1)


@pytest.fixture
def fanout(settings, tmp_path):
    """Start the emulator with a policy, and (services mode) a real worker for the children.

    The worker gets a queue of its own (the session's shared worker has no key for the
    emulator) and runs parent runs too when a test enqueues one.
    """
    started = []

    def start(chosen_policy=policy, concurrency: int = 5, **extra_env: str):
        server = EmulatorServer(Emulator(policy=chosen_policy)).start()
        started.append(server)
        settings.CC_RUN_QUEUE = f"runtime-test-{uuid.uuid4().hex[:8]}"
        settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "test-key", server.base_url
        settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
        # Siblings wait for the first child's first streamed event (the cache write) at most this
        # long. Under CI's load the first child has taken over the default 10 s to start, and
        # siblings that go first write the prefix themselves (the sharing test then fails).
        settings.CC_SUBAGENT_RELEASE_WAIT_SECONDS = 30
        settings.CC_TOOL_AUTO_APPROVE = []
        if settings.CC_MODE != "services":
            return None
        env = services_env(connection.settings_dict["NAME"])
        env.update(
            ANTHROPIC_API_KEY="test-key",
            ANTHROPIC_BASE_URL=server.base_url,
            CC_WORKSPACE_ROOT=str(settings.CC_WORKSPACE_ROOT),
            CC_RUN_QUEUE=settings.CC_RUN_QUEUE,
            CC_TOOL_AUTO_APPROVE="",
            CC_SUBAGENT_RELEASE_WAIT_SECONDS=str(settings.CC_SUBAGENT_RELEASE_WAIT_SECONDS),
            **extra_env,
        )
        worker = WorkerProcess(
            env, f"children-{uuid.uuid4().hex[:6]}@%h", tmp_path / "children.log",
            concurrency=concurrency,
        )  # fmt: skip
        started.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for process in reversed(started):
        process.stop()


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("TD-14")
def test_a_worker_with_one_thread_runs_a_parent_and_its_five_children_to_the_end(fanout, alice):
    # `controlcenter worker --concurrency 1`, as deployed: the parent's turn holds the only thread
    # while it waits, and the children are queued behind it. They must not wait for the timeout.
    from agents.lifecycle import enqueue_run

    worker = fanout(concurrency=1, CC_SUBAGENT_TIMEOUT_SECONDS="60")
    if worker is None:
        pytest.fail("this test needs services mode (the README's test command sets it)")
    run = make_run(alice)
    enqueue_run(run.pk)
    started = time.monotonic()
    run = wait_until(lambda: Run.objects.filter(pk=run.pk, status__in=["succeeded", "failed"]).first(), 120, "the run")
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert time.monotonic() - started < 50, "the children waited for the parent's timeout"
    observation = observation_of(run)
    assert observation["ok"] is True, observation
    assert [r["text"] for r in observation["results"]] == [f"answer to: {task}" for task in TASKS]
    # All of them ran on the one worker (its parent's thread), each exactly once.
    children = Subagent.objects.filter(parent=run)
    assert {child.worker for child in children} == {run.worker}
    for child in children:
        statuses = RunEvent.objects.filter(run=run, type="subagent_status", payload__subagent__index=child.index)
        assert list(statuses.values_list("payload__status", flat=True)) == ["queued", "running", "succeeded"]


def remembering_policy(payload: dict[str, Any]) -> list[dict[str, Any]]:
    if is_child(payload):
        last = payload["messages"][-1]["content"]
        if not any(block.get("type") == "tool_result" for block in last):
            return [{"type": "tool_use", "name": "save_memory", "input": {"content": "Part 1 is done."}}]
        return [{"type": "text", "text": "remembered"}]
    if last_tool_result(payload) is not None:
        return [{"type": "text", "text": "All remembered."}]
    return [{"type": "tool_use", "name": "spawn_agents", "input": {"tasks": ["Remember that part 1 is done."]}}]


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("TD-15")
@pytest.mark.req("TS-3")
def test_a_deferred_tool_a_child_loads_is_recorded_under_its_parent_run(fanout, alice, parent_worker):
    catalog_import(text=CATALOG_PATH.read_text())  # save_memory is deferred in the reference catalog
    fanout(remembering_policy)
    run = make_run(alice)
    run_execute(run_id=run.pk, worker=parent_worker)
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert observation_of(run)["results"][0].get("text") == "remembered", observation_of(run)
    assert list(ToolActivation.objects.filter(run=run).values_list("tool_name", "trigger")) == [
        ("save_memory", "direct")
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("TD-14")
def test_a_fan_out_of_five_children_shares_one_prefix_and_returns_their_answers_in_order(fanout, alice, parent_worker):
    child_worker = fanout()
    run = make_run(alice)

    run_execute(run_id=run.pk, worker=parent_worker)
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    observation = observation_of(run)
    log = child_worker.log_path.read_text()[-4000:] if child_worker else ""
    assert observation["ok"] is True, (observation, log)
    assert [r["text"] for r in observation["results"]] == [f"answer to: {task}" for task in TASKS]
    # Each child's progress is in the parent's log, for the parent's card on the page (UX-4).
    statuses: dict[int, list[str]] = {}
    answers: dict[int, str] = {}
    for event in RunEvent.objects.filter(run=run, type="subagent_status").order_by("seq"):
        index = event.payload["subagent"]["index"]
        statuses.setdefault(index, []).append(event.payload["status"])
        answers[index] = event.payload.get("answer", "")
    assert statuses == {index: ["queued", "running", "succeeded"] for index in range(len(TASKS))}
    assert [answers[index] for index in range(len(TASKS))] == [f"answer to: {task}" for task in TASKS]

    children = list(ModelRequest.objects.filter(run=run).exclude(subagent="").order_by("subagent"))
    by_index = {int(r.subagent.split("/")[1]): r for r in children}
    assert sorted(by_index) == [0, 1, 2, 3, 4]
    first = by_index[0]
    # The first child writes the shared tools + system prefix (1h); each sibling reads exactly that.
    assert first.cache_creation_1h_input_tokens > 0 and first.cache_read_input_tokens == 0
    for index in (1, 2, 3, 4):
        sibling = by_index[index]
        assert sibling.cache_read_input_tokens == first.cache_creation_1h_input_tokens, index
        assert sibling.cache_creation_1h_input_tokens == 0
        assert sibling.breakpoints == first.breakpoints == ["tools", "system", "current_turn"]
    reads = sum(by_index[i].cache_read_input_tokens for i in (1, 2, 3, 4))
    prompt = sum(by_index[i].prompt_tokens for i in (1, 2, 3, 4))
    assert reads / prompt >= 0.9


@pytest.mark.django_db
@pytest.mark.req("TD-14")
def test_siblings_wait_for_the_first_child_at_most_the_bounded_time_and_go_at_once_when_released():
    from agents.subagents import release_siblings, wait_for_release

    unreleased = uuid.uuid4().hex
    began = time.monotonic()
    assert wait_for_release(unreleased, 1.0) is False
    assert 0.9 <= time.monotonic() - began < scaled(3.0)  # a slow first child costs a cache hit, never the fan-out

    released = uuid.uuid4().hex
    release_siblings(released, 2)
    began = time.monotonic()
    assert wait_for_release(released, 5.0) is True and wait_for_release(released, 5.0) is True
    assert time.monotonic() - began < scaled(1.0)


# --- profiles: same shape, same prefix (TD-14) ------------------------------------------

PROFILED = [
    {"task": "Find where the cache breakpoints are placed.", "profile": "researcher"},
    {"task": "Add a line to notes.txt.", "profile": "coder"},
    {"task": "Review notes.txt.", "profile": "reviewer"},
    "Say hello.",  # a plain string: the default profile
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("TD-14")
def test_children_with_different_profiles_get_byte_identical_prefixes_and_the_same_resident_set(
    fanout, alice, parent_worker
):
    seen: list[dict[str, Any]] = []

    def recording(payload: dict[str, Any]) -> list[dict[str, Any]]:
        if is_child(payload):
            seen.append(payload)
        if not is_child(payload) and last_tool_result(payload) is None:
            return [{"type": "tool_use", "name": "spawn_agents", "input": {"tasks": PROFILED}}]
        return policy(payload)

    fanout(recording)
    run = make_run(alice)
    run_execute(run_id=run.pk, worker=parent_worker)
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    observation = observation_of(run)
    assert observation["ok"] is True, observation
    assert [r["profile"] for r in observation["results"]] == ["researcher", "coder", "reviewer", "worker"]

    by_task = {payload["messages"][0]["content"][-1]["text"]: payload for payload in seen}
    tasks = [item if isinstance(item, str) else item["task"] for item in PROFILED]
    assert sorted(by_task) == sorted(tasks)
    # The cached prefix is tools, then system: the same bytes for every child, whatever its profile.
    prefixes = {json.dumps([by_task[t]["tools"], by_task[t]["system"]], sort_keys=True) for t in tasks}
    assert len(prefixes) == 1
    # The parent run's surface (its mode's resident set; no spawn_agents), whatever the profile.
    names = [tool["name"] for tool in by_task[tasks[0]]["tools"]]
    parent_surface = [schema["name"] for schema in run_toolbox(workspace=Path("unused"), mode=None).schemas()]
    assert "spawn_agents" not in names and names == parent_surface
    # The profile is the first block of the first user message, after that prefix, then the task.
    for item, task in zip(PROFILED, tasks, strict=True):
        profile = item["profile"] if isinstance(item, dict) else "worker"
        first = by_task[task]["messages"][0]["content"]
        assert first[0]["text"].startswith(f"Your profile: {profile}. "), first
        assert settings_profile(profile)["instructions"] in first[0]["text"]
        assert first[1]["text"] == task

    # The provider agrees: every sibling read exactly the prefix the first child wrote.
    children = {int(r.subagent.split("/")[1]): r for r in ModelRequest.objects.filter(run=run).exclude(subagent="")}
    assert sorted(children) == [0, 1, 2, 3]
    written = children[0].cache_creation_1h_input_tokens
    assert written > 0
    assert [children[i].cache_read_input_tokens for i in (1, 2, 3)] == [written] * 3


def settings_profile(name: str) -> dict[str, Any]:
    from django.conf import settings

    return settings.CC_SUBAGENT_PROFILES[name]


# --- large answers go through the scratchpad (TD-14, SP-1) ------------------------------

LONG_ANSWER = "".join(f"finding {n}: the report's section {n} is consistent with the data.\n" for n in range(300))


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("TD-14", "SP-1")
def test_a_large_child_answer_goes_to_the_scratchpad_and_the_parent_reads_it_whole(
    fanout, alice, settings, parent_worker
):
    def long_and_short(payload: dict[str, Any]) -> list[dict[str, Any]]:
        if is_child(payload):
            task = payload["messages"][0]["content"][-1]["text"]
            return [{"type": "text", "text": LONG_ANSWER if task == "long" else f"short answer to {task}"}]
        result = last_tool_result(payload)
        if result is None:
            return [{"type": "tool_use", "name": "spawn_agents", "input": {"tasks": ["long", "brief", "terse"]}}]
        if "results" in result:
            entry = next(r["scratchpad_id"] for r in result["results"] if "scratchpad_id" in r)
            return [{"type": "tool_use", "name": "scratchpad_read", "input": {"scratchpad_id": entry, "mode": "full"}}]
        return [{"type": "text", "text": "I have read the long answer."}]

    fanout(long_and_short)
    run = make_run(alice)
    run_execute(run_id=run.pk, worker=parent_worker)
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error

    raw = Message.objects.filter(conversation=run.conversation).order_by("id")[2].content[0]["content"]
    assert len(raw) <= settings.SCRATCHPAD_THRESHOLD_BYTES  # the parent's observation fits inline (SP-1)
    observation = json.loads(raw)
    long, brief, terse = observation["results"]
    assert observation["ok"] is True and long["ok"] is True
    assert "text" not in long and long["size_bytes"] == len(LONG_ANSWER.encode())
    assert long["summary"].startswith(LONG_ANSWER[:200]) and "characters omitted" in long["summary"]
    assert long["summary"].endswith(LONG_ANSWER[-100:])
    assert long["scratchpad_id"] in long["_note"]
    assert (brief["text"], terse["text"]) == ("short answer to brief", "short answer to terse")
    # The parent read the whole answer back with scratchpad_read, exactly.
    read = observation_of(run, position=4)
    assert read["ok"] is True and read["content"] == LONG_ANSWER


# --- bad input: a clear tool error, nothing spawned ---------------------------------------


@pytest.mark.django_db
@pytest.mark.req("TD-14")
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "tasks must be a list of 1 to 16 tasks; got NoneType"),
        ({"tasks": "do it"}, "tasks must be a list of 1 to 16 tasks; got str"),
        ({"tasks": []}, "tasks has 0 items; one call runs 1 to 16 subagents"),
        ({"tasks": ["x"] * 17}, "tasks has 17 items; one call runs 1 to 16 subagents"),
        ({"tasks": ["fine", 7]}, "tasks[1] must be a string or an object {task, profile}; got 7"),
        ({"tasks": ["fine", "  "]}, "tasks[1] has no task"),
        ({"tasks": [{"profile": "coder"}]}, "tasks[0] has no task"),
        ({"tasks": [{"task": "x", "role": "coder"}]}, "tasks[0] has unknown key(s) 'role'"),
        ({"tasks": [{"task": "x", "profile": "wizard"}]}, "tasks[0].profile 'wizard' is not a profile; the profiles"),
        ({"tasks": ["x"], "shape": "Big Shape"}, "shape must match"),
        ({"tasks": ["x"], "count": 3}, "unknown argument(s) 'count'"),
        (["x"], "the arguments must be an object with 'tasks'; got list"),
    ],
)
def test_bad_spawn_arguments_are_a_tool_error_and_spawn_nothing(alice, arguments, message):
    from agents.lifecycle import enqueue_subagent
    from agents.subagents import ChildDispatch, spawn_agents

    run = make_run(alice)
    children = ChildDispatch(enqueue=enqueue_subagent, run_here=enqueue_subagent)
    observation = spawn_agents(run_id=run.pk, arguments=arguments, children=children)
    assert observation["ok"] is False
    assert observation["error"].startswith("spawn_agents did not start any subagent: ")
    assert message in observation["error"], observation["error"]
    assert not Subagent.objects.exists()


# --- children pause for approval (RN-4, TD-14) --------------------------------------------

BASH_TASKS = [{"task": "write zero", "profile": "coder"}, {"task": "write one", "profile": "coder"}]


def bash_children(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Each child asks to run bash once and reports what came back; the parent fans out, then ends."""
    result = last_tool_result(payload)
    if is_child(payload):
        if result is None:
            word = payload["messages"][0]["content"][-1]["text"].split()[-1]
            return [{"type": "tool_use", "name": "bash", "input": {"command": f"echo {word} > {word}.txt"}}]
        return [{"type": "text", "text": "bash denied" if result.get("denied") else f"bash ran: {result.get('ok')}"}]
    if result is None:
        return [{"type": "tool_use", "name": "spawn_agents", "input": {"tasks": BASH_TASKS}}]
    return [{"type": "text", "text": "Both children reported."}]


def pending_child_approvals(api, run: Run, count: int) -> list[dict[str, Any]]:
    def listed():
        rows = api.get(f"/api/runs/{run.pk}/approvals/").json()
        pending = [row for row in rows if row["status"] == "pending"]
        return pending if len(pending) == count else None

    return sorted(
        wait_until(listed, what=f"{count} pending approvals of run {run.pk}"), key=lambda a: a["subagent"]["index"]
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("RN-4", "TD-14")
def test_children_pause_for_approval_on_the_parent_run_and_resume_when_approved_or_denied(
    fanout, alice, alice_api, bob_api
):
    from agents.lifecycle import enqueue_run

    worker = fanout(bash_children)
    if worker is None:
        pytest.fail("this test needs services mode: a real Celery worker runs the parent and its children")
    run = make_run(alice)
    enqueue_run(run.pk)
    zero, one = pending_child_approvals(alice_api, run, 2)

    # Both calls wait on the parent run, each naming its child; the parent keeps running meanwhile.
    assert [(a["tool_name"], a["input"]) for a in (zero, one)] == [
        ("bash", {"command": "echo zero > zero.txt"}),
        ("bash", {"command": "echo one > one.txt"}),
    ]
    assert [(a["subagent"]["index"], a["subagent"]["profile"], a["subagent"]["status"]) for a in (zero, one)] == [
        (0, "coder", "waiting"),
        (1, "coder", "waiting"),
    ]
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    # The parent's event log (what its conversation page follows) announces them.
    requested = [e.payload for e in RunEvent.objects.filter(run=run, type="approval_requested").order_by("seq")]
    assert sorted((p["approval_id"], p["subagent"]["index"]) for p in requested) == [(zero["id"], 0), (one["id"], 1)]

    # The conversation's list has them too: where a person (or a program) finds what waits.
    listed = alice_api.get(f"/api/conversations/{run.conversation_id}/approvals/?status=pending").json()
    assert [(a["id"], a["run"], a["subagent"]["index"]) for a in listed] == [
        (zero["id"], run.pk, 0),
        (one["id"], run.pk, 1),
    ]
    assert alice_api.get(f"/api/conversations/{run.conversation_id}/approvals/?status=maybe").status_code == 400
    assert bob_api.get(f"/api/conversations/{run.conversation_id}/approvals/").status_code == 404

    assert bob_api.post(f"/api/approvals/{zero['id']}/approve/").status_code == 404
    assert Approval.objects.get(pk=zero["id"]).status == "pending"  # bob changed nothing

    approved = alice_api.post(f"/api/approvals/{zero['id']}/approve/")
    assert approved.status_code == 200, approved.content
    denied = alice_api.post(f"/api/approvals/{one['id']}/deny/")
    assert denied.status_code == 200, denied.content
    assert alice_api.post(f"/api/approvals/{one['id']}/approve/").status_code == 409

    try:
        wait_until(lambda: Run.objects.get(pk=run.pk).is_finished, what="the parent run to finish")
    except AssertionError as exc:
        children = list(Subagent.objects.filter(parent=run).values_list("index", "status", "error"))
        raise AssertionError(f"{exc}; children {children}; worker log: {worker.log_path.read_text()[-3000:]}") from None
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, (run.error, worker.log_path.read_text()[-3000:])
    observation = observation_of(run)
    assert [(r["index"], r["ok"], r.get("text")) for r in observation["results"]] == [
        (0, True, "bash ran: True"),
        (1, True, "bash denied"),
    ], (observation, worker.log_path.read_text()[-3000:])
    root = workspace_root(run.conversation_id)
    assert (root / "zero.txt").read_text() == "zero\n"
    assert not (root / "one.txt").exists()
    assert list(Subagent.objects.filter(parent=run).values_list("status", flat=True)) == ["succeeded"] * 2
    decided = {
        e.payload["approval_id"]: e.payload["decision"]
        for e in RunEvent.objects.filter(run=run, type="approval_decided")
    }
    assert decided == {zero["id"]: "approved", one["id"]: "denied"}
    assert alice_api.get(f"/api/conversations/{run.conversation_id}/approvals/?status=pending").json() == []
    # The transcript holds the parent's turn only; each child's two requests are recorded under the parent.
    assert ModelRequest.objects.filter(run=run).exclude(subagent="").count() == 4


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("RN-4", "TD-14")
def test_cancelling_the_parent_cancels_children_waiting_for_approval(fanout, alice, alice_api):
    from agents.lifecycle import enqueue_run

    if fanout(bash_children) is None:
        pytest.fail("this test needs services mode: a real Celery worker runs the parent and its children")
    run = make_run(alice)
    enqueue_run(run.pk)
    zero, _one = pending_child_approvals(alice_api, run, 2)

    assert alice_api.post(f"/api/runs/{run.pk}/cancel/").status_code == 200
    assert list(Subagent.objects.filter(parent=run).values_list("status", flat=True)) == ["cancelled"] * 2
    wait_until(lambda: Run.objects.get(pk=run.pk).status == Run.Status.CANCELLED, what="the parent to stop")
    late = alice_api.post(f"/api/approvals/{zero['id']}/approve/")
    assert late.status_code == 409 and "expired" in late.json()["error"]["message"], late.content
    # Their calls no longer wait for anyone: closed as expired, not listed as pending.
    assert set(Approval.objects.filter(run=run).values_list("status", flat=True)) == {"expired"}
    pending = alice_api.get(f"/api/conversations/{run.conversation_id}/approvals/", {"status": "pending"}).json()
    assert pending == [] or pending.get("results") == []
    assert not any(workspace_root(run.conversation_id).iterdir())
    # The parent's turn is kept to where it stopped (OP-3): spawn_agents, answered as cancelled.
    kept = list(Message.objects.filter(conversation=run.conversation).order_by("id"))
    assert [m.role for m in kept] == ["user", "assistant", "user"]
    assert json.loads(kept[2].content[0]["content"])["cancelled"] is True


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("RN-4", "TD-14")
def test_the_parent_waits_for_children_awaiting_approval_only_as_long_as_its_own_limit(
    fanout, alice, settings, parent_worker
):
    if fanout(bash_children) is None:
        pytest.fail("this test needs services mode: a real Celery worker runs the children")
    # Long enough for both children to reach their approval even on a loaded machine.
    settings.CC_SUBAGENT_TIMEOUT_SECONDS = 10
    run = make_run(alice)
    began = time.monotonic()
    run_execute(run_id=run.pk, worker=parent_worker)
    elapsed = time.monotonic() - began
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert 10 <= elapsed < scaled(25)
    observation = observation_of(run)
    assert observation["ok"] is False
    assert observation["error"] == "subagents [0, 1] did not answer within 10s and were cancelled."
    assert [r["error"] for r in observation["results"]] == ["cancelled: its parent run stopped waiting for it."] * 2
    wait_until(  # a child that was still running when the parent gave up stops at its next check
        lambda: list(Subagent.objects.filter(parent=run).values_list("status", flat=True)) == ["cancelled"] * 2,
        what="both children to be cancelled",
    )
    # Undecided and now moot: closed as expired, never left pending.
    assert not Approval.objects.filter(run=run, status="pending").exists()


@pytest.mark.django_db
@pytest.mark.req("TD-14")
def test_a_child_whose_worker_is_gone_is_failed_by_the_reaper_so_its_parent_hears_at_once(alice):
    from datetime import timedelta

    from django.utils import timezone

    from agents.lifecycle import runs_reap_orphans

    run = make_run(alice)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, worker="alive@host", started_at=timezone.now())
    long_ago = timezone.now() - timedelta(minutes=5)
    lost, kept = (
        Subagent.objects.create(parent=run, fanout_id="f" * 32, index=index, count=2, shape="worker",
                                profile="worker", task="t", status=Run.Status.RUNNING, worker=worker,
                                started_at=long_ago)
        for index, worker in enumerate(["gone@host", "alive@host"])
    )  # fmt: skip
    assert runs_reap_orphans(live={"alive@host"}, grace_seconds=0) == []
    lost.refresh_from_db()
    kept.refresh_from_db()
    assert (lost.status, lost.error) == ("failed", "the worker running this subagent stopped before it finished.")
    assert kept.status == "running"
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    # A page watching the parent, or catching up on its log, hears it too (QA: it kept showing
    # "running" until the parent ended).
    told = [
        (event.payload["subagent"]["index"], event.payload["status"], event.payload["error"])
        for event in RunEvent.objects.filter(run=run, type="subagent_status")
    ]
    assert told == [(0, "failed", "the worker running this subagent stopped before it finished.")]
    observation = fanout_observation(parent=run, shape="worker", children=[lost], waited_out=False)
    assert observation["results"] == [
        {
            "index": 0,
            "profile": "worker",
            "ok": False,
            "error": "the worker running this subagent stopped before it finished.",
        }
    ]


@pytest.mark.django_db
@pytest.mark.req("TD-14", "SP-1")
def test_answers_that_fit_alone_but_not_together_go_to_the_scratchpad_largest_first(alice, settings):
    from scratchpad.models import Entry
    from scratchpad.services import full_content

    settings.SCRATCHPAD_THRESHOLD_BYTES = 4096
    run = make_run(alice)
    sizes = [1500, 3000, 2500, 200]
    children = [
        Subagent(parent=run, fanout_id="a" * 32, index=index, count=5, shape="worker", profile="worker", task="t",
                 status=Run.Status.SUCCEEDED, answer=str(index) * size)
        for index, size in enumerate(sizes)
    ]  # fmt: skip
    children.append(
        Subagent(parent=run, fanout_id="a" * 32, index=4, count=5, shape="worker", profile="coder", task="t",
                 status=Run.Status.FAILED, error="RuntimeError: boom")
    )  # fmt: skip
    observation = fanout_observation(parent=run, shape="worker", children=children, waited_out=False)

    assert len(json.dumps(observation)) <= 4096  # the whole fits inline now
    offloaded = [item["index"] for item in observation["results"] if "scratchpad_id" in item]
    assert offloaded == [1, 2]  # the two largest, and no more than needed
    assert [observation["results"][i]["text"] for i in (0, 3)] == ["0" * 1500, "3" * 200]
    for index in offloaded:
        entry = Entry.objects.get(pk=observation["results"][index]["scratchpad_id"])
        assert (entry.turn_id, entry.run_id) == (str(run.pk), run.pk)  # readable in the parent's turn
        assert full_content(entry) == str(index) * sizes[index]
    assert observation["results"][4] == {"index": 4, "profile": "coder", "ok": False, "error": "RuntimeError: boom"}
    assert observation["ok"] is False
    assert observation["error"] == "subagents [4] did not finish; see their errors."


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("TD-8")
@pytest.mark.req("TD-14")
def test_children_get_the_parent_runs_mode_so_a_tool_it_denies_is_not_theirs_either(fanout, alice, parent_worker):
    child_tools: list[list[str]] = []

    def shell_child(payload: dict[str, Any]) -> list[dict[str, Any]]:
        if is_child(payload):
            child_tools.append([tool["name"] for tool in payload.get("tools", [])])
            result = last_tool_result(payload)
            if result is None:
                return [{"type": "tool_use", "name": "bash", "input": {"command": "touch escaped.txt"}}]
            return [{"type": "text", "text": f"bash said: {result.get('error', '')}"}]
        if last_tool_result(payload) is not None:
            return [{"type": "text", "text": "done"}]
        return [{"type": "tool_use", "name": SPAWN_AGENTS, "input": {"tasks": ["make a file with the shell"]}}]

    fanout(shell_child)
    run = make_run(alice)
    run.mode = Mode.objects.create(name="no-shell", allow=["*"], deny=["bash"])
    run.save()
    run_execute(run_id=run.pk, worker=parent_worker)
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    answer = observation_of(run)["results"][0]["text"]
    assert answer.startswith("bash said: ") and "bash" in answer[len("bash said: ") :], answer
    assert child_tools and all("bash" not in names for names in child_tools)
    assert not Approval.objects.filter(run=run).exists()
    assert not (workspace_root(run.conversation_id) / "escaped.txt").exists()


@pytest.mark.django_db
@pytest.mark.req("TD-8")
def test_a_mode_that_denies_spawn_agents_never_offers_it(alice):
    from agents.turns import turn_toolboxes

    conversation = Conversation.objects.create(owner=alice, title="no fan-out")
    solo = Mode.objects.create(name="solo", allow=["*"], deny=[SPAWN_AGENTS])
    _, denied = turn_toolboxes(run_id=0, conversation_id=conversation.pk, owner_id=conversation.owner_id, mode=solo)
    _, offered = turn_toolboxes(run_id=0, conversation_id=conversation.pk, owner_id=conversation.owner_id, mode=None)
    assert SPAWN_AGENTS in [schema["name"] for schema in offered.schemas()]
    assert SPAWN_AGENTS not in [schema["name"] for schema in denied.schemas()]
    refused = denied.execute(SPAWN_AGENTS, {"tasks": ["anything"]})
    assert refused["ok"] is False and SPAWN_AGENTS in refused["error"]
    assert not Subagent.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("TD-14", "CH-5")
def test_a_database_connection_dropped_while_a_parent_waits_or_a_child_answers_is_opened_again(alice):
    """QA, with pg_terminate_backend: during a parent's wait spawn_agents failed (the parent went on
    and its children were cancelled as orphans, their commands killed); during a child's answer
    the child failed with a raw OperationalError. A run's own checks already reconnected."""
    from django.utils import timezone

    from agents.lifecycle import _subagent_cancelled
    from agents.subagents import ChildDispatch, _await_children

    run = make_run(alice)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, worker="w@host", started_at=timezone.now())
    fanout_id = "f" * 32
    done, answering = (
        Subagent.objects.create(parent=run, fanout_id=fanout_id, index=index, count=2, shape="worker",
                                profile="worker", task="t", status=status, answer=answer)
        for index, (status, answer) in enumerate([(Run.Status.SUCCEEDED, "first"), (Run.Status.RUNNING, "")])
    )  # fmt: skip
    drop_this_connection()
    assert _subagent_cancelled(answering.pk) is False  # its parent still runs: it goes on
    Subagent.objects.filter(pk=answering.pk).update(status=Run.Status.SUCCEEDED, answer="second")
    drop_this_connection()
    nowhere = ChildDispatch(enqueue=lambda pk: None, run_here=lambda pk: None)
    children, waited_out = _await_children(parent_id=run.pk, fanout_id=fanout_id, dispatch=nowhere)
    assert ([child.answer for child in children], waited_out) == (["first", "second"], False)
