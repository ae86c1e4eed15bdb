"""Cache ratio of a simulated agent session under three breakpoint strategies (TD-13).

An agent session is replayed against the emulator: a constant tool block and
system prompt, then turns of several steps, each step an assistant message that
interleaves text with tool calls (no runs, so every block is a position) and a
user message with the results. The strategies:

- `td13`: tools (1h), system (1h), end of the previous request (5m), end of this one (5m);
- `end_only`: one marker at the end of each request;
- `none`: no markers.

Cache ratio = cache reads / all prompt tokens (TD-15). Also reports the
emulator's own speed, in requests per second, for the td13 run.
"""

from __future__ import annotations

import time
from argparse import ArgumentParser
from typing import Any

from bench._options import non_negative, non_negative_number, positive
from engine.emulator import Emulator, TestClock

STRATEGIES = ("td13", "end_only", "none")


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--turns", type=positive, default=10)
    parser.add_argument("--steps", type=positive, default=3, help="requests per turn")
    parser.add_argument("--calls", type=non_negative, default=12, help="tool calls per step, interleaved with text")
    parser.add_argument("--tools", type=positive, default=24, help="resident tools")
    parser.add_argument(
        "--seconds-per-step", type=non_negative_number, default=20.0, help="test-clock time between requests"
    )


def _marked(block: dict[str, Any], ttl: str) -> dict[str, Any]:
    return {**block, "cache_control": {"type": "ephemeral", **({"ttl": "1h"} if ttl == "1h" else {})}}


def _payload(strategy: str, tools, system, messages, previous_end: int | None) -> dict[str, Any]:
    tools, system = list(tools), list(system)
    messages = [{**m, "content": list(m["content"])} for m in messages]
    if strategy == "td13":
        tools[-1] = _marked(tools[-1], "1h")
        system[-1] = _marked(system[-1], "1h")
        if previous_end is not None and previous_end < len(messages) - 1:
            messages[previous_end]["content"][-1] = _marked(messages[previous_end]["content"][-1], "5m")
    if strategy in ("td13", "end_only"):
        messages[-1]["content"][-1] = _marked(messages[-1]["content"][-1], "5m")
    return {"model": "claude-sonnet-4-5", "max_tokens": 1024, "tools": tools, "system": system, "messages": messages}


def _session(strategy: str, options: dict[str, Any]) -> dict[str, float]:
    clock = TestClock()
    emulator = Emulator(clock=clock)
    tools = [
        {
            "name": f"tool_{n}",
            "description": f"Tool number {n}: " + "does a useful thing with files and tickets. " * 12,
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
        }
        for n in range(options["tools"])
    ]
    system = [{"type": "text", "text": "You are the Control Center agent. Follow the rules. " * 120}]
    messages: list[dict[str, Any]] = []
    previous_end: int | None = None
    totals = {"read": 0, "write": 0, "input": 0, "requests": 0}
    started = time.perf_counter()
    for turn in range(options["turns"]):
        messages.append(
            {"role": "user", "content": [{"type": "text", "text": f"Turn {turn}: please continue the work."}]}
        )
        for step in range(options["steps"]):
            usage = emulator.measure(_payload(strategy, tools, system, messages, previous_end))
            totals["read"] += usage.cache_read_input_tokens
            totals["write"] += usage.cache_creation_input_tokens
            totals["input"] += usage.input_tokens
            totals["requests"] += 1
            previous_end = len(messages) - 1
            clock.advance(options["seconds_per_step"])
            content: list[dict[str, Any]] = []
            results = []
            for call in range(options["calls"]):
                call_id = f"toolu_{turn}_{step}_{call}"
                content.append({"type": "text", "text": f"Now checking item {call}."})
                content.append({"type": "tool_use", "id": call_id, "name": "tool_1", "input": {"path": f"f{call}"}})
                results.append({"type": "tool_result", "tool_use_id": call_id, "content": "ok " * 40})
            messages.append({"role": "assistant", "content": content})
            messages.append({"role": "user", "content": results})
    elapsed = time.perf_counter() - started
    prompt = totals["read"] + totals["write"] + totals["input"]
    return {
        "cache_ratio": round(totals["read"] / prompt, 4) if prompt else 0.0,
        "prompt_tokens": prompt,
        "requests_per_second": round(totals["requests"] / elapsed, 1) if elapsed else 0.0,
    }


def run(options: dict[str, Any]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for strategy in STRATEGIES:
        result = _session(strategy, options)
        figures[f"{strategy}_cache_ratio"] = result["cache_ratio"]
        figures[f"{strategy}_prompt_tokens"] = result["prompt_tokens"]
        if strategy == "td13":
            figures["emulator_requests_per_second"] = result["requests_per_second"]
    return figures
