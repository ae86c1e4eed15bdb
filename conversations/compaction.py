"""One compaction pass over a path, the way every caller makes it (CH-1, CH-11).

`/compact`, `/shake`, the API and the runtime's proactive and reactive passes all come
here. A pass starts from the stored messages of the path (never from the previous view's
pages or its frozen tail), so the same messages give the same view; and it is recorded
only when it frees enough against what the path sends now.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from django.conf import settings
from django.utils import timezone

from conversations import selectors
from conversations.models import Compaction
from engine.context import ladder, snapshots, transcript
from scratchpad import services as scratchpad
from scratchpad.models import Entry


@dataclass(frozen=True)
class CompactionPass:
    """What a pass did: the recorded compaction (None when it was not worth recording) and the ladder's report."""

    compaction: Compaction | None
    result: ladder.LadderResult
    # The history the path sends now (its latest view plus later messages), and the pass's view.
    view_now: list[dict[str, Any]]
    tokens_now: int
    freed: int
    required: int

    @property
    def view(self) -> list[dict[str, Any]]:
        """What the path sends after this pass: the new view if recorded, else what it sent before."""
        # Created by compaction_pass below with its view set; only the column allows none.
        return cast("list[dict[str, Any]]", self.compaction.view) if self.compaction is not None else self.view_now

    @property
    def reason(self) -> str:
        if self.compaction is not None:
            return ""
        if self.freed >= self.required:
            return f"the view would still be {self.result.tokens_after} tokens; nothing was recorded"
        if self.freed < 0:
            # A pass starts again from the stored messages: after a summary, free rungs alone give
            # back more than the summarised view sends (QA: "freed": -3827 with no word why).
            return (
                f"the pass starts again from the stored messages and would leave {self.result.tokens_after} "
                f"tokens, more than the {self.tokens_now} the current view (an earlier compaction) sends; "
                "nothing was recorded"
            )
        return (
            f"the pass would free {max(0, self.freed)} tokens of the {self.tokens_now} its messages send now "
            "(the system prompt and tools are not compacted), "
            f"less than the {self.required} a pass must free; nothing was recorded"
        )


def tail_budget(target_tokens: int) -> int:
    """The literal tail a pass keeps: CC_COMPACT_TAIL_TOKENS, but never more than half the target,
    so the tail alone cannot keep a small window from fitting."""
    tail = settings.CC_COMPACT_TAIL_TOKENS
    return min(tail, max(1, target_tokens // 2)) if target_tokens > 0 else tail


def minimum_freed(result: ladder.LadderResult, shape: snapshots.PageShape, image_rule: str = "area") -> int:
    """A pass must free CC_COMPACT_MIN_FREED_TOKENS, and at least one page's cost when it made pages."""
    page_cost = transcript.image_tokens(shape.width, shape.height, rule=image_rule) if result.pages else 0
    return max(settings.CC_COMPACT_MIN_FREED_TOKENS, page_cost)


def compaction_pass(
    *,
    conversation_id: int,
    tip_id: int,
    rungs: Sequence[str],
    target_tokens: int = 0,
    trigger: str = "command",
    run: Any = None,
    summarize: Callable[[str], str] | None = None,
    fit_tokens: int | None = None,
    summary_input_chars: int = ladder.SUMMARY_INPUT_CHARS,
    image_rule: str = "area",
) -> CompactionPass:
    """Run the ladder over the stored path to `tip_id` and record it if it frees enough (CH-11).

    With `fit_tokens`, a view still larger than that is not recorded either: a failed
    pass's view is never kept for later turns (CH-12). A pass beyond the free rungs holds
    the literal head and tail to their budget through the scratchpad (CH-13). Images are counted
    by `image_rule`, the billing rule of the provider the view goes to (CH-12).
    """
    path = selectors.path_to(conversation_id=conversation_id, tip_id=tip_id)
    view_now = selectors.view_of_path(conversation_id=conversation_id, path=path)
    tokens_now = transcript.transcript_tokens(view_now, image_rule=image_rule)
    # Pages sized to the model's window (LM-2).
    shape = snapshots.page_for_window(settings.CC_SNAPSHOT_PAGE_PIXELS)
    result = ladder.compact(
        selectors.source_of_path(conversation_id=conversation_id, path=path),
        rungs=rungs,
        target_tokens=target_tokens,
        tail_tokens=tail_budget(target_tokens),
        summarize=summarize,
        shape=shape,
        image_rule=image_rule,
        offload=None if set(rungs) <= set(ladder.FREE_RUNGS) else literal_offload(conversation_id),
        summary_input_chars=summary_input_chars,
    )
    freed = tokens_now - result.tokens_after
    required = minimum_freed(result, shape, image_rule)
    if freed < required or (fit_tokens is not None and result.tokens_after > fit_tokens):
        return CompactionPass(None, result, view_now, tokens_now, freed, required)
    compaction = Compaction.objects.create(
        conversation_id=conversation_id,
        tip_id=tip_id,
        rung=result.rung,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
        target_tokens=target_tokens,
        steps=[step.as_dict() for step in result.steps],
        replaced=result.replaced,
        trigger=trigger,
        view=transcript.api_messages(result.messages),
        run=run,
    )
    return CompactionPass(compaction, result, view_now, tokens_now, freed, required)


def literal_offload(conversation_id: int) -> ladder.Offload:
    """The scratchpad side of CH-13: a text too large to keep literal becomes a pinned entry of the
    conversation (readable with `scratchpad_read` in its later turns, SP-11). The same text reuses
    its live entry, so the same messages still give the same view (CH-11). Within the owner's
    scratchpad quota: past it there is no entry, and the view says the middle cannot be read."""

    def offload(text: str, message_id: Any) -> str | None:
        digest = hashlib.sha256(text.encode()).hexdigest()
        existing = (
            Entry.objects.filter(
                conversation_id=conversation_id, pinned=True, expires_at__gt=timezone.now(), metadata__sha256=digest
            )
            .values_list("pk", flat=True)
            .first()
        )
        if existing is not None:
            return str(existing)
        entry = scratchpad.put_within_quota(
            turn_id=f"conversation-{conversation_id}",
            content=text,
            kind="text",
            executor_name=f"message #{message_id}",
            conversation_id=conversation_id,
            pinned=True,
            ttl_seconds=scratchpad.DEFAULT_PINNED_TTL_SECONDS,
            metadata={"message": message_id, "sha256": digest},
        )
        return str(entry.pk) if isinstance(entry, Entry) else None

    return offload
