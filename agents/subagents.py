"""Subagents sharing a prefix (TD-14): the `spawn_agents` tool and the child task.

Children of one shape get byte-identical prefixes: the same system prompt (named by
the shape, nothing per child), the same resident tools in the same order whatever the
task or profile (the parent run's surface without `spawn_agents`: children cannot spawn;
`turns.subagent_toolboxes`). A child's profile (its role
and limits, `CC_SUBAGENT_PROFILES`) and its task come after that prefix, in its first
user message. A prompt cache entry becomes readable only once the request that writes
it starts streaming, so a fan-out started all at once pays N writes of one prefix. The
first child starts at once; its siblings wait at a gate it opens on its first streamed
event, and the wait is bounded (`CC_SUBAGENT_RELEASE_WAIT_SECONDS`): a slow first
child costs a cache hit, never the fan-out.

Each child is a `Subagent` row run by its own task, where runs run (Celery in services
mode, the embedded pool otherwise). A child pauses for approval like a run (RN-4): its
approvals belong to the parent run, so the parent's conversation shows them and its
owner decides, and any worker resumes the child. The parent polls its children's rows
until all have finished, the fan-out times out or the parent is cancelled, and returns
their answers in task order; an answer too large for the context (SP-1) goes to the
scratchpad of the parent's turn and the parent sees its id and a short summary.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.db.models import QuerySet
from django.utils import timezone

from agents.approvals import approvals_expire, subagent_payload
from agents.events import RunEventPublisher
from agents.models import Run, Subagent
from controlcenter.db import db_turn, reconnecting
from engine.request import text_block
from engine.scratchpad.offload import observation_size
from engine.scratchpad.summary import text_summary
from engine.toolbox import ToolBox, ToolBoxLayer
from scratchpad import services as scratchpad_services
from scratchpad.models import Entry

logger = logging.getLogger(__name__)

SPAWN_AGENTS = "spawn_agents"
DEFAULT_SHAPE = "worker"
DEFAULT_PROFILE = "worker"
_SHAPE_PATTERN = "^[a-z][a-z0-9_-]{0,31}$"
# What of an offloaded answer the parent sees inline: its head and tail (SP-4's summary, shorter).
ANSWER_HEAD_CHARS = 200
ANSWER_TAIL_CHARS = 100
_POLL_SECONDS = 0.1
# A child no worker has claimed after this long is run on its parent's own thread.
RUN_HERE_AFTER_SECONDS = 2.0


@dataclass(frozen=True)
class ChildDispatch:
    """How a parent's children run: sent to the workers (`enqueue`), and run on the parent's own
    thread (`run_here`) when none has claimed one for `RUN_HERE_AFTER_SECONDS`. A waiting parent
    holds a worker thread; with every thread of every worker held by waiting parents, nobody else
    would ever run their children, and each fan-out would wait out its whole timeout. The claim is
    a conditional UPDATE, so a child is run once whoever gets there first."""

    enqueue: Callable[[int], None]
    run_here: Callable[[int], None]
    # True once this worker is stopping (OP-4): it takes no new task, so its free threads sit idle,
    # and every child left queued runs here at once, each on a thread of its own. One after another
    # on the parent's thread, six 8-second children held the stop 46 s (QA).
    all_here: Callable[[], bool] = lambda: False


STOPPED_WAITING = "cancelled: its parent run stopped waiting for it."

SPAWN_AGENTS_SCHEMA = {
    "name": SPAWN_AGENTS,
    "description": (
        "Run several subagents in parallel, one per task, and get their final answers back in task order. "
        "Subagents of one shape share a cached prompt prefix; they get the same tools as you except this one "
        "(the resident set and the index of tools to load). "
        "A large answer comes back as a scratchpad id with a summary: read it with scratchpad_read. "
        f"Profiles (a subagent's role and limits): {', '.join(sorted(settings.CC_SUBAGENT_PROFILES))}; "
        f"a task given as a plain string uses {DEFAULT_PROFILE!r}."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "tasks": {
                "type": "array",
                "minItems": 1,
                "maxItems": settings.CC_SUBAGENT_MAX_CHILDREN,
                "items": {
                    "anyOf": [
                        {"type": "string", "minLength": 1},
                        {
                            "type": "object",
                            "properties": {
                                "task": {"type": "string", "minLength": 1},
                                "profile": {"type": "string", "enum": sorted(settings.CC_SUBAGENT_PROFILES)},
                            },
                            "required": ["task"],
                            "additionalProperties": False,
                        },
                    ]
                },
                "description": "One self-contained instruction per subagent, or {task, profile}.",
            },
            "shape": {
                "type": "string",
                "pattern": _SHAPE_PATTERN,
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


# --- profiles and the spawn arguments (pure) --------------------------------------------


@dataclass(frozen=True)
class Profile:
    name: str
    instructions: str
    max_steps: int
    max_actions: int


@dataclass(frozen=True)
class ChildSpec:
    task: str
    profile: str


class SpawnError(ValueError):
    """spawn_agents was called with arguments it cannot run; nothing was spawned."""


def subagent_profiles() -> dict[str, Profile]:
    """`CC_SUBAGENT_PROFILES` as profiles; a malformed entry is a configuration error that names it."""
    profiles = {}
    for name, raw in settings.CC_SUBAGENT_PROFILES.items():
        try:
            profile = Profile(
                name=name,
                instructions=str(raw["instructions"]),
                max_steps=int(raw.get("max_steps", 10)),
                max_actions=int(raw.get("max_actions", settings.CC_RUN_MAX_ACTIONS)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"CC_SUBAGENT_PROFILES[{name!r}] is malformed ({exc!r}); see settings.py") from None
        if not profile.instructions.strip() or profile.max_steps < 1 or profile.max_actions < 1:
            raise ValueError(f"CC_SUBAGENT_PROFILES[{name!r}] needs instructions, max_steps ≥ 1, max_actions ≥ 1.")
        profiles[name] = profile
    return profiles


def parse_spawn(arguments: Any, *, profiles: dict[str, Profile], max_children: int) -> tuple[str, list[ChildSpec]]:
    """The shape and one spec per child, or `SpawnError` saying exactly what is wrong."""
    if not isinstance(arguments, dict):
        raise SpawnError(f"the arguments must be an object with 'tasks'; got {type(arguments).__name__}.")
    unknown = sorted(set(arguments) - {"tasks", "shape"})
    if unknown:
        raise SpawnError(f"unknown argument(s) {', '.join(map(repr, unknown))}; it takes 'tasks' and 'shape'.")
    shape = arguments.get("shape", DEFAULT_SHAPE)
    if not isinstance(shape, str) or not re.fullmatch(_SHAPE_PATTERN, shape):
        raise SpawnError(f"shape must match {_SHAPE_PATTERN} (e.g. 'worker'); got {shape!r}.")
    tasks = arguments.get("tasks")
    if not isinstance(tasks, list):
        raise SpawnError(f"tasks must be a list of 1 to {max_children} tasks; got {type(tasks).__name__}.")
    if not 1 <= len(tasks) <= max_children:
        raise SpawnError(f"tasks has {len(tasks)} items; one call runs 1 to {max_children} subagents.")
    known = ", ".join(sorted(profiles))
    children = []
    for position, item in enumerate(tasks):
        if isinstance(item, str):
            item = {"task": item}
        if not isinstance(item, dict):
            raise SpawnError(f"tasks[{position}] must be a string or an object {{task, profile}}; got {item!r}.")
        extra = sorted(set(item) - {"task", "profile"})
        if extra:
            raise SpawnError(f"tasks[{position}] has unknown key(s) {', '.join(map(repr, extra))}.")
        task, profile = item.get("task"), item.get("profile", DEFAULT_PROFILE)
        if not isinstance(task, str) or not task.strip():
            raise SpawnError(f"tasks[{position}] has no task: give a non-empty string.")
        if profile not in profiles:
            raise SpawnError(f"tasks[{position}].profile {profile!r} is not a profile; the profiles are: {known}.")
        children.append(ChildSpec(task=task, profile=profile))
    return shape, children


def subagent_history(*, profile: Profile, task: str) -> list[dict[str, Any]]:
    """The child's first (and only) user message: its role and limits, then its task, after the shared prefix."""
    role = (
        f"Your profile: {profile.name}. {profile.instructions} "
        f"You have at most {profile.max_steps} model steps and {profile.max_actions} tool calls."
    )
    return [{"role": "user", "content": [text_block(role), text_block(task)]}]


