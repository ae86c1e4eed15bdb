"""Pruning stale tool output of older turns (TD-12): a rare, deep rewrite, never a steady miss.

Every request of a run must start with the bytes of the one before (TD-11), so tool
output cannot be trimmed a little at every turn: each trim would rewrite the prefix and
miss the cache. Instead a *watermark* moves in large steps. Results of turns before the
watermark are replaced by a stub; the watermark advances only when moving it would free
at least `min_tokens`. The watermark is replayed from the stored history turn by turn,
so every turn computes the same watermark its predecessor used, plus at most one step:
the prefix changes only on the turn that step happens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.actions import result_as_text
from engine.request import text_block
from engine.tokens import estimate_text_tokens

Message = dict[str, Any]


@dataclass(frozen=True)
class PruneResult:
    messages: list[Message]
    watermark: int  # results of turns before this index (0-based turn number) are stubs
    results_pruned: int
    tokens_freed: int
    rewrote_now: bool  # the watermark moved on the current turn: this request is the rewrite


def _turn_starts(messages: list[Message]) -> list[int]:
    """Indexes of the user messages that open a turn (a person's text, not tool results)."""
    starts = []
    for index, message in enumerate(messages):
        if message["role"] != "user":
            continue
        blocks = message["content"]
        if not any(block.get("type") == "tool_result" for block in blocks):
            starts.append(index)
    return starts


def _freeable(messages: list[Message], start: int, end: int) -> int:
    """Tokens that stubbing every tool result in messages[start:end] would free."""
    total = 0
    for message in messages[start:end]:
        for block in message["content"]:
            if block.get("type") == "tool_result" and not _is_stub(block):
                total += max(0, estimate_text_tokens(result_as_text(block)) - STUB_TOKENS)
    return total


STUB_TOKENS = 40


def _is_stub(block: dict[str, Any]) -> bool:
    return '"_pruned": true' in result_as_text(block)


def _stub(block: dict[str, Any], tool_name: str) -> dict[str, Any]:
    original = result_as_text(block)
    note: dict[str, Any] = {
        "_pruned": True,
        "ok": not block.get("is_error", False),
        "tool": tool_name,
        "note": (
            f"The output of {tool_name} from an earlier turn ({estimate_text_tokens(original)} tokens) was pruned "
            "to free context. Run the tool again if you need it."
        ),
    }
    try:
        parsed = json.loads(original)
    except (json.JSONDecodeError, TypeError):
        parsed = None
    if isinstance(parsed, dict) and parsed.get("scratchpad_id"):
        # The full output is still in the scratchpad: say where, instead of "run it again".
        note["scratchpad_id"] = parsed["scratchpad_id"]
        note["note"] = f"The output of {tool_name} from an earlier turn is in the scratchpad entry named here."
    text = json.dumps(note, sort_keys=True)
    # A tool the result loaded stays loaded: the stub keeps its tool_reference blocks (TD-11).
    original_content = block.get("content")
    items = original_content if isinstance(original_content, list) else []
    references = [item for item in items if item.get("type") == "tool_reference"]
    content: str | list[dict[str, Any]] = [text_block(text), *references] if references else text
    stub = {"type": "tool_result", "tool_use_id": block["tool_use_id"], "content": content}
    if block.get("is_error"):
        stub["is_error"] = True
    return stub


def prune_stale_tool_output(messages: list[Message], *, keep_turns: int, min_tokens: int) -> PruneResult:
    """The history to send: tool results of turns older than the watermark replaced by stubs.

    Calls and results stay paired (only a result's content changes). `keep_turns` recent
    turns (the current one included) are never pruned.
    """
    starts = _turn_starts(messages)
    watermark = 0
    moved_at = -1
    for turn in range(len(starts)):
        candidate = turn + 1 - keep_turns  # turns before this may be pruned once `turn` is current
        if candidate <= watermark:
            continue
        begin = starts[watermark]
        end = starts[candidate]
        if _freeable(messages, begin, end) >= min_tokens:
            watermark, moved_at = candidate, turn
    if watermark == 0:
        return PruneResult(list(messages), 0, 0, 0, False)
    names = {
        block["id"]: block["name"]
        for message in messages
        for block in message["content"]
        if block.get("type") == "tool_use"
    }
    cut = starts[watermark]
    pruned: list[Message] = []
    count = freed = 0
    for index, message in enumerate(messages):
        if index >= cut or message["role"] != "user":
            pruned.append(message)
            continue
        blocks = []
        for block in message["content"]:
            if block.get("type") == "tool_result" and not _is_stub(block):
                stub = _stub(block, names.get(block["tool_use_id"], "a tool"))
                freed += estimate_text_tokens(result_as_text(block)) - estimate_text_tokens(result_as_text(stub))
                count += 1
                blocks.append(stub)
            else:
                blocks.append(block)
        pruned.append({**message, "content": blocks})
    return PruneResult(pruned, watermark, count, freed, moved_at == len(starts) - 1)
