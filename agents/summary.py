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

from agents.models import ModelRequest, Run
from engine.providers.protocol import MessageDone, Provider, TextDelta
from engine.request import ModelRequestSpec, text_block

SUMMARY_LABEL = "summary"
SUMMARY_MAX_TOKENS = 1_024
SUMMARY_SYSTEM = (
    "You compress the middle of an agent's conversation so the agent can keep working. Keep the decisions, "
    "facts found, files and commands touched, errors and what is still open; drop chatter. Plain text, "
    "at most 400 words."
)


def run_summarizer(run: Run, provider: Provider) -> Callable[[str], str]:
    """`summarize(text) -> str` for the ladder, calling `provider` with the run's model and recording the cost."""

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
        done: MessageDone | None = None
        for event in provider.stream(request):
            if isinstance(event, TextDelta):
                parts.append(event.text)
            elif isinstance(event, MessageDone):
                done = event
        if done is None:
            raise RuntimeError("the provider ended the summary request without a final message")
        usage = done.usage
        ModelRequest.objects.create(
            run=run,
            subagent=SUMMARY_LABEL,
            step=0,
            model=run.model,
            input_tokens=usage.input_tokens,
            cache_creation_input_tokens=usage.cache_creation_input_tokens,
            cache_read_input_tokens=usage.cache_read_input_tokens,
            output_tokens=usage.output_tokens,
            usage_source=usage.source,
            cache_reported=usage.cache_reported,
            request_id=done.request_id,
            stop_reason=done.stop_reason,
        )
        text_blocks = [b.get("text", "") for b in done.content if b.get("type") == "text"]
        return ("".join(text_blocks) or "".join(parts)).strip()

    return summarize
