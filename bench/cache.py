"""A scripted 40-turn agent session through the real loop against the emulator (TD-11, TD-13, TD-14).

`python manage.py bench cache --json [--catalog FILE] [--turns 40]`

The session runs `agents.runtime.loop.run_turn` with the in-process emulator provider
(its cache rules, test clock: 20 s per request, 60 s between turns) and the built-in
tools in a temporary workspace. Scripted turns: file reads and listings; activations of
catalog tools (turns 5, 15, 25, 35: the schema is appended after the resident block);
a turn with 30 parallel calls (turn 10); a large observation (turn 20, a ~25k-token
file); a fan-out of 5 subagents (turn 30, gated as `agents.subagents` does: the first
child streams before its siblings begin).

What this branch does not have, and so the session does not exercise: the deferred
tool index and `search_tools` (catalog branch), the scratchpad offload of large
observations (scratchpad branch), pruning rewrites (history branch). `rewrites`
counts requests that were not append-only over the previous request of their turn
chain (0 expected without pruning).

Baselines replay the same session: `no_deferral` (all catalog tools resident),
`last_message_breakpoint_only` (one 5m marker at the end), `tools_appended_on_activation`
(an activated schema merged into the sorted tool block, as a naive harness would).
"""

from __future__ import annotations

import json
import tempfile
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from agents.providers.emulator import Emulator, TestClock
from agents.providers.inprocess import EmulatorProvider
from agents.runtime.cache import place_breakpoints, prefix_bytes
from agents.runtime.loop import run_turn
from agents.runtime.request import CachePoint, ModelRequestSpec, text_block
from agents.subagents import SPAWN_AGENTS, SPAWN_AGENTS_SCHEMA, subagent_system
from toolcatalog.builtins import BUILTINS, WorkspaceToolBox

MODEL = "claude-sonnet-4-5"
PRICES = {"input": 1.0, "write_5m": 1.25, "write_1h": 2.0, "read": 0.1, "output": 5.0}
SYSTEM = [
    text_block(
        "You are an agent running in Control Center. Work in the conversation's workspace with the tools you "
        "are given; say plainly what you did and what you found."
    )
]
ACTIVATION_TURNS = (5, 15, 25, 35)
PARALLEL_TURN, LARGE_TURN, FANOUT_TURN = 10, 20, 30


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--catalog", default=str(Path(__file__).resolve().parents[2] / "shared/data/toolcatalog.json"))
    parser.add_argument("--turns", type=int, default=40)