# --- the gate: Redis in services mode, in-process otherwise -----------------------------


_local_gates: dict[str, threading.Event] = {}
_local_lock = threading.Lock()


def _local_gate(fanout_id: str) -> threading.Event:
    with _local_lock:
        return _local_gates.setdefault(fanout_id, threading.Event())


def _redis() -> redis.Redis:
    if settings.REDIS_URL is None:
        raise ImproperlyConfigured("Redis is used in services mode only, and REDIS_URL is not set.")
    return redis.Redis.from_url(settings.REDIS_URL)


def release_siblings(fanout_id: str, siblings: int) -> None:
    if settings.CC_MODE == "services":
        client = _redis()
        key = f"cc:fanout:{fanout_id}:gate"
        if siblings:
            client.rpush(key, *["go"] * siblings)
        client.expire(key, 3600)
    else:
        _local_gate(fanout_id).set()


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
    return _local_gate(fanout_id).wait(timeout)


# --- the children's progress, live in the parent's card (UX-4) -------------------------

# A child's answer in its `subagent_status` event; the whole answer reaches the parent's observation.
EVENT_ANSWER_CHARS = 4000


def subagent_event(publisher: RunEventPublisher, child: Subagent, kind: str, payload: dict[str, Any]) -> None:
    """A child's status, tool call or tool result, stored in its parent run's event log.

    The conversation page draws them in the parent's card, live and after a reload (the log
    replays); the stored fan-out observation stays the record once the run has ended."""
    with db_turn():
        publisher.publish(kind, {"subagent": subagent_payload(child), **payload})


