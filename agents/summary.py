"""The summary rung during runs (CH-14): one call of the conversation's own model, bounded, paid for.

It is the last rung: a proactive pass climbs to it only when the rungs that need no call
(elide, drop images, snapshots) cannot fit the window. Reactive recovery never calls it
(CH-2: overflow recovery never depends on a model call). The ladder caps its input at
`ladder.SUMMARY_INPUT_CHARS` and half the window; the answer at SUMMARY_MAX_TOKENS and the
window's reply budget. Its usage is
recorded as a `ModelRequest` of the run labelled `summary`, so the run's cost includes it.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings

from agents.models import Run
from agents.usage import request_recorder
from engine.context.transcript import request_count
from engine.loop import StepRecord, stream_answer
from engine.providers.protocol import Provider, TextDelta
from engine.request import ModelRequestSpec, text_block

SUMMARY_LABEL = "summary"
SUMMARY_MAX_TOKENS = 1_024
SUMMARY_SYSTEM = (
    "You compress the middle of an agent's conversation so the agent can keep working. Keep the decisions, "
    "facts found, files and commands touched, errors and what is still open; drop chatter. Plain text, "
    "at most 400 words."
)


def run_summarizer(run: Run, provider: Provider, *, is_cancelled: Callable[[], bool]) -> Callable[[str], str]:
    """`summarize(text) -> str` for the ladder, calling `provider` with the run's model and recording the
    cost. It stops as a turn does (`TurnCancelled` within 2 s of a cancel, OP-3), and is recorded as
    every model call is, from the moment its answer begins (`engine.loop.stream_answer`)."""

    def summarize(text: str) -> str:
        request = ModelRequestSpec(
            model=run.model,
            system=[text_block(SUMMARY_SYSTEM)],
            tools=[],
            messages=[{"role": "user", "content": [text_block("Summarize this part of the conversation:\n\n" + text)]}],
            # Never more than the window leaves a reply (LM-2).
            max_tokens=min(SUMMARY_MAX_TOKENS, settings.CC_MAX_OUTPUT_TOKENS),
        )
        parts: list[str] = []
        record = request_recorder(run, label=SUMMARY_LABEL)
        done, duration_ms = stream_answer(
            provider,
            request,
            step=0,
            is_cancelled=is_cancelled,
            record_step=record,
            on_event=lambda event: parts.append(event.text) if isinstance(event, TextDelta) else None,
        )
        count = request_count(request.system, request.tools, request.messages)
        record(StepRecord(0, done.usage, done.stop_reason, duration_ms, [], done.request_id, estimate=count))
        text_blocks = [b.get("text", "") for b in done.content if b.get("type") == "text"]
        return ("".join(text_blocks) or "".join(parts)).strip()

    return summarize