class BenchToolBox:
    """Built-ins run for real; other catalog tools answer a canned observation."""

    def __init__(self, root: Path, catalog: dict[str, dict[str, Any]], resident: list[str], merge: bool) -> None:
        self.inner = WorkspaceToolBox(root, approve=lambda name, arguments: True)
        self.catalog = catalog
        self.resident = [catalog[name] for name in resident]
        self.active: list[dict[str, Any]] = []
        self.merge = merge

    def activate(self, name: str) -> None:
        if all(t["name"] != name for t in self.resident + self.active):
            self.active.append(self.catalog[name])

    def schemas(self) -> list[dict[str, Any]]:
        if self.merge:
            return sorted(self.resident + self.active, key=lambda t: t["name"])
        return [*self.resident, *self.active]

    def resident_count(self) -> int | None:
        return None if self.merge else len(self.resident)

    def execute(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if name in BUILTINS:
            return self.inner.execute(name, arguments)
        return {"ok": True, "tool": name, "result": f"{name} finished with the given arguments."}


class ScriptPolicy:
    def __init__(self) -> None:
        self.replies: list[list[dict[str, Any]]] = []

    def __call__(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        if "subagent" in payload["system"][-1]["text"]:
            return [text_block("Child finished: " + payload["messages"][-1]["content"][0]["text"])]
        return self.replies.pop(0) if self.replies else [text_block("Done.")]


class Clocked:
    """The emulator provider; advances the test clock per request and can keep only the end marker."""

    def __init__(self, emulator: Emulator, clock: TestClock, *, last_only: bool) -> None:
        self.inner = EmulatorProvider(emulator)
        self.name = "emulator"
        self.clock = clock
        self.last_only = last_only
        self.requests: list[ModelRequestSpec] = []
        self.usages: list[Any] = []

    def stream(self, request: ModelRequestSpec):
        if self.last_only:
            last = [p for p in request.cache_points if p.label == "current_turn"]
            request.cache_points = [CachePoint("messages", p.index, p.block, "5m", "current_turn") for p in last]
            request.breakpoints = request.breakpoint_labels()
        self.clock.advance(20)
        self.requests.append(request)
        for event in self.inner.stream(request):
            if hasattr(event, "usage"):
                self.usages.append(event.usage)
            yield event


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": arguments}


def _turn_script(turn: int, activated: str | None) -> list[list[dict[str, Any]]]:
    if turn == PARALLEL_TURN:
        blocks: list[dict[str, Any]] = []
        for n in range(30):
            blocks += [text_block(f"Checking {n}."), call("list_dir", path=".")]
        return [blocks, [text_block("All thirty listings agree.")]]
    if turn == LARGE_TURN:
        return [[call("read_file", path="big.log")], [text_block("The log is long; nothing alarming.")]]
    if turn == FANOUT_TURN:
        tasks = [f"Review module {n} and report problems." for n in range(5)]
        return [[call(SPAWN_AGENTS, tasks=tasks)], [text_block("The five reviews are in.")]]
    if activated:
        return [[call(activated)], [text_block(f"{activated} did its job.")]]
    return [
        [text_block(f"Turn {turn}: reading."), call("read_file", path="notes.txt", limit=20)],
        [call("list_dir", path="."), call("glob", pattern="*.txt")],
        [text_block(f"Turn {turn} is done.")],
    ]


def _session(catalog: dict[str, dict[str, Any]], turns: int, *, variant: str) -> dict[str, Any]:
    clock = TestClock()
    policy = ScriptPolicy()
    emulator = Emulator(clock=clock, policy=policy)
    provider = Clocked(emulator, clock, last_only=variant == "last_message_breakpoint_only")
    resident = sorted(BUILTINS) if variant != "no_deferral" else sorted(catalog)
    deferred = [name for name in sorted(catalog) if name not in BUILTINS]
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "notes.txt").write_text("".join(f"note {n}\n" for n in range(200)))
        (root / "big.log").write_text("".join(f"{n:06d} request handled in {n % 97} ms\n" for n in range(12_000)))
        box = BenchToolBox(root, catalog, resident, merge=variant == "tools_appended_on_activation")
        box.resident.append(SPAWN_AGENTS_SCHEMA)
        fanout: dict[str, Any] = {}

        def execute(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            if name == SPAWN_AGENTS:
                fanout.update(_fanout(provider, box, arguments["tasks"]))
                return {"ok": True, "results": fanout["answers"]}
            return BenchToolBox.execute(box, name, arguments)

        box.execute = execute  # type: ignore[method-assign]
        history: list[dict[str, Any]] = []
        rewrites = 0
        for turn in range(1, turns + 1):
            clock.advance(60)
            activated = deferred[(turn * 7) % len(deferred)] if turn in ACTIVATION_TURNS else None
            if activated:
                box.activate(activated)
            policy.replies = _turn_script(turn, activated)
            history.append({"role": "user", "content": [text_block(f"Please do step {turn}.")]})
            start = len(provider.requests)
            outcome = run_turn(
                provider=provider, model=MODEL, system=SYSTEM, history=history, toolbox=box, emit=lambda k, p: None
            )
            history += outcome.messages
            chain = [r for r in provider.requests[start:] if "subagent" not in r.system[-1]["text"]]
            for before, after in zip(chain, chain[1:], strict=False):
                if prefix_bytes(after, messages=len(before.messages)) != prefix_bytes(before):
                    rewrites += 1
    parent_usages = [u for r, u in zip(provider.requests, provider.usages, strict=True)
                     if "subagent" not in r.system[-1]["text"]]  # fmt: skip
    return {**_figures(provider.usages), "rewrites": rewrites, "requests": len(parent_usages), "fanout": fanout}


def _fanout(provider: Clocked, box: BenchToolBox, tasks: list[str]) -> dict[str, Any]:
    """Children of one shape, gated: the first child streams before its siblings begin (TD-14)."""
    children_box = BenchToolBox(box.inner.root, box.catalog, sorted(BUILTINS), merge=False)
    usages, answers = [], []
    for index, task in enumerate(tasks):
        before = len(provider.usages)
        outcome = run_turn(
            provider=provider,
            model=MODEL,
            system=subagent_system("worker"),
            history=[{"role": "user", "content": [text_block(task)]}],
            toolbox=children_box,
            emit=lambda k, p: None,
        )
        usages.append(provider.usages[before:])
        answers.append({"index": index, "text": outcome.messages[-1]["content"][0]["text"]})
    siblings = [u for child in usages[1:] for u in child]
    return {"answers": answers, "child_cache_ratio": _figures(siblings)["cache_ratio"]}


def _ungated_fanout_ratio(count: int = 5) -> float:
    """The same children begun all at once: every one misses the prefix the first is still writing."""
    emulator = Emulator(clock=TestClock())
    specs = []
    for n in range(count):
        spec = ModelRequestSpec(
            model=MODEL,
            system=subagent_system("worker"),
            tools=[BUILTINS[name].definition() for name in sorted(BUILTINS)],
            messages=[{"role": "user", "content": [text_block(f"Review module {n} and report problems.")]}],
        )
        specs.append(place_breakpoints(spec, previous_end=None, resident_count=None))
    pending = [emulator.begin(spec.as_payload()) for spec in specs]
    for response in pending:
        response.start()
    return _figures([_as_usage(p.usage) for p in pending[1:]])["cache_ratio"]


def _as_usage(usage: Any) -> Any:
    from agents.providers.base import Usage

    return Usage(
        input_tokens=usage.input_tokens,
        cache_creation_input_tokens=usage.cache_creation_input_tokens,
        cache_read_input_tokens=usage.cache_read_input_tokens,
        output_tokens=usage.output_tokens,
        cache_creation_5m_input_tokens=usage.cache_creation_5m,
        cache_creation_1h_input_tokens=usage.cache_creation_1h,
    )


def _figures(usages: list[Any]) -> dict[str, Any]:
    uncached = sum(u.input_tokens for u in usages)
    w5 = sum(u.cache_creation_5m_input_tokens for u in usages)
    w1 = sum(u.cache_creation_1h_input_tokens for u in usages)
    reads = sum(u.cache_read_input_tokens for u in usages)
    output = sum(u.output_tokens for u in usages)
    prompt = uncached + w5 + w1 + reads
    cost = (uncached * PRICES["input"] + w5 * PRICES["write_5m"] + w1 * PRICES["write_1h"]
            + reads * PRICES["read"] + output * PRICES["output"])  # fmt: skip
    uncached_cost = prompt * PRICES["input"] + output * PRICES["output"]
    return {
        "cache_ratio": round(reads / prompt, 4) if prompt else 0.0,
        "cost_units": round(cost),
        "cost_vs_uncached": round(cost / uncached_cost, 4) if uncached_cost else 0.0,
        "prompt_tokens": prompt,
    }


def run(options: dict[str, Any]) -> dict[str, Any]:
    catalog = {tool["name"]: _schema(tool) for tool in json.loads(Path(options["catalog"]).read_text())["tools"]}
    for name, tool in BUILTINS.items():
        catalog[name] = tool.definition()
    runtime = _session(catalog, options["turns"], variant="runtime")
    figures: dict[str, Any] = {
        "cache_ratio": runtime["cache_ratio"],
        "cost_units": runtime["cost_units"],
        "cost_vs_uncached": runtime["cost_vs_uncached"],
        "fanout_child_cache_ratio": runtime["fanout"].get("child_cache_ratio", 0.0),
        "fanout_child_cache_ratio_ungated": _ungated_fanout_ratio(),
        "rewrites": runtime["rewrites"],
        "requests": runtime["requests"],
        "prompt_tokens": runtime["prompt_tokens"],
        "baselines": {},
        "not_exercised": ["search_tools / deferred index", "scratchpad offload", "pruning rewrite"],
    }
    for variant in ("no_deferral", "last_message_breakpoint_only", "tools_appended_on_activation"):
        replay = _session(catalog, options["turns"], variant=variant)
        figures["baselines"][variant] = {"cache_ratio": replay["cache_ratio"], "cost_units": replay["cost_units"]}
    return figures


def _schema(tool: dict[str, Any]) -> dict[str, Any]:
    return {"name": tool["name"], "description": tool.get("description", ""), "input_schema": tool["input_schema"]}