def subagent_status_event(publisher: RunEventPublisher, child: Subagent, status: str, **details: str) -> None:
    if details.get("answer"):
        details["answer"] = details["answer"][:EVENT_ANSWER_CHARS]
    subagent_event(publisher, child, "subagent_status", {"status": status, **details})


# --- the parent side ----------------------------------------------------------------


def spawn_agents(*, run_id: int, arguments: dict[str, Any], children: ChildDispatch) -> dict[str, Any]:
    """Fan out one child per task and return their answers in task order (the tool's observation)."""
    try:
        shape, specs = parse_spawn(
            arguments, profiles=subagent_profiles(), max_children=settings.CC_SUBAGENT_MAX_CHILDREN
        )
    except SpawnError as exc:
        return {"ok": False, "error": f"spawn_agents did not start any subagent: {exc}"}
    parent = Run.objects.get(pk=run_id)
    fanout_id = uuid.uuid4().hex
    with db_turn(), transaction.atomic():
        created = Subagent.objects.bulk_create(
            Subagent(parent=parent, fanout_id=fanout_id, index=index, count=len(specs), shape=shape,
                     profile=spec.profile, task=spec.task)
            for index, spec in enumerate(specs)
        )  # fmt: skip
    with db_turn():
        publisher = RunEventPublisher(parent)
    for child in created:
        subagent_status_event(publisher, child, Run.Status.QUEUED)
    for child in created:
        children.enqueue(child.pk)
    finished, waited_out = _await_children(parent_id=run_id, fanout_id=fanout_id, dispatch=children)
    observation = fanout_observation(parent=parent, shape=shape, children=finished, waited_out=waited_out)
    if reconnecting(Run.objects.filter(pk=run_id, cancel_requested=True).exists):
        observation["cancelled"] = True  # the parent run was cancelled: its turn ends here (OP-3)
    return observation


