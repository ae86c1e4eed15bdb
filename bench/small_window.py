"""`bench small_window`: a 30-turn scripted session in an 8,192-token window (LM-2).

`python manage.py bench small_window --json [--catalog FILE] [--turns 30] [--window 8192]`

Every turn is a real run on a Celery worker started for the bench, whose settings see
`CC_CONTEXT_WINDOW_TOKENS=8192` (so every threshold is scaled as a small local model's
would be), through the Anthropic adapter pointed at an in-process emulator with the same
8,192-token window: it refuses a longer prompt as the API does. The model is a script:
it reads an 800 KB log (the scratchpad takes it) and reads its tail back, calls deferred
tools directly and through `search_tools`, and otherwise reads, lists and globs, so
the history outgrows the window and is compacted.

Figures: the peak window use of any request (prompt plus the reply it asked room for,
over the window: must stay at or under 1.0), prompt-too-long errors (must be 0: a
reactive compaction counts as one), compactions by rung, and the tool block's share
of the window (resident schemas plus the deferred ones a `tool_reference` loaded, and the
name index; loaded tools count against the same 25 %, the least recently used unloaded).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from argparse import ArgumentParser
from collections import Counter
from pathlib import Path
from typing import Any

from bench._options import catalog_file, positive, positive_number, window_tokens
from bench._session import emulated_session
from engine.actions import result_text
from engine.context.transcript import request_tokens, transcript_tokens
from engine.emulator import Emulator, TestClock
from engine.request import referenced_tools
from engine.tokens import estimate_json_tokens, estimate_text_tokens, tool_prompt_tokens

# `manage.py bench` runs it in a scratch database (NAME_bench) and drops that afterwards.
WRITES_DATABASE = True

LOG_TURN = 5
SEARCHES = {3: "show the commit history of the repository", 13: "run a SQL query", 23: "assign a ticket"}
DIRECT = {8: ("file_info", {"path": "notes.txt"}), 18: ("git_status", {}), 28: ("list_tables", {})}
LAST_ENTRY = "<the entry just offloaded>"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--catalog", type=catalog_file, default=str(Path(__file__).resolve().parents[1] / "tests/data/toolcatalog.json")
    )
    parser.add_argument("--turns", type=positive, default=30)
    parser.add_argument("--window", type=window_tokens, default=8192)
    parser.add_argument("--detail", action="store_true", help="every request: counted, estimated, what took the room")
    parser.add_argument("--timeout", type=positive_number, default=300, help="seconds to wait for one turn")


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": arguments}


def say(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def turn_script(turn: int) -> list[list[dict[str, Any]]]:
    if turn == LOG_TURN:
        return [
            [call("read_file", path="big.log", limit=20_000)],
            [call("scratchpad_read", scratchpad_id=LAST_ENTRY, mode="tail", n=20)],
            [say("The log's tail shows nothing alarming.")],
        ]
    if turn in SEARCHES:
        return [[call("search_tools", query=SEARCHES[turn])], [say(f"Found tools for: {SEARCHES[turn]}.")]]
    if turn in DIRECT:
        name, arguments = DIRECT[turn]
        return [[call(name, **arguments)], [say(f"{name} answered.")]]
    return [
        [say(f"Turn {turn}: reading."), call("read_file", path="notes.txt", offset=turn * 3, limit=40)],
        [call("list_dir", path="."), call("glob", pattern="parts/*")],
        [say(f"Turn {turn} is done: the notes and the parts are as expected.")],
    ]


class Policy:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.recorded: list[dict[str, Any]] = []

    def __call__(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        with self.lock:
            self.recorded.append(payload)
        starts = [i for i, m in enumerate(payload["messages"]) if _opens_turn(m)]
        text = _text(payload["messages"][starts[-1]])
        turn = int(text.split("step ")[-1].split(".")[0]) if "step " in text else 0
        step = sum(1 for m in payload["messages"][starts[-1] :] if m["role"] == "user" and not _opens_turn(m))
        script = turn_script(turn)
        reply = json.loads(json.dumps(script[min(step, len(script) - 1)]))
        for block in reply:
            if block.get("input", {}).get("scratchpad_id") == LAST_ENTRY:
                last = payload["messages"][-1]["content"][0]
                block["input"]["scratchpad_id"] = json.loads(result_text(last))["scratchpad_id"]
        return reply


def _text(message: dict[str, Any]) -> str:
    content = message["content"]
    return content if isinstance(content, str) else " ".join(b.get("text", "") for b in content if isinstance(b, dict))


def _opens_turn(message: dict[str, Any]) -> bool:
    content = message["content"]
    if message["role"] != "user":
        return False
    if isinstance(content, str):
        return True
    return not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content) and "step " in _text(
        message
    )


def _workspace(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "notes.txt").write_text(
        "".join(f"note {n}: the service handled its queue in {n % 17} ms\n" for n in range(200))
    )
    (root / "parts").mkdir(exist_ok=True)
    for n in range(12):
        (root / "parts" / f"part{n:02d}.txt").write_text(f"part {n}\n")
    line = "2026-12-02T10:00:00 INFO request handled in {:>4} ms by worker {:>2} for /api/items/{:06d}\n"
    lines = [line.format(n % 997, n % 16, n) for n in range(11_000)]
    (root / "big.log").write_text("".join(lines))  # about 800 KB


def run(options: dict[str, Any]) -> dict[str, Any]:
    from agents.models import ModelRequest, Run, RunEvent
    from conversations.models import Compaction
    from scratchpad.models import Entry

    window = options["window"]
    policy = Policy()
    emulator = Emulator(clock=TestClock(), policy=policy, context_window=window)
    started = time.monotonic()
    session = emulated_session(
        bench="small-window", emulator=emulator, catalog=options["catalog"], workspace=_workspace,
        timeout=options["timeout"], env={"CC_CONTEXT_WINDOW_TOKENS": str(window)},
    )  # fmt: skip
    with session as bench:
        runs, failed = [], []
        for turn in range(1, options["turns"] + 1):
            finished = bench.turn(f"Please do step {turn}.")
            runs.append(finished.pk)
            if finished.status != Run.Status.SUCCEEDED:
                failed.append({"turn": turn, "status": finished.status, "error": finished.error[:300]})
        rows = list(ModelRequest.objects.filter(run_id__in=runs).order_by("run_id", "step", "id"))
        compactions = list(Compaction.objects.filter(conversation=bench.conversation).values_list("trigger", "rung"))
        reactive = RunEvent.objects.filter(run_id__in=runs, type="compaction", payload__trigger="reactive").count()
        unloads = list(
            RunEvent.objects.filter(run_id__in=runs, type="tools_unloaded").values_list("payload", flat=True)
        )
        offloaded = list(Entry.objects.filter(conversation=bench.conversation).values_list("size_bytes", flat=True))
    requests = policy.recorded
    counted = [emulator.prompt_tokens(p) for p in requests]
    peaks = [(tokens + int(p["max_tokens"])) / window for tokens, p in zip(counted, requests, strict=True)]
    tool_shares = [(_tool_tokens(p) + _index_tokens(p)) / window for p in requests]
    # How far our estimate (what compaction decides with) is below the server's count.
    under = [tokens / max(1, _estimate(p)) for tokens, p in zip(counted, requests, strict=True)]
    too_long = reactive + sum("too long" in f["error"] for f in failed)
    sent = sum(row.prompt_tokens for row in rows)
    figures = {
        "window_tokens": window,
        "turns": options["turns"],
        "requests": len(rows),
        "failed_turns": failed,
        "peak_window_use": round(max(peaks), 3) if peaks else None,
        "peak_prompt_tokens": max(counted, default=0),
        "prompt_too_long_errors": too_long,
        "compactions_by_rung": dict(Counter(rung for _, rung in compactions)),
        "compactions_by_trigger": dict(Counter(trigger for trigger, _ in compactions)),
        # Requests whose reply was asked for in less than CC_MAX_OUTPUT_TOKENS: the room a compaction could not make.
        "replies_with_less_room": sum(1 for p in requests if p["max_tokens"] < requests[0]["max_tokens"]),
        "tool_share_max": round(max(tool_shares), 3) if tool_shares else None,
        "tool_share_first_request": round(tool_shares[0], 3) if tool_shares else None,
        "counted_over_estimated_max": round(max(under), 3) if under else None,
        "largest_offloaded_bytes": max(offloaded, default=0),
        "deferred_tools_loaded": sorted({name for row in rows for name in row.tools_loaded}),
        # Loaded tools a load unloaded to keep the tool share (LM-2), and how often that happened.
        "tools_unloaded": sorted({name for payload in unloads for name in payload.get("tools", [])}),
        "unload_events": len(unloads),
        # What the prompt cache read back, of every prompt token sent: the price of rewrites (unloads, compactions).
        "cache_read_ratio": round(sum(r.cache_read_input_tokens for r in rows) / max(1, sent), 3),
        # Requests whose resident block differs from the previous request's (use counts refit it at a turn's start).
        "resident_set_changes": sum(1 for a, b in itertools.pairwise(requests) if _resident(a) != _resident(b)),
        "seconds": round(time.monotonic() - started, 1),
    }
    if options["detail"]:
        figures["detail"] = [_detail(p, tokens, window) for p, tokens in zip(requests, counted, strict=True)]
    return figures


def _estimate(payload: dict[str, Any]) -> int:
    """Our count of the request, the tool-use system prompt the API adds included (CH-12)."""
    forced = (payload.get("tool_choice") or {}).get("type") in ("any", "tool")
    tool_prompt = tool_prompt_tokens("anthropic", payload["model"], forced=forced)
    return request_tokens(
        payload.get("system", []), payload.get("tools", []), payload["messages"], tool_prompt=tool_prompt
    )


def _detail(payload: dict[str, Any], counted: int, window: int) -> dict[str, Any]:
    """One request: which turn, the emulator's count against our estimate, and what took the room."""
    messages = payload["messages"]
    opening = max((i for i, m in enumerate(messages) if _opens_turn(m)), default=0)
    return {
        "turn": _text(messages[opening]).rsplit("step ", 1)[-1].rstrip("."),
        "counted": counted,
        "estimated": _estimate(payload),
        "max_tokens": payload["max_tokens"],
        "use": round((counted + payload["max_tokens"]) / window, 3),
        "tools": _tool_tokens(payload),
        "history": transcript_tokens(messages[:opening]),
        "this_turn": transcript_tokens(messages[opening:]),
    }


def _tool_tokens(payload: dict[str, Any]) -> int:
    """The schemas the model sees: resident ones and the deferred ones a `tool_reference` loaded."""
    loaded = set(referenced_tools(payload["messages"]))
    return estimate_json_tokens(
        [_bare(t) for t in payload.get("tools", []) if not t.get("defer_loading") or t["name"] in loaded]
    )


def _resident(payload: dict[str, Any]) -> list[str]:
    return [t["name"] for t in payload.get("tools", []) if not t.get("defer_loading")]


def _bare(tool: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in tool.items() if k not in ("cache_control", "defer_loading")}


def _index_tokens(payload: dict[str, Any]) -> int:
    blocks = [b.get("text", "") for b in payload.get("system", []) if isinstance(b, dict)]
    return sum(estimate_text_tokens(text) for text in blocks if text.startswith("Deferred tools"))
