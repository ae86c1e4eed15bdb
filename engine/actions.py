"""Running one step's tool calls: action limits, approvals, parallelism (RN-4).

Pure: no Django. The loop hands over the `tool_use` blocks of one assistant
message and gets back the `tool_result` message, results in call order.

Every call gets a plan before anything runs, in call order: over a limit (an error
observation, nothing runs, not counted), waiting for a person (the whole step
pauses: `ApprovalNeeded`), denied (an observation saying so), or run. Calls that
run are executed concurrently on a bounded thread pool; events are emitted from
the caller's thread only, because the publisher numbers them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from engine.providers.protocol import MALFORMED_ARGUMENTS
from engine.request import text_block, tool_reference
from engine.toolbox import ToolBox

Decision = Literal["approved", "denied"]
Emit = Callable[[str, dict[str, Any]], None]

# Reserved observation key: the deferred tools this call loaded. `tool_result` turns it into
# `tool_reference` blocks after the observation's text, so the schema enters the prompt where
# it was loaded and the cached prefix before it is untouched (TD-11). Never shown to the model.
LOADS_TOOLS = "_loads_tools"
# Images a tool returned (MCP image content): Anthropic image blocks that follow the observation's
# text in its tool_result, so the model sees them; never part of the observation's JSON text.
ATTACHED_IMAGES = "_images"
_NOT_TEXT = (LOADS_TOOLS, ATTACHED_IMAGES)


@dataclass(frozen=True)
class ActionLimits:
    """Caps on tool calls in one run: all tools together, and per tool name."""

    per_run: int | None = None
    per_tool: Mapping[str, int] = field(default_factory=dict)

    def refusal(self, name: str, counts: Mapping[str, int]) -> str | None:
        total = sum(counts.values())
        if self.per_run is not None and total >= self.per_run:
            return (
                f"Action limit reached: this run has already made {total} tool calls (limit {self.per_run}); "
                f"{name} did not run. Finish with what you have."
            )
        cap = self.per_tool.get(name)
        if cap is not None and counts.get(name, 0) >= cap:
            return (
                f"Action limit reached: {name} has already been called {counts.get(name, 0)} times in this run "
                f"(limit {cap}); this call did not run."
            )
        return None


@dataclass
class ApprovalNeeded(Exception):
    """The step has calls a person must decide on; the turn pauses before any of them runs."""

    step: int
    pending: list[dict[str, Any]]
    messages: list[dict[str, Any]] = field(default_factory=list)
    previous_end: int | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"approval needed for {[b['name'] for b in self.pending]} at step {self.step}"


def denied_observation(name: str) -> dict[str, Any]:
    return {"ok": False, "denied": True, "error": f"A person denied this call of {name}; it did not run."}


# Tools whose repeated identical calls are normal use, not a loop (SP-8).
REPEATABLE_TOOLS = frozenset({"scratchpad_read"})


class DuplicateCallGuard:
    """Refuses a second call of the same tool with the same arguments in one turn (SP-8)."""

    def __init__(self, repeatable: frozenset[str] = REPEATABLE_TOOLS) -> None:
        self.repeatable = repeatable
        self.seen: dict[str, int] = {}

    def check(self, tool_step: int, name: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
        if name in self.repeatable:
            return None
        key = name + "\x00" + json.dumps(arguments, sort_keys=True, default=repr)
        earlier = self.seen.setdefault(key, tool_step)
        if earlier == tool_step:
            return None
        return {
            "ok": False,
            "error": (
                f"{name} was not run: it was already called with exactly these arguments at step {earlier} "
                "of this turn, and its result is above. Use that result or change the arguments."
            ),
        }


class StepExecutor:
    def __init__(
        self,
        toolbox: ToolBox,
        emit: Emit,
        *,
        limits: ActionLimits | None = None,
        max_parallel: int = 8,
        decisions: Mapping[str, Decision] | None = None,
        counts: Mapping[str, int] | None = None,
    ) -> None:
        self.toolbox = toolbox
        self.emit = emit
        self.limits = limits or ActionLimits()
        self.max_parallel = max(1, max_parallel)
        self.decisions = dict(decisions or {})
        self.counts: dict[str, int] = dict(counts or {})
        self.guard = DuplicateCallGuard()
        # Set once a call says it was stopped by a cancel (`"cancelled": true`, OP-3).
        self.cancelled = False

    def run(self, step: int, tool_uses: list[dict[str, Any]], first_tool_step: int = 1) -> dict[str, Any]:
        counts = dict(self.counts)
        plan: list[tuple[str, Any]] = []
        pending = []
        for tool_step, block in enumerate(tool_uses, start=first_tool_step):
            name = block["name"]
            malformed = malformed_arguments(name, block.get("input") or {})
            if malformed is not None:
                plan.append(("done", malformed))
                continue
            duplicate = self.guard.check(tool_step, name, block.get("input") or {})
            if duplicate is not None:
                plan.append(("done", duplicate))
                continue
            refusal = self.limits.refusal(name, counts)
            if refusal is not None:
                plan.append(("done", {"ok": False, "limit_reached": True, "error": refusal}))
                continue
            counts[name] = counts.get(name, 0) + 1
            if self.toolbox.requires_approval(name):
                decision = self.decisions.get(block["id"])
                if decision is None:
                    # The person decides on what the tool will really receive (SP-9, SB-5).
                    pending.append(
                        {**block, "resolved_input": self.toolbox.preview_arguments(block.get("input") or {})}
                    )
                    plan.append(("wait", None))
                    continue
                if decision != "approved":
                    # Fail closed: only an explicit approval runs the call (an expired one does not).
                    plan.append(("done", denied_observation(name)))
                    continue
            plan.append(("run", (tool_step, block)))
        if pending:
            raise ApprovalNeeded(step=step, pending=pending, counts=dict(self.counts))
        self.counts = counts
        to_run = [item for kind, item in plan if kind == "run"]
        observations = iter(self._execute_all(to_run))
        results = []
        for tool_step, block, (kind, item) in zip(
            range(first_tool_step, first_tool_step + len(tool_uses)), tool_uses, plan, strict=True
        ):
            observation = next(observations) if kind == "run" else item
            self.cancelled = self.cancelled or observation.get("cancelled") is True
            payload = {"step": step, "tool_step": tool_step, "id": block["id"], "name": block["name"]}
            loads = observation.get(LOADS_TOOLS)
            if loads:
                payload["loads_tools"] = list(loads)
            self.emit("tool_result", {**payload, "output": without_loads(observation)})
            results.append(tool_result(block["id"], observation))
        return {"role": "user", "content": results}

    def _execute_all(self, calls: list[tuple[int, dict[str, Any]]]) -> list[dict[str, Any]]:
        if len(calls) <= 1 or self.max_parallel == 1:
            return [self._execute(call) for call in calls]
        with ThreadPoolExecutor(max_workers=min(self.max_parallel, len(calls)), thread_name_prefix="cc-tool") as pool:
            return list(pool.map(self._execute, calls))

    def _execute(self, call: tuple[int, dict[str, Any]]) -> dict[str, Any]:
        tool_step, block = call
        try:
            return self.toolbox.execute_step(tool_step, block["name"], block.get("input") or {})
        except Exception as exc:  # a toolbox bug must not lose the other calls' results
            return {"ok": False, "error": f"{block['name']} failed inside the runtime: {type(exc).__name__}: {exc}"}


# The history, the event log and the scratchpad are stored as text, and PostgreSQL's text and
# jsonb refuse U+0000: a NUL a tool printed (`find -print0`, `cat` of a binary) or a model wrote
# failed the whole run. It is shown as U+2400 SYMBOL FOR NULL, which says what was there.
NUL_STAND_IN = "\u2400"
# They refuse a lone surrogate too, which is what Python makes of a file name that is not UTF-8
# (os.listdir's surrogateescape: byte 0xff becomes U+DCFF) and what a model's "\udcff" decodes
# to. An escaped byte is shown as `\xff`, the byte it stands for; any other lone surrogate as U+FFFD.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _shown_surrogate(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else "\ufffd"


def _storable_text(text: str, keep_undecodable: bool) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        if keep_undecodable:
            return text  # the scratchpad stores it as the bytes it escapes
        text = _LONE_SURROGATE.sub(_shown_surrogate, text)
    return text.replace("\x00", NUL_STAND_IN) if "\x00" in text else text


def storable(value: Any, *, keep_undecodable: bool = False) -> Any:
    """`value` with its strings (keys included) storable as PostgreSQL text: NULs shown as
    NUL_STAND_IN, lone surrogates as the byte they escape or U+FFFD; bytes are kept. With
    `keep_undecodable`, a string holding lone surrogates is left whole (for the scratchpad)."""
    if isinstance(value, str):
        return _storable_text(value, keep_undecodable)
    if isinstance(value, dict):
        return {storable(key): storable(item, keep_undecodable=keep_undecodable) for key, item in value.items()}
    if isinstance(value, list):
        return [storable(item, keep_undecodable=keep_undecodable) for item in value]
    return value


def malformed_arguments(name: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
    """The tool error for arguments that were not a JSON object (a model's mistake): nothing runs."""
    if MALFORMED_ARGUMENTS not in arguments:
        return None
    raw = str(arguments[MALFORMED_ARGUMENTS])
    return {
        "ok": False,
        "error": f"The arguments for {name} were not a JSON object: {raw[:200]!r}. "
        f"Call {name} again with a JSON object that matches its input_schema.",
    }


def tool_result(tool_use_id: str, observation: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(without_loads(observation), sort_keys=True, ensure_ascii=False)
    loads = observation.get(LOADS_TOOLS) or []
    images = observation.get(ATTACHED_IMAGES) or []
    # Without loads the content stays a plain string: the same bytes as before deferral (TD-10).
    content: str | list[dict[str, Any]] = (
        [text_block(text), *images, *map(tool_reference, loads)] if loads or images else text
    )
    return {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": content,
        **({"is_error": True} if observation.get("ok") is False else {}),
    }


def result_text(block: dict[str, Any]) -> str:
    """The observation text of a tool_result block, whether or not it carries tool_reference blocks."""
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    return "".join(item.get("text", "") for item in content if item.get("type") == "text")


def result_as_text(block: dict[str, Any]) -> str:
    """A tool_result as one string: its observation text, or compact JSON when it holds more than text
    (images); the tool_reference blocks a result carries are not part of what it says."""
    content = block.get("content", "")
    if isinstance(content, list) and all(item.get("type") in ("text", "tool_reference") for item in content):
        return result_text(block)
    return content if isinstance(content, str) else json.dumps(content, sort_keys=True, ensure_ascii=False)


def without_loads(observation: dict[str, Any]) -> dict[str, Any]:
    if not any(key in observation for key in _NOT_TEXT):
        return observation
    return {key: value for key, value in observation.items() if key not in _NOT_TEXT}


def turn_observations(messages: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The observations in a turn's messages by step, numbered across the turn as the loop numbers
    them (SP-9): what a resumed turn's `{{stepN.field}}` references read."""
    steps: dict[str, int] = {}
    for message in messages:
        for block in tool_uses_of(message):
            steps[str(block.get("id"))] = len(steps) + 1
    observations: dict[int, dict[str, Any]] = {}
    for message in messages:
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if block.get("type") != "tool_result" or str(block.get("tool_use_id")) not in steps:
                continue
            try:
                observation = json.loads(result_text(block))
            except ValueError:
                continue
            if isinstance(observation, dict):
                observations[steps[str(block["tool_use_id"])]] = observation
    return observations


def tool_uses_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [block for block in content if block.get("type") == "tool_use"]