def _await_children(*, parent_id: int, fanout_id: str, dispatch: ChildDispatch) -> tuple[list[Any], bool]:
    """Poll the children's rows until all have finished, the parent is cancelled, or the wait runs
    out; run here, lowest index first, a child left queued for `RUN_HERE_AFTER_SECONDS`. The polls
    reconnect: a PostgreSQL drop during a long wait failed `spawn_agents`, so the parent went on
    without its children and they were cancelled as orphans (QA)."""
    deadline = time.monotonic() + settings.CC_SUBAGENT_TIMEOUT_SECONDS
    queued_since: dict[int, float] = {}
    started_here: set[int] = set()
    fanout = Subagent.objects.filter(fanout_id=fanout_id).order_by("index")
    parent_gone = Run.objects.filter(pk=parent_id).exclude(status=Run.Status.RUNNING, cancel_requested=False)
    while True:
        children = reconnecting(lambda: list(fanout.all()))
        if all(child.is_finished for child in children):
            return children, False
        timed_out = time.monotonic() >= deadline
        if timed_out or reconnecting(parent_gone.exists):
            subagents_cancel(parent_id=parent_id, fanout_id=fanout_id)
            return reconnecting(lambda: list(fanout.all())), timed_out
        now = time.monotonic()
        # Queued again after an approval counts from then: the row's status is what is watched.
        queued_since = {c.pk: queued_since.get(c.pk, now) for c in children if c.status == Run.Status.QUEUED}
        unclaimed = [pk for pk, since in queued_since.items() if now - since >= RUN_HERE_AFTER_SECONDS]
        if unclaimed and dispatch.all_here():
            for pk in unclaimed:
                if pk not in started_here:  # its thread may not have claimed it yet
                    started_here.add(pk)
                    threading.Thread(target=_run_on_own_thread, args=(dispatch.run_here, pk), daemon=True).start()
        elif unclaimed:
            dispatch.run_here(unclaimed[0])
            continue
        time.sleep(_POLL_SECONDS)


def _run_on_own_thread(run_here: Callable[[int], None], child_id: int) -> None:
    try:
        run_here(child_id)
    except Exception:  # a child's own failure is stored by its run; this is what escaped it
        logger.exception("subagent %s failed on its own thread", child_id)
    finally:
        connections.close_all()


def fanout_observation(*, parent: Any, shape: str, children: list[Any], waited_out: bool) -> dict[str, Any]:
    """The answers in task order; any that would make the observation too large go to the scratchpad (SP-1)."""
    results = []
    for child in children:
        item: dict[str, Any] = {"index": child.index, "profile": child.profile, "ok": child.status == "succeeded"}
        if item["ok"]:
            item["text"] = child.answer
        elif child.is_finished:
            item["error"] = child.error or f"the subagent ended {child.status}."
        else:  # still running: asked to stop at its next check
            item["error"] = STOPPED_WAITING
        results.append(item)
    observation: dict[str, Any] = {"ok": all(item["ok"] for item in results), "shape": shape, "results": results}
    stopped = [item["index"] for item in results if item.get("error") == STOPPED_WAITING]
    failed = [item["index"] for item in results if not item["ok"] and item["index"] not in stopped]
    errors = []
    if stopped:
        errors.append(
            f"subagents {stopped} did not answer within {settings.CC_SUBAGENT_TIMEOUT_SECONDS}s and were cancelled."
            if waited_out
            else f"subagents {stopped} were cancelled with this run."
        )
    if failed:
        errors.append(f"subagents {failed} did not finish; see their errors.")
    if errors:
        observation["error"] = " ".join(errors)
    threshold = settings.SCRATCHPAD_THRESHOLD_BYTES
    # Each answer above the threshold, then the largest of the rest while the whole is still too large.
    for item in results:
        if "text" in item and observation_size(item) > threshold:
            _offload_answer(parent, item)
    inline = sorted((item for item in results if "text" in item), key=lambda item: -len(item["text"]))
    for item in inline:
        if observation_size(observation) <= threshold:
            break
        _offload_answer(parent, item)
    return observation


