"""Subagents in a small window (LM-2): a fan-out whose children fit an 8,192-token window and share a prefix."""

from __future__ import annotations

import copy
import json
import threading
import uuid
from typing import Any

import pytest
from django.db import connection

from agents.lifecycle import run_execute
from agents.models import ModelRequest, Run, RunEvent, Subagent
from controlcenter.processes import WorkerProcess, services_env
from conversations.models import Conversation, Message
from engine.emulator import Emulator
from engine.emulator.server import EmulatorServer
from engine.tokens import estimate_json_tokens, estimate_text_tokens
from engine.window import budget_for_window
from scratchpad.models import Entry
from tests.support.catalog import CATALOG_PATH
from toolcatalog.services import catalog_import
from toolcatalog.workspace import workspace_root

WINDOW = 8192
MODEL = "claude-sonnet-4-5"
BUDGET = budget_for_window(WINDOW)
PART_STEPS = 8  # two reads of the notes a step: far more than the window holds
LOG_TASK = "Read big.log and say what it shows."
PARTS_TASK = "Read notes.txt part by part and summarise it."
# What a parent can hand a child in one call at this window (its reply is at most 2,048 tokens).
LONG_TASK = (
    PARTS_TASK
    + " Background: "
    + " ".join(f"Host {n % 9} drained queue {n} in {n % 13} ms during the night shift." for n in range(80))
)
TASKS = [LOG_TASK, PARTS_TASK, LONG_TASK]


def is_child(payload: dict[str, Any]) -> bool:
    return "subagent" in payload["system"][0]["text"]


def task_of(payload: dict[str, Any]) -> str:
    return payload["messages"][0]["content"][-1]["text"]


def read(offset: int) -> dict[str, Any]:
    return {"type": "tool_use", "name": "read_file", "input": {"path": "notes.txt", "offset": offset, "limit": 25}}


