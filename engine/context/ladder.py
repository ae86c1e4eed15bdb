"""The context recovery ladder, cheapest rung first (CH-1, CH-2).

    elide        old, uneventful tool results become a stub       free, loses nothing read again
    drop_images  old screenshots become a caption                 free
    snapshot     the middle becomes pages of glyphs (snapshots)   free: no model call, no key
    (scratchpad) the literal parts' excess goes to the scratchpad     free: text kept at both ends (CH-13)
    summary      the middle becomes a summary                     one model call, last resort

Pure: the caller hands in the path as plain messages (with their database `id`)
and gets back a compacted view plus what each rung freed. The original messages
are never changed; the database keeps every one of them, so a compaction is a view
over the path that can be inspected and undone. Every pass starts again from the
stored messages: snapshots image the middle's retained text (after elision and
image dropping), never an earlier pass's pages (CH-4).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.actions import result_text
from engine.context import snapshots
from engine.context.transcript import Msg, image_size, transcript_tokens, trim_for_resume
from engine.tokens import CHARS_PER_TOKEN, estimate_text_tokens

RUNGS = ("elide", "drop_images", "snapshot", "summary")
FREE_RUNGS = ("elide", "drop_images")
DEFAULT_TAIL_TOKENS = 8_000
# The summary request must never itself overflow: its input is capped.
SUMMARY_INPUT_CHARS = 60_000
# A block the scratchpad takes keeps at least this much text at each end (CH-13).
OFFLOAD_KEEP_CHARS = 400
_SCRATCHPAD_ID = re.compile(r'"(?:scratchpad_id|entry_id)"\s*:\s*"?([\w-]+)')

Summarize = Callable[[str], str]
# (the whole text of a block, the id of its message) -> the scratchpad entry that keeps it.
# The scratchpad entry that now holds a text, or None when its owner's scratchpad has no room for it.
Offload = Callable[[str, Any], str | None]


@dataclass
class RungReport:
    rung: str
    tokens_before: int
    tokens_after: int
    items: int = 0
    note: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def freed(self) -> int:
        return self.tokens_before - self.tokens_after

    def as_dict(self) -> dict[str, Any]:
        return {
            "rung": self.rung,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "freed": self.freed,
            "items": self.items,
            "note": self.note,
            **({"detail": self.detail} if self.detail else {}),
        }


@dataclass
class LadderResult:
    messages: list[Msg]
    tokens_before: int
    tokens_after: int
    steps: list[RungReport]
    replaced: list[dict[str, Any]]
    pages: list[snapshots.Page] = field(default_factory=list)

    @property
    def rung(self) -> str:
        """The most expensive rung that changed anything ('none' when nothing did)."""
        changed = [step.rung for step in self.steps if step.items]
        return changed[-1] if changed else "none"


def compact(
    messages: Sequence[Msg],
    *,
    rungs: Sequence[str] = RUNGS,
    target_tokens: int = 0,
    tail_tokens: int = DEFAULT_TAIL_TOKENS,
    summarize: Summarize | None = None,
    shape: snapshots.PageShape = snapshots.PAGE_SHAPES["area"],
    image_rule: str = "area",
    offload: Offload | None = None,
    summary_input_chars: int = SUMMARY_INPUT_CHARS,
) -> LadderResult:
    """Climb the requested rungs in ladder order until the view fits `target_tokens` (0: climb them all).

    The head (the first message: the task and its constraints) and the tail (the
    most recent messages within `tail_tokens`, cut where no call loses its result)
    stay literal; only the old middle is elided, dropped, imaged or summarized.
    With `offload` and a target still missed after the snapshot rung, literal parts
    larger than `tail_tokens` (a prompt bigger than the window's budget for the tail)
    keep the start and end of their largest text blocks and hand the whole text to the
    scratchpad, before the summary rung (CH-13).
    """
    unknown = [rung for rung in rungs if rung not in RUNGS]
    if unknown:
        raise ValueError(f"unknown rung(s) {', '.join(unknown)}; the rungs are {', '.join(RUNGS)}")
    original = [dict(message) for message in messages]
    tokens_before = transcript_tokens(original, image_rule=image_rule)
    head_end = 1 if original and original[0].get("role") == "user" else 0
    tail_start = max(
        head_end,
        trim_for_resume(original[head_end:], budget_tokens=tail_tokens, image_rule=image_rule).start + head_end,
    )
    # The latest prompt and everything after it stay text however large (CH-13): a page must
    # never hold the only copy of what the model is asked to do now.
    tail_start = max(head_end, min(tail_start, latest_prompt_index(original)))
    head, middle, tail = original[:head_end], copy.deepcopy(original[head_end:tail_start]), original[tail_start:]
    replacement: Msg | None = None
    steps: list[RungReport] = []
    replaced: list[dict[str, Any]] = []
    pages: list[snapshots.Page] = []

    def view() -> list[Msg]:
        return _merge_roles([*head, *([replacement] if replacement else middle), *tail])

    current = tokens_before
    for rung in (*RUNGS[:3], "scratchpad", *RUNGS[3:]):
        # The scratchpad rung holds the literal parts to their budget only when a target says the view must shrink.
        if rung not in rungs and not (rung == "scratchpad" and offload is not None and target_tokens):
            continue
        if target_tokens and current <= target_tokens:
            break
        report = RungReport(rung, current, current)
        if rung == "scratchpad" and offload is not None:
            head, tail = _offload_literal(head, tail, tail_tokens, offload, replaced, image_rule)
            report.items = sum(1 for item in replaced if item["kind"] == "scratchpad")
            if not report.items:
                continue
        elif rung == "elide" and replacement is None:
            report.items = _elide(middle, replaced)
        elif rung == "drop_images" and replacement is None:
            report.items = _drop_images(middle, replaced)
        elif rung == "snapshot" and middle:
            # The retained source text: the middle as the free rungs left it, rebuilt
            # from the stored messages at every pass, never from earlier pages (CH-4).
            source = middle
            pages, snapshot_report = snapshots.render(source, shape=shape, image_rule=image_rule)
            candidate = _replacement(source, "snapshot", [page.as_block() for page in pages])
            # Text becomes pixels only when that saves at least one page's worth of tokens:
            # a page is harder to read back than the text it replaces.
            page_cost = snapshot_report.image_tokens_per_page
            as_text = transcript_tokens(middle, image_rule=image_rule)
            saving = as_text - transcript_tokens([candidate], image_rule=image_rule)
            if saving >= page_cost:
                replacement = candidate
                report.items = len(pages)
                report.detail = snapshot_report.as_dict()
                replaced.append({"kind": "snapshot", "messages": _ids(source), "pages": len(pages)})
            else:
                pages = []
                report.note = f"pages would save {saving} tokens, less than one page costs ({page_cost})"
        elif rung == "summary" and middle:
            if summarize is None:
                report.note = "no summarizer is available here (summaries need a model call)"
            else:
                source = middle
                summary = summarize(_bounded_source_text(source, summary_input_chars)).strip()
                if summary:
                    replacement = _replacement(source, "summary", [{"type": "text", "text": summary}])
                    pages = []
                    report.items = 1
                    replaced.append({"kind": "summary", "messages": _ids(source)})
                else:
                    # An empty text block is refused by providers; the view keeps what the rungs below made.
                    report.note = "the model answered the summary request with no text"
        current = transcript_tokens(view(), image_rule=image_rule)
        report.tokens_after = current
        steps.append(report)
    return LadderResult(view(), tokens_before, current, steps, replaced, pages)


def latest_prompt_index(messages: Sequence[Msg]) -> int:
    """Index of the latest message a person wrote (user text, not tool results); len(messages) if none."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        blocks = message.get("content") or []
        results = not isinstance(blocks, str) and any(b.get("type") == "tool_result" for b in blocks)
        if message.get("role") == "user" and not results:
            return index
    return len(messages)


def _ids(messages: Sequence[Msg]) -> list[Any]:
    return [message.get("id") for message in messages]


def tool_names(messages: Sequence[Msg]) -> dict[str, str]:
    return {
        block["id"]: block.get("name", "?")
        for message in messages
        for block in message.get("content") or []
        if block.get("type") == "tool_use"
    }


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(item.get("type") in ("text", "tool_reference") for item in content):
        return result_text(block)
    return json.dumps(content, sort_keys=True, ensure_ascii=False)


def _references(block: dict[str, Any]) -> list[dict[str, Any]]:
    # A tool the result loaded stays loaded once the output is elided (TD-11).
    content = block.get("content")
    return [item for item in content if item.get("type") == "tool_reference"] if isinstance(content, list) else []


def is_uneventful(block: dict[str, Any]) -> bool:
    if block.get("is_error"):
        return False
    text = _result_text(block)
    # A failed tool reports ok=false in its observation; failures are what one re-reads.
    return '"ok": false' not in text and '"ok":false' not in text


def elided_result(block: dict[str, Any], tool_name: str, *, where: str | None) -> dict[str, Any] | None:
    """`block` (a tool_result) with its output replaced by a one-line stub; None when the stub is not shorter.

    The tool_use_id stays, so the call keeps its result, and so do its tool_reference blocks:
    a tool the result loaded stays loaded (TD-11). `where` names the stored message that keeps
    the output; None when nothing stored does (a subagent's turn): then only a scratchpad
    entry can, or the model calls the tool again.
    """
    text = _result_text(block)
    found = _SCRATCHPAD_ID.search(text)
    if where is not None:
        keeper = f"{where}{f', scratchpad entry {found.group(1)}' if found else ''} keeps it in full"
    else:
        keeper = f"scratchpad entry {found.group(1)} keeps it in full" if found else "call the tool again to see it"
    kind = "uneventful " if is_uneventful(block) else ""
    stub = f"[elided: {len(text)} chars of {kind}{tool_name} output; {keeper}]"
    if len(stub) >= len(text):
        return None
    references = _references(block)
    content: str | list[dict[str, Any]] = [{"type": "text", "text": stub}, *references] if references else stub
    return {
        "type": "tool_result",
        "tool_use_id": block["tool_use_id"],
        "content": content,
        **({"is_error": True} if block.get("is_error") else {}),
    }


def _elide(middle: list[Msg], replaced: list[dict[str, Any]]) -> int:
    names = tool_names(middle)
    count = 0
    for message in middle:
        for index, block in enumerate(message.get("content") or []):
            if block.get("type") != "tool_result" or not is_uneventful(block) or block.get("elided"):
                continue
            where = f"message #{message.get('id')}" if message.get("id") is not None else "the transcript"
            stub = elided_result(block, names.get(block.get("tool_use_id"), "tool"), where=where)
            if stub is None:
                continue
            message["content"][index] = stub
            replaced.append(
                {"kind": "elided", "message": message.get("id"), "block": index, "chars": len(_result_text(block))}
            )
            count += 1
    return count


def _drop_images(middle: list[Msg], replaced: list[dict[str, Any]]) -> int:
    count = 0

    def caption(block: dict[str, Any], message: Msg) -> dict[str, Any]:
        size = image_size(block)
        shape = f"{size[0]}x{size[1]} " if size else ""
        return {
            "type": "text",
            "text": f"[image dropped: {shape}screenshot from message #{message.get('id')}; the transcript keeps it]",
        }

    for message in middle:
        content = message.get("content") or []
        for index, block in enumerate(content):
            if block.get("type") == "image":
                content[index] = caption(block, message)
                replaced.append({"kind": "image_dropped", "message": message.get("id"), "block": index})
                count += 1
            elif block.get("type") == "tool_result" and isinstance(block.get("content"), list):
                inner = block["content"]
                for inner_index, inner_block in enumerate(inner):
                    if inner_block.get("type") == "image":
                        inner[inner_index] = caption(inner_block, message)
                        where = {"message": message.get("id"), "block": index, "inner": inner_index}
                        replaced.append({"kind": "image_dropped", **where})
                        count += 1
    return count


def _offload_literal(
    head: list[Msg], tail: list[Msg], budget: int, offload: Offload, replaced: list[dict[str, Any]], image_rule: str
) -> tuple[list[Msg], list[Msg]]:
    """Head and tail held to `budget` tokens: the largest text blocks keep their two ends as text and
    the whole block goes to the scratchpad (CH-13). The latest prompt is never an image, and never lost."""
    literal = [*head, *tail]
    excess = transcript_tokens(literal, image_rule=image_rule) - budget
    if excess <= 0:
        return head, tail
    literal = [{**message, "content": _block_list(message.get("content"))} for message in literal]
    blocks = [
        (len(text), m, b)
        for m, message in enumerate(literal)
        for b, block in enumerate(message["content"])
        if (text := _plain_text(block)) is not None
    ]
    for length, m, b in sorted(blocks, key=lambda item: (-item[0], item[1], item[2])):
        if excess <= 0:
            break
        message, block = literal[m], literal[m]["content"][b]
        text = _plain_text(block) or ""
        keep = max(OFFLOAD_KEEP_CHARS, (length - excess * CHARS_PER_TOKEN - 400) // 2)
        if 2 * keep + 400 >= length:
            continue
        entry = offload(text, message.get("id"))
        where = f"message #{message.get('id')}" if message.get("id") is not None else "this message"
        kept = (
            f"the whole text of {where} is scratchpad entry {entry}: read it with scratchpad_read"
            if entry is not None
            else f"the user's scratchpad is full, so the whole text of {where} cannot be read here"
        )
        note = (
            f"\n[... {length - 2 * keep} characters left out here (characters {keep} to {length - keep} of "
            f"{length}); {kept} ...]\n"
        )
        cut = text[:keep] + note + text[length - keep :]
        message["content"][b] = {**block, "text": cut} if block.get("type") == "text" else {**block, "content": cut}
        excess -= estimate_text_tokens(text) - estimate_text_tokens(cut)
        replaced.append({"kind": "scratchpad", "message": message.get("id"), "block": b, "chars": length,
                         "entry": entry})  # fmt: skip
    return literal[: len(head)], literal[len(head) :]


def _block_list(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [dict(block) for block in content or []]


def _plain_text(block: dict[str, Any]) -> str | None:
    """The text of a block the scratchpad can take: prose, or a tool's plain-text output."""
    if block.get("type") == "text":
        return str(block.get("text", ""))
    if block.get("type") == "tool_result" and isinstance(block.get("content"), str):
        return str(block["content"])
    return None


def _replacement(source: Sequence[Msg], kind: str, blocks: list[dict[str, Any]]) -> Msg:
    ids = [i for i in _ids(source) if i is not None]
    span = f"messages #{ids[0]}-#{ids[-1]}" if ids else f"{len(source)} messages"
    intro = {
        "type": "text",
        "text": f"[{kind} of {span} ({len(source)} messages); the database keeps them verbatim]",
    }
    return {"role": "user", "content": [intro, *blocks]}


def _bounded_source_text(source: Sequence[Msg], limit: int = SUMMARY_INPUT_CHARS) -> str:
    text = "\n".join(line.text for line in snapshots.source_lines(source))
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + f"\n[... {len(text) - 2 * half} chars left out ...]\n" + text[-half:]


def _merge_roles(messages: Sequence[Msg]) -> list[Msg]:
    """Join consecutive messages of one role, as providers do, so the view alternates."""
    merged: list[Msg] = []
    for message in messages:
        if merged and merged[-1]["role"] == message["role"]:
            previous = merged[-1]
            ids = previous.get("ids", [previous.get("id")])
            merged[-1] = {
                "role": message["role"],
                "content": [*previous["content"], *message["content"]],
                "ids": [*ids, message.get("id")],
            }
        else:
            merged.append(message)
    return merged


class ContextOverflow(Exception):
    """One pass of the ladder could not bring the history under the limit."""

    def __init__(self, result: LadderResult, limit_tokens: int) -> None:
        super().__init__(
            f"The history is still {result.tokens_after} tokens after compaction (rung: {result.rung}); "
            f"the limit is {limit_tokens}. It was {result.tokens_before} tokens before."
        )
        self.result = result
        self.limit_tokens = limit_tokens


def compact_to_fit(messages: Sequence[Msg], *, limit_tokens: int, **options: Any) -> LadderResult:
    """One pass of the ladder toward `limit_tokens`; never loops (CH-2).

    If the pass does not fit, the caller gets a clear error with the size still
    left, rather than another pass that would shave the same history again.
    """
    if limit_tokens <= 0:
        raise ValueError("limit_tokens must be positive")
    result = compact(messages, target_tokens=limit_tokens, **options)
    if result.tokens_after > limit_tokens:
        raise ContextOverflow(result, limit_tokens)
    return result
