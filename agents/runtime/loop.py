"""One agent turn: build the request, stream from the provider, run tool calls, repeat.

Pure Python: the caller hands in the history, a provider, a toolbox and an `emit`
callback, and gets back the messages the turn produced. Nothing here writes to a
database; the service persists the outcome at the turn boundary (CH-5).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agents.providers.base import MessageDone, Provider, TextDelta, ToolUseBlock, Usage
from agents.runtime.request import ModelRequestSpec

Emit = Callable[[str, dict[str, Any]], None]


class ToolBox(Protocol):
    def schemas(self) -> list[dict[str, Any]]:
        """Tool definitions to offer the model on the next request."""
        ...

    def execute(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Run a tool and return its observation; tool failures are observations, not exceptions."""
        ...


@runtime_checkable
class NumberedToolBox(ToolBox, Protocol):
    def execute_step(self, step: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Like `execute`, told which tool call of the turn this is (1-based), for `{{stepN}}` references."""
        ...


# Tools whose repeated identical calls are normal use, not a loop (SP-8).
REPEATABLE_TOOLS = frozenset({"scratchpad_read"})


class DuplicateCallGuard:
    """Refuses a second call of the same tool with the same arguments in one turn (SP-8)."""

    def __init__(self, repeatable: frozenset[str] = REPEATABLE_TOOLS) -> None:
        self.repeatable = repeatable
        self.seen: dict[str, int] = {}

    def check(self, step: int, name: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
        if name in self.repeatable:
            return None
        key = name + "\x00" + json.dumps(arguments, sort_keys=True, default=repr)
        earlier = self.seen.setdefault(key, step)
        if earlier == step:
            return None
        return {
            "ok": False,
            "error": (
                f"{name} was not run: it was already called with exactly these arguments at step {earlier} "
                "of this turn, and its result is above. Use that result or change the arguments."
            ),
        }


class TurnCancelled(Exception):
    """Someone asked the run to stop; nothing of the turn is kept."""


@dataclass(frozen=True)
class StepRecord:
    step: int
    usage: Usage
    stop_reason: str
    duration_ms: int
    breakpoints: list[str]


@dataclass
class TurnOutcome:
    messages: list[dict[str, Any]] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    stop_reason: str = ""


def run_turn(
    *,
    provider: Provider,
    model: str,
    system: list[dict[str, Any]],
    history: list[dict[str, Any]],
    toolbox: ToolBox,
    emit: Emit,
    max_steps: int = 25,
    is_cancelled: Callable[[], bool] = lambda: False,
) -> TurnOutcome:
    outcome = TurnOutcome()
    guard = DuplicateCallGuard()
    tool_step = 0
    for step in range(1, max_steps + 1):
        if is_cancelled():
            raise TurnCancelled()
        request = ModelRequestSpec(
            model=model,
            system=system,
            tools=toolbox.schemas(),
            messages=[*history, *outcome.messages],
        )
        started = time.monotonic()
        done: MessageDone | None = None
        for event in provider.stream(request):
            if isinstance(event, TextDelta):
                emit("text_delta", {"step": step, "text": event.text})
            elif isinstance(event, ToolUseBlock):
                emit("tool_call", {"step": step, "id": event.id, "name": event.name, "input": event.input})
            elif isinstance(event, MessageDone):
                done = event
            if is_cancelled():
                raise TurnCancelled()
        if done is None:
            raise RuntimeError(f"provider {provider.name} ended the stream without a final message")
        duration_ms = int((time.monotonic() - started) * 1000)
        outcome.steps.append(StepRecord(step, done.usage, done.stop_reason, duration_ms, list(request.breakpoints)))
        emit("usage", {"step": step, **_usage_dict(done.usage)})
        outcome.messages.append({"role": "assistant", "content": done.content})

        tool_uses = [block for block in done.content if block.get("type") == "tool_use"]
        if not tool_uses:
            outcome.stop_reason = done.stop_reason
            return outcome
        results = []
        for block in tool_uses:
            tool_step += 1
            arguments = block.get("input") or {}
            observation = guard.check(tool_step, block["name"], arguments)
            if observation is None:
                if isinstance(toolbox, NumberedToolBox):
                    observation = toolbox.execute_step(tool_step, block["name"], arguments)
                else:
                    observation = toolbox.execute(block["name"], arguments)
            emit(
                "tool_result",
                {"step": step, "tool_step": tool_step, "id": block["id"], "name": block["name"], "output": observation},
            )
            results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": block["id"],
                    "content": json.dumps(observation, sort_keys=True, ensure_ascii=False),
                    **({"is_error": True} if observation.get("ok") is False else {}),
                }
            )
        outcome.messages.append({"role": "user", "content": results})
    outcome.stop_reason = "max_steps"
    return outcome


def _usage_dict(usage: Usage) -> dict[str, int]:
    return {
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "output_tokens": usage.output_tokens,
    }
