"""Subagents sharing a prefix (TD-14): the `spawn_agents` tool and the child task.

Children of one shape get byte-identical prefixes: the same system prompt (named by
the shape, nothing per child), the same resident tools in the same order whatever the
task or profile (every built-in; children cannot spawn), and their task only in the
first user message. A prompt cache entry becomes readable only once the request that
writes it starts streaming, so a fan-out started all at once pays N writes of one
prefix. The first child starts at once; its siblings wait at a gate it opens on its
first streamed event, and the wait is bounded (`CC_SUBAGENT_RELEASE_WAIT_SECONDS`): a
slow first child costs a cache hit, never the fan-out.

Children run where runs run: Celery tasks in services mode (gate and results through
Redis), the embedded worker pool otherwise (in-process events and queues). The parent
blocks on its results, so a worker needs a free slot besides the parent's.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from typing import Any

from django.conf import settings

from agents.runtime.loop import run_turn
from agents.runtime.request import text_block

logger = logging.getLogger(__name__)

SPAWN_AGENTS = "spawn_agents"
SPAWN_AGENTS_SCHEMA = {
    "name": SPAWN_AGENTS,
    "description": (
        "Run several subagents in parallel, one per task, and get their final answers back in task order. "
        "Subagents of one shape share a cached prompt prefix; they use the same tools as you except this one."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "tasks": {
                "type": "array",
                "minItems": 1,
                "maxItems": 16,
                "items": {"type": "string", "minLength": 1},
                "description": "One self-contained instruction per subagent.",
            },
            "shape": {
                "type": "string",
                "pattern": "^[a-z][a-z0-9_-]{0,31}$",
                "description": "The kind of subagent (default 'worker'); one shape, one shared prefix.",
            },
        },
        "required": ["tasks"],
        "additionalProperties": False,
    },
}


def subagent_system(shape: str) -> list[dict[str, Any]]:
    return [
        text_block(
            f"You are a {shape} subagent in Control Center. Do the one task in the user message with the tools "
            "you have, in the conversation's workspace, and end with a short, complete answer for the agent "
            "that asked: it sees only your final text."
        )
    ]


# --- the gate and the results: Redis in services mode, in-process otherwise ---------------


class _LocalFanout:
    def __init__(self) -> None:
        self.released = threading.Event()
        self.results: queue.Queue[dict[str, Any]] = queue.Queue()


_local: dict[str, _LocalFanout] = {}
_local_lock = threading.Lock()
# SQLite has one writer; embedded children take turns at the database instead of failing with "locked".
_embedded_db_lock = threading.Lock()


def _db_turn():
    import contextlib

    return contextlib.nullcontext() if settings.CC_MODE == "services" else _embedded_db_lock


def _local_fanout(fanout_id: str) -> _LocalFanout:
    with _local_lock:
        return _local.setdefault(fanout_id, _LocalFanout())


def _redis():
    import redis

    return redis.Redis.from_url(settings.REDIS_URL)


def release_siblings(fanout_id: str, siblings: int) -> None:
    if settings.CC_MODE == "services":
        client = _redis()
        key = f"cc:fanout:{fanout_id}:gate"
        if siblings:
            client.rpush(key, *["go"] * siblings)
        client.expire(key, 3600)
    else:
        _local_fanout(fanout_id).released.set()


def wait_for_release(fanout_id: str, timeout: float) -> bool:
    if settings.CC_MODE == "services":
        deadline = time.monotonic() + timeout
        client = _redis()
        while True:
            # Short slices: a blocking pop longer than the client's socket timeout would fail.
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if client.blpop([f"cc:fanout:{fanout_id}:gate"], timeout=min(1.0, max(left, 0.01))) is not None:
                return True
    return _local_fanout(fanout_id).released.wait(timeout)


def _put_result(fanout_id: str, result: dict[str, Any]) -> None:
    if settings.CC_MODE == "services":
        client = _redis()
        client.rpush(f"cc:fanout:{fanout_id}:results", json.dumps(result))
        client.expire(f"cc:fanout:{fanout_id}:results", 3600)
    else:
        _local_fanout(fanout_id).results.put(result)


def _collect(fanout_id: str, count: int, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    results: list[dict[str, Any]] = []
    while len(results) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if settings.CC_MODE == "services":
            item = _redis().blpop([f"cc:fanout:{fanout_id}:results"], timeout=min(1.0, max(left, 0.01)))
            if item is not None:
                results.append(json.loads(item[1]))
        else:
            try:
                results.append(_local_fanout(fanout_id).results.get(timeout=left))
            except queue.Empty:
                break
    if settings.CC_MODE != "services":
        with _local_lock:
            _local.pop(fanout_id, None)
    return results


# --- the parent side ----------------------------------------------------------------


def spawn_agents(*, run_id: int, arguments: dict[str, Any]) -> dict[str, Any]:
    """Fan out one child per task and return their answers in task order (the tool's observation)."""
    from agents.dispatch import enqueue_subagent

    tasks = arguments.get("tasks")
    shape = arguments.get("shape") or "worker"
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) and t.strip() for t in tasks):
        return {"ok": False, "error": "tasks must be a non-empty list of non-empty strings."}
    if len(tasks) > 16:
        return {"ok": False, "error": f"at most 16 tasks per fan-out, not {len(tasks)}."}
    fanout_id = uuid.uuid4().hex
    for index, task in enumerate(tasks):
        enqueue_subagent(
            {"fanout_id": fanout_id, "index": index, "count": len(tasks), "parent_run_id": run_id,
             "shape": shape, "task": task}
        )  # fmt: skip
    results = sorted(_collect(fanout_id, len(tasks), settings.CC_SUBAGENT_TIMEOUT_SECONDS), key=lambda r: r["index"])
    missing = sorted(set(range(len(tasks))) - {r["index"] for r in results})
    observation: dict[str, Any] = {
        "ok": not missing and all(r["ok"] for r in results),
        "shape": shape,
        "results": [{k: r[k] for k in ("index", "ok", "text", "error") if k in r} for r in results],
    }
    if missing:
        observation["error"] = f"subagents {missing} did not answer within {settings.CC_SUBAGENT_TIMEOUT_SECONDS}s."
    return observation