def _offload_answer(parent: Any, item: dict[str, Any]) -> None:
    """Store one child's answer in the scratchpad of the parent's turn; the item keeps its id and a summary.

    Within the owner's scratchpad quota, as any offload: past it, the parent gets the summary alone."""
    text = item.pop("text")
    with db_turn():
        entry = scratchpad_services.put_within_quota(
            turn_id=str(parent.pk),
            content=text,
            kind="text",
            executor_name=SPAWN_AGENTS,
            run_id=parent.pk,
            conversation_id=parent.conversation_id,
            metadata={"subagent": item["index"], "profile": item["profile"]},
            payload_field="text",
            payload_encoding="text",
            envelope={k: v for k, v in item.items()},
        )
    summary = text_summary(text, head=ANSWER_HEAD_CHARS, tail=ANSWER_TAIL_CHARS)
    if not isinstance(entry, Entry):
        full = scratchpad_services.full_scratchpad_note(entry)
        item.update(summary=summary, _note=f"The whole answer is too large for the context and was NOT saved: {full}")
        return
    item.update(
        scratchpad_id=entry.pk,
        size_bytes=entry.size_bytes,
        summary=summary,
        _note=f"The answer is in the scratchpad as {entry.pk}; read it with scratchpad_read.",
    )


def subagents_cancel(*, parent_id: int, fanout_id: str | None = None) -> int:
    """Cancel a run's unfinished children: queued or waiting at once, running ones at their next check."""
    children = Subagent.objects.filter(parent_id=parent_id)
    if fanout_id is not None:
        children = children.filter(fanout_id=fanout_id)
    stopped = subagents_end(
        children.filter(status__in=[Run.Status.QUEUED, Run.Status.WAITING]),
        Run.Status.CANCELLED,
        error=STOPPED_WAITING,
        cancel_requested=True,
    )
    with db_turn():
        children.filter(status=Run.Status.RUNNING).update(cancel_requested=True)
        if stopped:
            approvals_expire(run_id=parent_id, subagents_only=True)
    return stopped


def subagents_end(children: QuerySet[Subagent], status: str, *, error: str, **also: Any) -> int:
    """End the children `children` selects (each still as selected when it is ended), and tell the
    pages watching their parents (`subagent_status`): a child failed by the reaper or cancelled in
    bulk stayed "running" on every live view, and in every catch-up, until the parent ended (QA)."""
    ended = 0
    for child in reconnecting(lambda: list(children.select_related("parent"))):
        with db_turn():
            if not children.filter(pk=child.pk).update(status=status, finished_at=timezone.now(), error=error, **also):
                continue  # it moved on meanwhile: whoever moved it says so
            publisher = RunEventPublisher(child.parent)
        subagent_status_event(publisher, child, status, error=error)
        ended += 1
    return ended


class SpawningToolBox(ToolBoxLayer):
    """Adds `spawn_agents` after the inner toolbox's tools (the parent run only)."""

    def __init__(self, inner: ToolBox, *, run_id: int, children: ChildDispatch | None) -> None:
        super().__init__(inner)
        self.run_id = run_id
        # None where the stack is only described (the Context view), never executed.
        self.children = children

    def schemas(self) -> list[dict[str, Any]]:
        return [*self.inner.schemas(), SPAWN_AGENTS_SCHEMA]

    def execute(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if name == SPAWN_AGENTS:
            if self.children is None:
                raise RuntimeError("this toolbox describes the tools of a turn; it does not run them")
            return spawn_agents(run_id=self.run_id, arguments=arguments, children=self.children)
        return self.inner.execute(name, arguments)

    def execute_step(self, step: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.execute(name, arguments) if name == SPAWN_AGENTS else self.inner.execute_step(step, name, arguments)
