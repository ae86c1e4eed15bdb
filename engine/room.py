"""Room in the window for a request whose whole context is one turn: a subagent's (LM-2).

A run makes room from its stored path: the ladder compacts the history before the turn
(`agents.turns.room_making_hook`). A subagent has no stored path, only its task and its own
turn, and the ladder never touches a turn (CH-13: the latest prompt and what follows stay
literal). So past the window its older tool results are sent as one-line stubs instead:
the oldest first, uneventful ones before failures, never the results the model has not
seen yet, down to the compaction target so that the next steps need no new rewrite. The
turn's record keeps them whole (the loop applies the stubs to what it sends). Where that is
not enough, the reply is asked for in the room that is left, as for a run.
"""

from __future__ import annotations

from typing import Any

from engine.context.ladder import elided_result, is_uneventful, tool_names
from engine.context.transcript import transcript_tokens
from engine.loop import RequestSize, Room


def turn_room(
    turn: list[dict[str, Any]],
    size: RequestSize,
    *,
    window: int,
    max_tokens: int,
    factor: float,
    fit_share: float,
    target_share: float,
    min_output: int,
    image_rule: str = "area",
) -> Room | None:
    """What the next request of a one-turn context is sent with, or None when it fits as it is.

    `size` and `turn` are the request as it would go (earlier stubs applied); `factor` brings
    our estimate to the provider's units. The request fits when its calibrated size plus
    `max_tokens` is within `fit_share` of the window; stubs aim at `target_share`. `image_rule` is how
    the provider bills images (`size` was counted with it), so a stubbed screenshot frees what it cost.
    """
    limit = window * fit_share
    if size.estimated * factor + max_tokens <= limit:
        return None
    # In our estimate's units: what must go for the request to fit, and what would reach the target.
    excess = (size.estimated * factor + max_tokens - limit) / factor
    to_target = size.estimated - window * target_share / factor
    stubs, freed = elide_turn_results(turn, need_tokens=int(max(excess, to_target)) + 1, image_rule=image_rule)
    estimated = size.estimated - freed
    if estimated * factor + max_tokens <= limit:
        return Room(results=stubs)
    room = int(limit - estimated * factor)
    return Room(results=stubs or None, max_tokens=max(min_output, min(max_tokens, room)))


def elide_turn_results(
    turn: list[dict[str, Any]], *, need_tokens: int, image_rule: str = "area"
) -> tuple[dict[str, Any], int]:
    """Stubs (tool_use_id -> the tool_result sent instead) for the oldest results of `turn` that free
    `need_tokens`, and how many they free. The last message (results the model has not seen) is kept."""
    names = tool_names(turn)
    candidates = [
        block
        for message in turn[:-1]
        if message.get("role") == "user" and isinstance(message.get("content"), list)
        for block in message["content"]
        if block.get("type") == "tool_result" and not _is_stub(block)
    ]
    # Uneventful output first; a failure is what the model reads again, so it goes last.
    ordered = [b for b in candidates if is_uneventful(b)] + [b for b in candidates if not is_uneventful(b)]
    stubs: dict[str, Any] = {}
    freed = 0
    for block in ordered:
        if freed >= need_tokens:
            break
        stub = elided_result(block, names.get(block["tool_use_id"], "tool"), where=None)
        saved = (
            transcript_tokens([_carrier(block)], image_rule=image_rule)
            - transcript_tokens([_carrier(stub)], image_rule=image_rule)
            if stub
            else 0
        )
        if stub is None or saved <= 0:
            continue  # a short output costs what its stub would: the model keeps it
        stubs[block["tool_use_id"]] = stub
        freed += saved
    return stubs, freed


def _is_stub(block: dict[str, Any]) -> bool:
    content = block.get("content")
    first = content[0] if isinstance(content, list) and content else content
    text = first.get("text", "") if isinstance(first, dict) else first
    return isinstance(text, str) and text.startswith("[elided: ")


def _carrier(block: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": [block]}