class SpawningToolBox:
    """Adds `spawn_agents` after the inner toolbox's tools (the parent run only)."""

    def __init__(self, inner: Any, *, run_id: int) -> None:
        self.inner = inner
        self.run_id = run_id

    def schemas(self) -> list[dict[str, Any]]:
        return [*self.inner.schemas(), SPAWN_AGENTS_SCHEMA]

    def execute(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if name == SPAWN_AGENTS:
            return spawn_agents(run_id=self.run_id, arguments=arguments)
        return self.inner.execute(name, arguments)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.inner, attribute)


# --- the child side -----------------------------------------------------------------


def subagent_execute(job: dict[str, Any]) -> dict[str, Any]:
    """Run one child turn; the first child opens the gate on its first streamed event."""
    from agents.approvals import model_request_rows
    from agents.models import ModelRequest, Run
    from agents.providers.registry import get_provider
    from toolcatalog.builtins import WorkspaceToolBox
    from toolcatalog.workspace import workspace_root

    fanout_id, index, count = job["fanout_id"], job["index"], job["count"]
    first = index == 0
    waited = 0.0
    if not first:
        began = time.monotonic()
        wait_for_release(fanout_id, settings.CC_SUBAGENT_RELEASE_WAIT_SECONDS)
        waited = time.monotonic() - began
    opened = False

    def open_gate() -> None:
        nonlocal opened
        if first and not opened:
            opened = True
            release_siblings(fanout_id, count - 1)

    def emit(kind: str, payload: dict[str, Any]) -> None:
        if kind in ("text_delta", "tool_call", "usage"):
            open_gate()

    started_at = time.time()
    result: dict[str, Any] = {"index": index, "ok": False, "started_at": started_at, "waited_s": round(waited, 3)}
    try:
        with _db_turn():
            run = Run.objects.get(pk=job["parent_run_id"])
        # Every child gets the same resident set, whatever its task: one shape, one prefix.
        toolbox = WorkspaceToolBox(workspace_root(run.conversation_id), conversation_id=run.conversation_id)
        outcome = run_turn(
            provider=get_provider(run.provider),
            model=run.model,
            system=subagent_system(job["shape"]),
            history=[{"role": "user", "content": [text_block(job["task"])]}],
            toolbox=toolbox,
            emit=emit,
            max_steps=10,
        )
        rows = model_request_rows(run, outcome.steps)
        for row in rows:
            row.subagent = f"{fanout_id}/{index}"
        with _db_turn():
            ModelRequest.objects.bulk_create(rows)
        final = outcome.messages[-1]["content"] if outcome.messages else []
        result.update(ok=True, text="".join(b.get("text", "") for b in final if b.get("type") == "text"))
    except Exception as exc:
        logger.exception("subagent %s/%s failed", fanout_id, index)
        result.update(error=f"{type(exc).__name__}: {exc}", text="")
    finally:
        open_gate()  # a failed first child must not hold its siblings for the whole wait
        _put_result(fanout_id, result)
    return result