class Policy:
    """The parent fans out; the log child reads an 800 KB log once, the others read the notes for eight steps."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.children: list[dict[str, Any]] = []
        self.parents: list[dict[str, Any]] = []

    def __call__(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        with self.lock:
            (self.children if is_child(payload) else self.parents).append(copy.deepcopy(payload))
        step = sum(1 for message in payload["messages"] if message["role"] == "assistant")
        if not is_child(payload):
            if step == 0:
                return [{"type": "tool_use", "name": "spawn_agents", "input": {"tasks": TASKS}}]
            return [{"type": "text", "text": "The children answered."}]
        if task_of(payload) == LOG_TASK:
            if step == 0:
                return [{"type": "tool_use", "name": "read_file", "input": {"path": "big.log", "limit": 20_000}}]
            return [{"type": "text", "text": "The log shows steady traffic."}]
        if step < PART_STEPS:
            return [read(1 + 50 * step), read(26 + 50 * step)]
        return [{"type": "text", "text": "The notes are summarised."}]


@pytest.fixture
def small_fanout(settings, tmp_path):
    """The parent runs here with an 8K window's settings; its children on a real worker whose settings
    see CC_CONTEXT_WINDOW_TOKENS=8192; both against an emulator that refuses what passes that window."""
    policy = Policy()
    emulator = Emulator(policy=policy, context_window=WINDOW)
    settings.CC_CONTEXT_WINDOW_TOKENS = WINDOW
    settings.CC_MAX_OUTPUT_TOKENS = BUDGET.max_output_tokens
    settings.CC_COMPACT_AT_PERCENT = BUDGET.compact_at_percent
    settings.CC_COMPACT_TO_PERCENT = BUDGET.compact_to_percent
    settings.CC_COMPACT_TAIL_TOKENS = BUDGET.compact_tail_tokens
    settings.CC_PRUNE_MIN_TOKENS = BUDGET.prune_min_tokens
    settings.SCRATCHPAD_THRESHOLD_BYTES = BUDGET.scratchpad_threshold_bytes
    settings.SCRATCHPAD_SUMMARY_CHARS = BUDGET.summary_chars
    settings.CC_SNAPSHOT_PAGE_PIXELS = BUDGET.page_pixels
    settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.CC_RUN_QUEUE = f"small-fanout-{uuid.uuid4().hex[:8]}"
    settings.CC_TOOL_AUTO_APPROVE = []
    with EmulatorServer(emulator) as server:
        settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL = "test-key", server.base_url
        env = services_env(connection.settings_dict["NAME"])
        env.update(
            ANTHROPIC_API_KEY="test-key",
            ANTHROPIC_BASE_URL=server.base_url,
            CC_WORKSPACE_ROOT=str(settings.CC_WORKSPACE_ROOT),
            CC_RUN_QUEUE=settings.CC_RUN_QUEUE,
            CC_TOOL_AUTO_APPROVE="",
            CC_CONTEXT_WINDOW_TOKENS=str(WINDOW),
            # A loaded machine must not let siblings start before the first child wrote the prefix.
            CC_SUBAGENT_RELEASE_WAIT_SECONDS="60",
        )
        worker = WorkerProcess(
            env, f"small-children-{uuid.uuid4().hex[:6]}@%h", tmp_path / "children.log",
            concurrency=3,
        )  # fmt: skip
        try:
            worker.wait_ready()
            yield emulator, policy, worker
        finally:
            worker.stop()


def _without_stubs(payload: dict[str, Any], full: dict[str, Any]) -> dict[str, Any]:
    """`payload` with every elided tool result as the child first saw it whole."""
    out = copy.deepcopy(payload)
    for message in out["messages"]:
        for index, block in enumerate(message["content"] if isinstance(message["content"], list) else []):
            if block.get("type") == "tool_result" and block["tool_use_id"] in full:
                # Its markers stay where this request put them, not where the earlier one did.
                whole = {k: v for k, v in full[block["tool_use_id"]].items() if k != "cache_control"}
                message["content"][index] = {
                    **whole,
                    **({"cache_control": block["cache_control"]} if "cache_control" in block else {}),
                }
    return out


def _stubbed(block: dict[str, Any]) -> bool:
    return block.get("type") == "tool_result" and json.dumps(block.get("content")).startswith('"[elided: ')


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("LM-2")
def test_a_fan_out_in_an_8k_window_keeps_every_child_request_inside_it_and_siblings_share_one_prefix(
    small_fanout,
    alice,
    parent_worker,
):
    emulator, policy, worker = small_fanout
    catalog_import(text=CATALOG_PATH.read_text(encoding="utf-8"))
    conversation = Conversation.objects.create(owner=alice, title="small fan-out")
    root = workspace_root(conversation.pk)
    root.mkdir(parents=True, exist_ok=True)
    (root / "notes.txt").write_text(
        "".join(f"note {n}: the service handled its queue in {n % 17} ms\n" for n in range(400))
    )
    line = "2026-12-02T10:00:00 INFO request handled in {:>4} ms by worker {:>2} for /api/items/{:06d}\n"
    (root / "big.log").write_text("".join(line.format(n % 997, n % 16, n) for n in range(11_000)))
    trigger = Message.objects.create(conversation=conversation, role="user", content=[{"type": "text", "text": "go"}])
    conversation.tip = trigger
    conversation.save()
    run = Run.objects.create(conversation=conversation, trigger=trigger, provider="anthropic", model=MODEL)

    run_execute(run_id=run.pk, worker=parent_worker)

    run.refresh_from_db()
    log = worker.log_path.read_text()[-4000:]
    assert run.status == Run.Status.SUCCEEDED, (run.error, log)
    children = list(Subagent.objects.filter(parent=run).order_by("index"))
    assert [child.status for child in children] == ["succeeded"] * 3, ([child.error for child in children], log)

    # Every request of every child, and of the parent, fits the window with the reply it asked room for.
    requests = [*policy.children, *policy.parents]
    uses = [(emulator.prompt_tokens(p) + p["max_tokens"]) / WINDOW for p in requests]
    assert max(uses) <= 1.0, uses
    by_task: dict[str, list[dict[str, Any]]] = {}
    for payload in policy.children:
        by_task.setdefault(task_of(payload), []).append(payload)
    assert [len(by_task[task]) for task in TASKS] == [2, PART_STEPS + 1, PART_STEPS + 1]
    # Children ask for the window's reply size, as the parent does, not a 200K window's 4,096.
    assert max(p["max_tokens"] for p in requests) == BUDGET.max_output_tokens

    # The log went to the child's own scratchpad (SP-1): it sees a summary, never 800 KB.
    log_child = children[0]
    assert Entry.objects.filter(turn_id=f"subagent-{log_child.pk}", executor_name="read_file").count() == 1
    seen = by_task[LOG_TASK][-1]["messages"][-1]["content"][0]
    assert "scratchpad_id" in json.dumps(seen) and len(json.dumps(seen)) < BUDGET.scratchpad_threshold_bytes * 2

    # The readers' turns outgrew the window: their older results went as stubs (the room the loop
    # made), and without them the last request would not have fit with its reply.
    for task in (PARTS_TASK, LONG_TASK):
        payloads = by_task[task]
        full = {
            block["tool_use_id"]: block
            for payload in payloads
            for message in payload["messages"]
            for block in (message["content"] if isinstance(message["content"], list) else [])
            if block.get("type") == "tool_result" and not _stubbed(block)
        }
        last = payloads[-1]
        assert any(_stubbed(b) for m in last["messages"] if isinstance(m["content"], list) for b in m["content"])
        whole = _without_stubs(last, full)
        assert emulator.prompt_tokens(whole) + last["max_tokens"] > WINDOW, task
    compactions = RunEvent.objects.filter(run=run, type="subagent_compaction")
    assert {event.payload["subagent"]["index"] for event in compactions} == {1, 2}
    assert all(event.payload["rung"] == "elide" for event in compactions)

    # Siblings share one prefix: the same tools and system, whatever the task; the tools fit their share.
    first = {task: by_task[task][0] for task in TASKS}
    assert len({json.dumps([p["tools"], p["system"]], sort_keys=True) for p in first.values()}) == 1
    sample = first[LOG_TASK]
    index = sum(estimate_text_tokens(b["text"]) for b in sample["system"] if b["text"].startswith("Deferred tools"))
    tools = estimate_json_tokens([{k: v for k, v in t.items() if k != "cache_control"} for t in sample["tools"]])
    assert tools + index <= WINDOW * 0.25, (tools, index)
    # The first child writes the shared tools + system prefix (1h); each sibling reads exactly that.
    rows = ModelRequest.objects.filter(run=run, step=1).exclude(subagent="")
    by_index = {int(row.subagent.split("/")[1]): row for row in rows}
    assert sorted(by_index) == [0, 1, 2]
    writer = by_index[0]
    assert writer.cache_creation_1h_input_tokens > 0 and writer.cache_read_input_tokens == 0
    for sibling in (by_index[1], by_index[2]):
        assert sibling.cache_read_input_tokens == writer.cache_creation_1h_input_tokens
        assert sibling.cache_creation_1h_input_tokens == 0
        assert sibling.breakpoints == writer.breakpoints
