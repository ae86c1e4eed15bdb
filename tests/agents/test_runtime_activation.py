"""Tool activations keep the cache (TD-11): deferred loading on Anthropic, a recorded miss elsewhere.

End to end: a real Celery worker runs the turn; the Anthropic adapter and the
OpenAI-compatible adapter both talk to the emulator's HTTP server. The model
searches (search_tools loads matches), calls a deferred tool by name (a direct
activation), then answers.
"""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

import pytest
from django.db import connection

from agents.models import ModelRequest, Run, RunEvent
from agents.turns import context_view
from controlcenter.processes import WorkerProcess, services_env
from conversations.models import Conversation, Message
from engine.emulator import Emulator
from engine.emulator.server import EmulatorServer
from tests.support.catalog import CATALOG_PATH
from tests.support.waiting import run_finished
from toolcatalog.services import catalog_import

MODEL = "claude-sonnet-4-5"
QUERY = "assign a ticket to a person"


def _tool_result_messages(payload: dict[str, Any]) -> int:
    count = 0
    for message in payload["messages"]:
        content = message.get("content")
        if message.get("role") == "tool" or (
            isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)
        ):
            count += 1
    return count


class Script:
    """Stateless, so retries and both API shapes see the same model: search, direct call, answer."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []

    def __call__(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        self.payloads.append(copy.deepcopy(payload))
        done = _tool_result_messages(payload)
        if done == 0:
            return [{"type": "tool_use", "name": "search_tools", "input": {"query": QUERY}}]
        if done == 1:
            # A deferred tool this installation runs: one it could not run would not be loaded.
            return [{"type": "tool_use", "name": "save_memory", "input": {"content": "the tickets are loaded"}}]
        return [{"type": "text", "text": "The ticket tools and the git log are loaded."}]


@pytest.fixture(scope="module")
def model_server():
    script = Script()
    with EmulatorServer(Emulator(policy=script)) as server:
        server.script = script
        yield server


@pytest.fixture
def worker(model_server, settings, tmp_path):
    if settings.CC_MODE != "services":
        pytest.fail("this test needs DATABASE_URL and REDIS_URL (a real Celery worker)")
    settings.CC_RUN_QUEUE = f"activation-{uuid.uuid4().hex[:8]}"
    settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
    env = services_env(connection.settings_dict["NAME"])
    env.update(
        ANTHROPIC_API_KEY="test-key",
        ANTHROPIC_BASE_URL=model_server.base_url,
        OPENAI_API_KEY="test-key",
        OPENAI_BASE_URL=f"{model_server.base_url}/v1",
        CC_WORKSPACE_ROOT=str(settings.CC_WORKSPACE_ROOT),
        CC_RUN_QUEUE=settings.CC_RUN_QUEUE,
        CC_SERVER_TOOL_DEFERRAL="on",
    )
    process = WorkerProcess(env, f"activation-{uuid.uuid4().hex[:6]}@%h", tmp_path / "w.log")
    process.wait_ready()
    yield process
    process.stop()


def run_to_end(owner, provider: str) -> Run:
    from agents.lifecycle import enqueue_run

    catalog_import(text=CATALOG_PATH.read_text(encoding="utf-8"))
    conversation = Conversation.objects.create(owner=owner, title=f"activation on {provider}")
    trigger = Message.objects.create(
        conversation=conversation, role="user", content=[{"type": "text", "text": "Hand the ticket over."}]
    )
    conversation.tip = trigger
    conversation.save()
    run = Run.objects.create(conversation=conversation, trigger=trigger, provider=provider, model=MODEL)
    enqueue_run(run.pk)
    run = run_finished(run.pk, timeout=60)
    assert run.status == Run.Status.SUCCEEDED, run.error
    return run


def replay_appended(payloads: list[dict[str, Any]]) -> list[int]:
    """The same Anthropic requests with each loaded schema appended as a plain tool (what the
    runtime did before), on a fresh emulator: the cache reads they would have got."""
    emulator = Emulator()
    reads = []
    for payload in payloads:
        appended = copy.deepcopy(payload)
        for tool in appended["tools"]:
            tool.pop("defer_loading", None)
        for message in appended["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else []:
                if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
                    block["content"] = "".join(i.get("text", "") for i in block["content"] if i["type"] == "text")
        reads.append(emulator.measure(appended).cache_read_input_tokens)
    return reads


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
@pytest.mark.req("TD-11")
@pytest.mark.req("TD-5")
@pytest.mark.req("TD-6")
def test_on_anthropic_an_activation_keeps_the_whole_previous_prefix_in_the_cache(worker, model_server, alice):
    script = model_server.script
    first = len(script.payloads)
    run = run_to_end(alice, "anthropic")
    payloads = script.payloads[first:]
    requests = list(ModelRequest.objects.filter(run=run).order_by("step"))
    assert [r.step for r in requests] == [1, 2, 3]
    searched, called, answered = requests
    loaded_by_search = RunEvent.objects.get(run=run, type="tool_result", payload__name="search_tools").payload[
        "loads_tools"
    ]
    assert "assign_ticket" in loaded_by_search
    assert called.tools_loaded == loaded_by_search and answered.tools_loaded == ["save_memory"]
    # Each request reads everything the one before it sent: activations did not touch the prefix.
    assert called.cache_read_input_tokens == searched.prompt_tokens
    assert answered.cache_read_input_tokens == called.prompt_tokens
    assert all(r.cache_miss == "" for r in requests)
    # The Context view shows the next request with the tools this turn loaded, as the loop sends them
    # again (QA: it left them out, a thousand tokens short).
    sent_last = {tool["name"] for tool in payloads[-1]["tools"]}
    shown = context_view(conversation=run.conversation)
    assert {*loaded_by_search, "save_memory"} <= set(shown["extra_tools"]) <= sent_last

    # What went over the wire: the resident block, system and history byte-identical; the
    # loaded schemas deferred; the results that loaded them carry the references.
    resident = payloads[0]["tools"]
    for payload in payloads[1:]:
        kept = [t for t in payload["tools"] if not t.get("defer_loading")]
        assert json.dumps(kept, sort_keys=True) == json.dumps(resident, sort_keys=True)
        assert payload["system"] == payloads[0]["system"]
    deferred = [t["name"] for t in payloads[2]["tools"] if t.get("defer_loading")]
    assert deferred == [*loaded_by_search, "save_memory"]
    search_result = payloads[1]["messages"][-1]["content"][0]["content"]
    assert [b["tool_name"] for b in search_result[1:]] == loaded_by_search
    direct_result = payloads[2]["messages"][-1]["content"][0]["content"]
    assert direct_result[1:] == [{"type": "tool_reference", "tool_name": "save_memory"}]
    assert _same_without_markers(payloads[2]["messages"][: len(payloads[1]["messages"])], payloads[1]["messages"])

    # Measured against appending the schemas to the tool block: the activation requests lose the prefix.
    appended = replay_appended(payloads)
    assert appended[1] < searched.prompt_tokens and appended[2] < called.prompt_tokens


def _same_without_markers(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> bool:
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "cache_control"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(left) == strip(right)


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
@pytest.mark.req("TD-11")
@pytest.mark.req("RN-2")
def test_on_the_openai_route_the_activation_miss_is_recorded_and_shown(worker, model_server, alice, alice_api, client):
    run = run_to_end(alice, "openai")
    requests = list(ModelRequest.objects.filter(run=run).order_by("step"))
    assert [r.step for r in requests] == [1, 2, 3]
    searched, called, answered = requests
    assert "assign_ticket" in called.tools_loaded and answered.tools_loaded == ["save_memory"]
    assert (searched.cache_miss, called.cache_miss, answered.cache_miss) == ("", "tool_activation", "tool_activation")
    # The miss is real: the loaded schemas went into `tools`, ahead of every message.
    assert called.cache_read_input_tokens < searched.prompt_tokens
    assert answered.cache_read_input_tokens < called.prompt_tokens
    events = [e.payload for e in RunEvent.objects.filter(run=run, type="cache_miss").order_by("seq")]
    assert [(e["step"], e["cause"], e["tools"]) for e in events] == [
        (2, "tool_activation", called.tools_loaded),
        (3, "tool_activation", ["save_memory"]),
    ]
    metrics = alice_api.get(f"/api/metrics/cache/?group=run&run={run.pk}").json()
    assert [(m["key"], m["requests"], m["activation_misses"]) for m in metrics] == [(str(run.pk), 3, 2)]
    detail = alice_api.get(f"/api/runs/{run.pk}/").json()
    assert [r["cache_miss"] for r in detail["model_requests"]] == ["", "tool_activation", "tool_activation"]
    client.force_login(alice)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-cause="tool_activation"' in page and "save_memory changed the prefix" in page
    assert "step 3: tool_activation on openai: loading save_memory" in page  # the timeline row
