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
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

Decision = Literal["approved", "denied"]
Emit = Callable[[str, dict[str, Any]], None]


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
    steps: list[Any] = field(default_factory=list)
    previous_end: int | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"approval needed for {[b['name'] for b in self.pending]} at step {self.step}"


def denied_observation(name: str) -> dict[str, Any]:
    return {"ok": False, "denied": True, "error": f"A person denied this call of {name}; it did not run."}


class StepExecutor:
    def __init__(
        self,
        toolbox: Any,
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
        needs = getattr(toolbox, "requires_approval", None)
        self._needs_approval: Callable[[str], bool] = needs if callable(needs) else (lambda name: False)

    def run(self, step: int, tool_uses: list[dict[str, Any]]) -> dict[str, Any]:
        counts = dict(self.counts)
        plan: list[tuple[str, Any]] = []
        pending = []
        for block in tool_uses:
            name = block["name"]
            refusal = self.limits.refusal(name, counts)
            if refusal is not None:
                plan.append(("done", {"ok": False, "limit_reached": True, "error": refusal}))
                continue
            counts[name] = counts.get(name, 0) + 1
            if self._needs_approval(name):
                decision = self.decisions.get(block["id"])
                if decision is None:
                    pending.append(block)
                    plan.append(("wait", None))
                    continue
                if decision == "denied":
                    plan.append(("done", denied_observation(name)))
                    continue
            plan.append(("run", block))
        if pending:
            raise ApprovalNeeded(step=step, pending=pending, counts=dict(self.counts))
        self.counts = counts
        to_run = [item for kind, item in plan if kind == "run"]
        observations = iter(self._execute_all(to_run))
        results = []
        for block, (kind, item) in zip(tool_uses, plan, strict=True):
            observation = next(observations) if kind == "run" else item
            self.emit("tool_result", {"step": step, "id": block["id"], "name": block["name"], "output": observation})
            results.append(tool_result(block["id"], observation))
        return {"role": "user", "content": results}

    def _execute_all(self, blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len(blocks) <= 1 or self.max_parallel == 1:
            return [self._execute(block) for block in blocks]
        with ThreadPoolExecutor(max_workers=min(self.max_parallel, len(blocks)), thread_name_prefix="cc-tool") as pool:
            return list(pool.map(self._execute, blocks))

    def _execute(self, block: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.toolbox.execute(block["name"], block.get("input") or {})
        except Exception as exc:  # a toolbox bug must not lose the other calls' results
            return {"ok": False, "error": f"{block['name']} failed inside the runtime: {type(exc).__name__}: {exc}"}


def tool_result(tool_use_id: str, observation: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": json.dumps(observation, sort_keys=True, ensure_ascii=False),
        **({"is_error": True} if observation.get("ok") is False else {}),
    }


def tool_uses_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [block for block in content if block.get("type") == "tool_use"]
