"""`bench compaction`: a long session at several windows, compaction on and off (CH-2, CH-11..CH-13).

The session of `tests/agents/test_runtime_compaction_services.py`, run in this process: each turn
is a real run (`run_execute`) with the Anthropic adapter talking to the emulator over HTTP;
the model asks for a `bash` command with about 1,500 tokens of output, then answers with a
paragraph. The emulator's window is the session's, so a request past it is refused as a
real provider would. Per window it reports the peak window use by the runtime's own count
(the images by the documented formula) and by the emulator's recorded usage, the error of
the calibrated estimate against the recorded usage after the first request (mean and max,
requests with snapshot pages included: the emulator counts them by the same formula; the
calibration is the runtime's own, `agents.turns.calibration`, over what was recorded before
each request), our count against the emulator's by part over the session (`by_part`: where
an error comes from), the compactions by rung with the tokens they freed, failed runs, and
the cost against the same session with compaction off (the off session runs in an unbounded
window: it could not run in the real one).

Cost units weigh tokens like Anthropic's prices: uncached input 1, cache writes 1.25,
cache reads 0.1, output 5.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.test.utils import override_settings

from agents.lifecycle import run_execute
from agents.models import ModelRequest, Run
from agents.summary import SUMMARY_SYSTEM
from agents.turns import CALIBRATION_REQUESTS
from bench._options import positive, window_list
from conversations.models import Compaction, Conversation, Message
from engine.context.calibration import calibration_from
from engine.context.transcript import COUNTED_PARTS, FORMULA_PARTS, RequestCount
from engine.emulator import Emulator
from engine.emulator.cache import analyse
from engine.emulator.server import EmulatorServer

# `manage.py bench` runs it in a scratch database (NAME_bench) and drops that afterwards.
WRITES_DATABASE = True

MODEL = "claude-sonnet-4-5"
NOTES = "What I checked, step by step, and what I would look at next before changing the build. " * 12


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=positive, default=40)
    parser.add_argument("--windows", type=window_list, default="8000,20000,200000")


class _Script:
    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []

    def __call__(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        self.payloads.append(payload)
        if _is_summary(payload):
            return [{"type": "text", "text": "Summary: the build ran step by step; every log line said ok. " * 4}]
        last = payload["messages"][-1]["content"]
        if isinstance(last, list) and any(block.get("type") == "tool_result" for block in last):
            return [{"type": "text", "text": "The command ran; its output is above. " + NOTES}]
        return [{"type": "tool_use", "name": "bash", "input": {"command": "seq -f 'build log line %g: ok' 1 220"}}]


def _has_pages(payload: dict[str, Any]) -> bool:
    return any(
        isinstance(block, dict) and block.get("type") == "image"
        for message in payload["messages"]
        for block in (message["content"] if isinstance(message["content"], list) else [])
    )


def _is_summary(payload: dict[str, Any]) -> bool:
    system = payload.get("system") or []
    text = system if isinstance(system, str) else " ".join(b.get("text", "") for b in system)
    return text.startswith(SUMMARY_SYSTEM[:40])


def _provider_parts(payload: dict[str, Any]) -> dict[str, int]:
    """The emulator's count of a request by the parts of our `RequestCount`."""
    prompt = analyse(payload)
    forced = (payload.get("tool_choice") or {}).get("type") in ("any", "tool")
    parts = dict.fromkeys((*COUNTED_PARTS, *FORMULA_PARTS), 0)
    kinds = {"tool": "tools", "system": "system", "image": "images", "tool_result": "tool_results"}
    for block in prompt.blocks:
        # Pages sit in user messages; an image inside a tool result is counted with the result here.
        parts[kinds.get(block.kind, "messages")] += block.tokens
    if payload.get("tools"):
        # The API adds its tool-use system prompt to the first tool block (EM-2).
        parts["tool_prompt"] = prompt.info["tool_prompt"][1 if forced else 0]
        parts["tools"] -= parts["tool_prompt"]
    return parts


def _cost(requests: list[ModelRequest]) -> float:
    return sum(
        r.input_tokens + 1.25 * r.cache_creation_input_tokens + 0.1 * r.cache_read_input_tokens + 5 * r.output_tokens
        for r in requests
    )


