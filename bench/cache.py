"""A scripted 40-turn agent session through real runs, against the emulator (TD-11 … TD-14).

`python manage.py bench cache --json [--catalog FILE] [--turns 40]`

Every turn is a real run: `message_send` queues it, a Celery worker started for the
bench runs `agents.lifecycle.run_execute` (the run's toolbox stack, system prompt with
the deferred-name index, history view and pruning, `run_turn`, persistence), with the
Anthropic adapter pointed at an in-process `EmulatorServer` (its cache rules, a test
clock: 20 s per request, 60 s between turns). `spawn_agents` fans out to child tasks on
the same worker. Usage comes from the `ModelRequest` rows the runs stored.

The catalog file is imported into the database the command runs against (idempotent,
as `catalog import` is); the bench's user, conversation, runs and scratchpad entries
are deleted afterwards.

Scripted turns (the model is the emulator's policy, keyed on the conversation so far):
searches with `search_tools` (turns 3, 13, 23, 33), direct calls of deferred tools
(8, 18, 28, 38), 30 parallel `read_file` calls (turn 10), a ~300 KB log that goes to
the scratchpad and is read back with `scratchpad_read` (turn 20), a fan-out of 5
subagents (turn 30); other turns read, list and glob. Pruning (TD-12) rewrites the
history once enough stale tool output has accumulated (`rewrites`).

Baselines replay the recorded requests on a fresh emulator at the same clock times,
changed one way each: `no_deferral` (every catalog tool resident, no name index, as
TD-10 sends it), `last_message_breakpoint_only` (one 5m marker on the last block),
`tools_appended_on_activation` (activated schemas appended to `tools` as plain tools,
no tool_reference: what the runtime did before). `activation` compares the requests
that loaded tools in three shapes: deferred loading (as run), appended, and the
OpenAI-compatible adapter's payload (`to_chat_payload`, automatic prefix caching).
"""

from __future__ import annotations

import copy
import json
import threading
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from bench._options import catalog_file, positive, positive_number
from bench._session import emulated_session
from engine.actions import result_text
from engine.breakpoints import prefix_bytes
from engine.emulator import Emulator, TestClock
from engine.providers.openai_compat import to_chat_payload
from engine.request import ModelRequestSpec

# `manage.py bench` runs it in a scratch database (NAME_bench) and drops that afterwards.
WRITES_DATABASE = True

PRICES = {"input": 1.0, "write_5m": 1.25, "write_1h": 2.0, "read": 0.1, "output": 5.0}
SEARCHES = {
    3: "assign a ticket to a person",
    13: "show the commit history of the repository",
    23: "run a SQL query against a database",
    33: "save something to long-term memory",
}
DIRECT = {
    8: ("file_info", {"path": "notes.txt"}),
    18: ("git_status", {}),
    28: ("list_tables", {}),
    38: ("get_ticket", {"ticket": "OPS-7"}),
}
PARALLEL_TURN, LARGE_TURN, FANOUT_TURN = 10, 20, 30
STEP_SECONDS, TURN_SECONDS = 20, 60
LAST_ENTRY = "<the entry just offloaded>"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--catalog",
        type=catalog_file,
        default=str(Path(__file__).resolve().parents[2] / "shared/data/toolcatalog.json"),
    )
    parser.add_argument("--turns", type=positive, default=40)
    parser.add_argument("--timeout", type=positive_number, default=300, help="seconds to wait for one turn")


# --- the model: a policy keyed on the conversation so far --------------------------------


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": arguments}


