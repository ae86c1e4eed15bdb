"""Subagents (TD-14): spawn_agents fans out children that share one cached prefix."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from django.db import connection

from agents.models import ModelRequest, Run
from agents.providers.emulator import Emulator
from agents.providers.emulator_server import EmulatorServer
from agents.services import run_execute
from controlcenter.processes import WorkerProcess, services_env
from conversations.models import Conversation, Message

MODEL = "claude-sonnet-4-5"
TASKS = [f"Summarise part {n} of the report." for n in range(5)]


def policy(payload: dict[str, Any]) -> list[dict[str, Any]]:
    system = payload["system"][-1]["text"]
    last = payload["messages"][-1]["content"]
    if "subagent" in system:
        return [{"type": "text", "text": f"answer to: {last[-1]['text']}"}]
    if last and last[0].get("type") == "tool_result":
        return [{"type": "text", "text": "All parts are summarised."}]
    return [{"type": "tool_use", "name": "spawn_agents", "input": {"tasks": TASKS}}]


@pytest.fixture
def model_server(settings, tmp_path):
    with EmulatorServer(Emulator(policy=policy)) as server:
        # A queue of its own: the session's shared worker has no key for the emulator.
        settings.CC_RUN_QUEUE = f"runtime-test-{uuid.uuid4().hex[:8]}"
        settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "test-key", server.base_url
        settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
        settings.CC_SUBAGENT_RELEASE_WAIT_SECONDS = 10
        yield server


@pytest.fixture
def child_worker(model_server, tmp_path, settings):
    """Services mode: children are Celery tasks, so a real worker runs them. Embedded: the in-process pool."""
    if settings.CC_MODE != "services":
        yield None
        return
    env = services_env(connection.settings_dict["NAME"])
    env.update(
        ANTHROPIC_API_KEY="test-key",
        ANTHROPIC_BASE_URL=model_server.base_url,
        CC_WORKSPACE_ROOT=str(settings.CC_WORKSPACE_ROOT),
        CC_RUN_QUEUE=settings.CC_RUN_QUEUE,
    )
    worker = WorkerProcess(
        env,
        f"children-{uuid.uuid4().hex[:6]}@%h",
        tmp_path / "children.log",
        concurrency=5,
        queue=settings.CC_RUN_QUEUE,
    )
    worker.wait_ready()
    yield worker
    worker.stop()


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("TD-14")
def test_a_fan_out_of_five_children_shares_one_prefix_and_returns_their_answers_in_order(child_worker, alice):
    conversation = Conversation.objects.create(owner=alice, title="fan-out")
    trigger = Message.objects.create(conversation=conversation, role="user", content=[{"type": "text", "text": "go"}])
    conversation.tip = trigger
    conversation.save()
    run = Run.objects.create(conversation=conversation, trigger=trigger, provider="anthropic", model=MODEL)

    run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    messages = list(Message.objects.filter(conversation=conversation).order_by("id"))
    observation = json.loads(messages[2].content[0]["content"])
    log = child_worker.log_path.read_text()[-4000:] if child_worker else ""
    assert observation["ok"] is True, (observation, log)
    assert [r["text"] for r in observation["results"]] == [f"answer to: {task}" for task in TASKS]

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
    assert 0.9 <= time.monotonic() - began < 3.0  # a slow first child costs a cache hit, never the fan-out

    released = uuid.uuid4().hex
    release_siblings(released, 2)
    began = time.monotonic()
    assert wait_for_release(released, 5.0) is True and wait_for_release(released, 5.0) is True
    assert time.monotonic() - began < 1.0