def _session(owner: Any, server: EmulatorServer, *, window: int, turns: int, compact: bool) -> dict[str, Any]:
    script: _Script = server.script  # type: ignore[attr-defined]
    first_payload = len(script.payloads)
    server.emulator.context_window = window if compact else 10**8
    overrides = {
        "CC_CONTEXT_WINDOW_TOKENS": window,
        # Off: the trigger can never be reached.
        "CC_COMPACT_AT_PERCENT": settings.CC_COMPACT_AT_PERCENT if compact else 10**6,
    }
    with override_settings(**overrides):
        conversation = Conversation.objects.create(owner=owner, title=f"bench {window}", model=MODEL)
        runs = []
        for turn in range(turns):
            conversation.refresh_from_db()
            prompt = Message.objects.create(
                conversation=conversation,
                parent_id=conversation.tip_id,
                role="user",
                content=[{"type": "text", "text": f"Step {turn}: run the build and tell me what it printed."}],
            )
            Conversation.objects.filter(pk=conversation.pk).update(tip=prompt)
            run = Run.objects.create(conversation=conversation, trigger=prompt, provider="anthropic", model=MODEL)
            run_execute(run_id=run.pk, worker="bench")
            runs.append(Run.objects.get(pk=run.pk))
    # The turn's own requests; summary calls (CH-14) are counted in the cost, not in the window figures.
    payloads = [p for p in script.payloads[first_payload:] if not _is_summary(p)]
    summaries = ModelRequest.objects.filter(run__in=runs, subagent="summary").count()
    requests = list(ModelRequest.objects.filter(run__in=runs, subagent="").order_by("id"))
    # The runtime's own count of each request, as it recorded it (the tool-use prompt included).
    estimates = [r.estimated_tokens for r in requests]
    measured = [(RequestCount.from_dict(r.estimated_parts), r.prompt_tokens) for r in requests]
    errors = []
    for index in range(1, len(measured)):
        count, prompt_tokens = measured[index]
        if not prompt_tokens:
            continue
        # What the runtime's calibration made of the requests recorded before this one.
        calibrated = calibration_from(measured[max(0, index - CALIBRATION_REQUESTS) : index]).tokens(count)
        errors.append(abs(calibrated - prompt_tokens) / prompt_tokens)
    by_part: dict[str, dict[str, Any]] = {}
    for (count, _), payload in zip(measured, payloads, strict=False):
        for part, tokens in _provider_parts(payload).items():
            entry = by_part.setdefault(part, {"estimated": 0, "measured": 0})
            entry["estimated"] += getattr(count, part)
            entry["measured"] += tokens
    for entry in by_part.values():
        entry["ratio"] = round(entry["measured"] / entry["estimated"], 4) if entry["estimated"] else None
    by_rung: dict[str, dict[str, int]] = {}
    for compaction in Compaction.objects.filter(conversation=conversation):
        entry = by_rung.setdefault(compaction.rung, {"passes": 0, "tokens_freed": 0})
        entry["passes"] += 1
        entry["tokens_freed"] += compaction.tokens_before - compaction.tokens_after
    return {
        "requests": len(payloads),
        "failed_runs": sum(run.status != Run.Status.SUCCEEDED for run in runs),
        "failures": sorted({run.error[:160] for run in runs if run.status != Run.Status.SUCCEEDED}),
        "peak_estimated_use": round(max(estimates) / window, 4) if estimates else 0,
        "peak_recorded_use": round(max(r.prompt_tokens for r in requests) / window, 4) if requests else 0,
        "requests_with_pages": sum(_has_pages(p) for p in payloads),
        "estimate_error_mean": round(statistics.mean(errors), 4) if errors else None,
        "estimate_error_max": round(max(errors), 4) if errors else None,
        "estimate_error_samples": len(errors),
        "by_part": by_part,
        "compactions": by_rung,
        "summary_calls": summaries,
        "cost_units": round(_cost(list(ModelRequest.objects.filter(run__in=runs)))),
    }


def run(options: dict[str, Any]) -> dict[str, Any]:
    owner, _ = get_user_model().objects.get_or_create(username=f"bench-compaction-{uuid.uuid4().hex[:6]}")
    figures: dict[str, Any] = {"turns": options["turns"]}
    with (
        tempfile.TemporaryDirectory() as workspaces,
        EmulatorServer(Emulator(policy=_Script(), context_window=10**8)) as server,
    ):
        server.script = server.emulator.policy  # type: ignore[attr-defined]
        overrides = {
            "ANTHROPIC_API_KEY": "bench-key",
            "ANTHROPIC_BASE_URL": server.base_url,
            "CC_MODELS": {**settings.CC_MODELS, MODEL: "anthropic"},
            "CC_WORKSPACE_ROOT": Path(workspaces),
            "CC_TOOL_AUTO_APPROVE": ["bash"],
            "SCRATCHPAD_THRESHOLD_BYTES": 100_000,
        }
        with override_settings(**overrides):
            for window in options["windows"]:
                on = _session(owner, server, window=window, turns=options["turns"], compact=True)
                off = _session(owner, server, window=window, turns=options["turns"], compact=False)
                on["cost_vs_off"] = round(on["cost_units"] / off["cost_units"], 4) if off["cost_units"] else None
                on["off"] = {k: off[k] for k in ("cost_units", "peak_estimated_use", "peak_recorded_use")}
                figures[f"window_{window}"] = on
    return figures