def say(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def turn_script(turn: int) -> list[list[dict[str, Any]]]:
    """The model's replies in one turn, step by step; the last reply ends the turn."""
    if turn == PARALLEL_TURN:
        blocks: list[dict[str, Any]] = []
        for n in range(30):
            blocks += [say(f"Checking part {n}."), call("read_file", path=f"parts/part{n:02d}.txt")]
        return [blocks, [say("All thirty parts agree.")]]
    if turn == LARGE_TURN:
        return [
            [call("read_file", path="big.log")],
            [call("scratchpad_read", scratchpad_id=LAST_ENTRY, mode="tail", n=2000)],
            [say("The log is long; its tail shows nothing alarming.")],
        ]
    if turn == FANOUT_TURN:
        tasks = [f"Review module {n} of the project and report its problems." for n in range(5)]
        return [[call("spawn_agents", tasks=tasks)], [say("The five reviews are in.")]]
    if turn in SEARCHES:
        return [[call("search_tools", query=SEARCHES[turn])], [say(f"Found tools for: {SEARCHES[turn]}.")]]
    if turn in DIRECT:
        name, arguments = DIRECT[turn]
        return [[call(name, **arguments)], [say(f"{name} answered.")]]
    return [
        [say(f"Turn {turn}: reading."), call("read_file", path="notes.txt", offset=turn, limit=60)],
        [call("list_dir", path="."), call("glob", pattern=f"parts/part{turn % 30:02d}*")],
        [say(f"Turn {turn} is done.")],
    ]


class Policy:
    """Answers parents from the script and children with their verdict; records every payload with its time."""

    def __init__(self, clock: TestClock) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.recorded: list[tuple[float, dict[str, Any]]] = []

    def __call__(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        with self.lock:
            self.recorded.append((self.clock.now(), copy.deepcopy(payload)))
            self.clock.advance(STEP_SECONDS)
        if is_child(payload):
            task = payload["messages"][0]["content"][0]["text"]
            return [say(f"Reviewed: {task} No blocking problems; two small naming issues.")]
        starts = [i for i, m in enumerate(payload["messages"]) if _opens_turn(m)]
        turn = int(payload["messages"][starts[-1]]["content"][0]["text"].split()[-1].rstrip("."))
        step = sum(1 for m in payload["messages"][starts[-1] :] if m["role"] == "user" and not _opens_turn(m))
        script = turn_script(turn)
        reply = copy.deepcopy(script[min(step, len(script) - 1)])
        for block in reply:
            if block.get("input", {}).get("scratchpad_id") == LAST_ENTRY:
                # The model reads the id off the synthetic observation it was just given.
                last = payload["messages"][-1]["content"][0]
                block["input"]["scratchpad_id"] = json.loads(result_text(last))["scratchpad_id"]
        return reply


def is_child(payload: dict[str, Any]) -> bool:
    return "subagent" in payload["system"][0]["text"]


def _opens_turn(message: dict[str, Any]) -> bool:
    content = message["content"]
    return message["role"] == "user" and not any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


# --- the session -------------------------------------------------------------------------


def _workspace(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "notes.txt").write_text(
        "".join(f"note {n}: the service handled its queue in {n % 17} ms\n" for n in range(120))
    )
    (root / "parts").mkdir(exist_ok=True)
    for n in range(30):
        (root / "parts" / f"part{n:02d}.txt").write_text(f"part {n}\n" * 20)
    (root / "big.log").write_text("".join(f"{n:06d} request handled in {n % 97} ms\n" for n in range(9_000)))


def _session(options: dict[str, Any], clock: TestClock, policy: Policy) -> dict[str, Any]:
    from agents.models import ModelRequest, Run, RunEvent

    session = emulated_session(
        bench="cache", emulator=Emulator(clock=clock, policy=policy), catalog=options["catalog"],
        workspace=_workspace, timeout=options["timeout"], concurrency=4,
        env={"CC_SUBAGENT_RELEASE_WAIT_SECONDS": "10"},
    )  # fmt: skip
    with session as bench:
        runs = []
        for turn in range(1, options["turns"] + 1):
            clock.advance(TURN_SECONDS)
            run = bench.turn(f"Please do step {turn}.")
            if run.status != Run.Status.SUCCEEDED:
                raise SystemExit(f"turn {turn} ended {run.status}: {run.error}")
            runs.append(run.pk)
        rows = list(ModelRequest.objects.filter(run_id__in=runs).order_by("run_id", "step", "id"))
        pruned = RunEvent.objects.filter(run_id__in=runs, type="context_pruned").count()
    return {"rows": rows, "pruned": pruned}


# --- replays -------------------------------------------------------------------------------


def _bare(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _bare(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_bare(v) for v in value]
    return value


def _marked(block: dict[str, Any], ttl: str) -> dict[str, Any]:
    return {**block, "cache_control": {"type": "ephemeral"} if ttl == "5m" else {"type": "ephemeral", "ttl": ttl}}


def _without_references(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(messages)
    for message in out:
        for index, block in enumerate(message["content"] if isinstance(message["content"], list) else []):
            if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
                kept = {k: v for k, v in block.items() if k != "content"}
                message["content"][index] = {**kept, "content": result_text(block)}
    return out


def appended(payload: dict[str, Any]) -> dict[str, Any]:
    """Activated schemas as plain tools after the others, results without tool_reference."""
    out = copy.deepcopy(payload)
    resident = [t for t in out.get("tools", []) if not t.get("defer_loading")]
    loaded = [
        {k: v for k, v in t.items() if k != "defer_loading"} for t in out.get("tools", []) if t.get("defer_loading")
    ]
    if loaded:
        out["tools"] = [*resident, *loaded]
        out["messages"] = _without_references(out["messages"])
    return out


def no_deferral(payload: dict[str, Any], every_tool: list[dict[str, Any]]) -> dict[str, Any]:
    """Every catalog tool resident in name order, the prompt without the name index (TD-10)."""
    if is_child(payload):
        return payload
    out = copy.deepcopy(payload)
    catalog = {t["name"] for t in every_tool}
    extra = [_bare(t) for t in out["tools"] if not t.get("defer_loading") and t["name"] not in catalog]
    tools = [copy.deepcopy(t) for t in every_tool]
    tools[-1] = _marked(tools[-1], "1h")
    out["tools"] = [*tools, *extra]
    out["system"] = [_marked(_bare(out["system"][0]), "1h")]
    out["messages"] = _without_references(out["messages"])
    return out


def last_message_only(payload: dict[str, Any]) -> dict[str, Any]:
    out = _bare(payload)
    last = out["messages"][-1]
    if isinstance(last["content"], str):
        last["content"] = [say(last["content"])]
    last["content"][-1] = _marked(last["content"][-1], "5m")
    return out


def replay(recorded: list[tuple[float, dict[str, Any]]], change) -> list[Any]:
    clock = TestClock()
    emulator = Emulator(clock=clock)
    usages = []
    for at, payload in recorded:
        clock.advance(at - clock.now())
        usages.append(emulator.measure(change(payload)))
    return usages


def openai_replay(recorded: list[tuple[float, dict[str, Any]]]) -> list[tuple[int, int]]:
    """(prompt tokens, cached tokens) of each request as the OpenAI-compatible adapter would send it."""
    clock = TestClock()
    emulator = Emulator(clock=clock)
    out = []
    for at, payload in recorded:
        clock.advance(at - clock.now())
        bare = _bare(payload)
        spec = ModelRequestSpec(model=bare["model"], system=bare["system"], tools=bare.get("tools", []),
                                messages=bare["messages"], max_tokens=bare["max_tokens"])  # fmt: skip
        response = emulator.openai_begin(to_chat_payload(spec))
        response.start()
        out.append((response.prompt_tokens, response.cached_tokens))
    return out


# --- figures -------------------------------------------------------------------------------


def _figures(usages: list[Any], output_tokens: int) -> dict[str, Any]:
    uncached = sum(u.input_tokens for u in usages)
    w5 = sum(_w(u, "5m") for u in usages)
    w1 = sum(_w(u, "1h") for u in usages)
    reads = sum(u.cache_read_input_tokens for u in usages)
    prompt = uncached + w5 + w1 + reads
    cost = (uncached * PRICES["input"] + w5 * PRICES["write_5m"] + w1 * PRICES["write_1h"]
            + reads * PRICES["read"] + output_tokens * PRICES["output"])  # fmt: skip
    uncached_cost = prompt * PRICES["input"] + output_tokens * PRICES["output"]
    return {
        "cache_ratio": round(reads / prompt, 4) if prompt else 0.0,
        "cost_units": round(cost),
        "cost_vs_uncached": round(cost / uncached_cost, 4) if uncached_cost else 0.0,
        "prompt_tokens": prompt,
    }


def _w(usage: Any, ttl: str) -> int:
    # ModelRequest rows and the emulator's Usage name the TTL split differently.
    return getattr(usage, f"cache_creation_{ttl}_input_tokens", None) or getattr(usage, f"cache_creation_{ttl}", 0)


def _rewrites(parents: list[dict[str, Any]]) -> int:
    specs = [ModelRequestSpec(model=p["model"], system=_bare(p["system"]), tools=_bare(p.get("tools", [])),
                              messages=_bare(p["messages"])) for p in parents]  # fmt: skip
    return sum(
        1
        for before, after in zip(specs, specs[1:], strict=False)
        if prefix_bytes(after, messages=len(before.messages)) != prefix_bytes(before)
    )


def _activation(loading: list[int], prompt: list[int], read: list[int]) -> dict[str, Any]:
    """How much of the previous request the requests that loaded tools read back."""
    pairs = [(read[i], prompt[i - 1]) for i in loading if i > 0]
    return {
        "requests": len(pairs),
        "read_of_previous_prefix": round(sum(r for r, _ in pairs) / sum(p for _, p in pairs), 4) if pairs else 0.0,
        "previous_prefix_tokens_not_read": sum(max(0, p - r) for r, p in pairs),
    }


def run(options: dict[str, Any]) -> dict[str, Any]:
    from toolcatalog.selectors import run_surface

    clock = TestClock()
    policy = Policy(clock)
    session = _session(options, clock, policy)
    rows = session["rows"]
    parents = [r for r in rows if not r.subagent]
    children = sorted((r for r in rows if r.subagent), key=lambda r: int(r.subagent.split("/")[1]))
    output = sum(r.output_tokens for r in rows)
    recorded = sorted(policy.recorded, key=lambda item: item[0])
    parent_payloads = [p for _, p in recorded if not is_child(p)]
    if len(parent_payloads) != len(parents):
        raise SystemExit(f"{len(parent_payloads)} parent requests reached the emulator, {len(parents)} were stored")
    figures: dict[str, Any] = {
        **_figures(rows, output),
        "requests": len(parents),
        "child_requests": len(children),
        "fanout_child_cache_ratio": _figures([r for r in children if not r.subagent.endswith("/0")], 0)["cache_ratio"],
        "rewrites": _rewrites(parent_payloads),
        "context_pruned_events": session["pruned"],
        "tool_activation_misses_recorded": sum(1 for r in parents if r.cache_miss),
        "baselines": {},
    }
    every_tool = run_surface(deferral=False)[0].resident_schemas()
    changes = {
        "no_deferral": lambda p: no_deferral(p, every_tool),
        "last_message_breakpoint_only": last_message_only,
        "tools_appended_on_activation": appended,
    }
    replays = {name: replay(recorded, change) for name, change in changes.items()}
    for name, usages in replays.items():
        figures["baselines"][name] = {k: v for k, v in _figures(usages, output).items() if k != "prompt_tokens"}
    figures["replay_as_run"] = _figures(replay(recorded, lambda p: p), output)["cache_ratio"]

    loading = [i for i, r in enumerate(parents) if r.tools_loaded]
    parent_index = [i for i, (_, p) in enumerate(recorded) if not is_child(p)]
    appended_usage = [replays["tools_appended_on_activation"][i] for i in parent_index]
    chat = openai_replay([item for item in recorded if not is_child(item[1])])
    figures["activation"] = {
        "deferred_loading": _activation(loading, [r.prompt_tokens for r in parents],
                                        [r.cache_read_input_tokens for r in parents]),
        "appended": _activation(loading, [u.prompt_tokens for u in appended_usage],
                                [u.cache_read_input_tokens for u in appended_usage]),
        "openai_compat": {
            **_activation(loading, [p for p, _ in chat], [c for _, c in chat]),
            "cache_ratio": round(sum(c for _, c in chat) / sum(p for p, _ in chat), 4),
        },
        "tools_loaded": [t for r in parents for t in r.tools_loaded],
    }  # fmt: skip
    return figures
