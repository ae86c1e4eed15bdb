"""Pure views of a path: JSON and Markdown export (CH-10), the rewind digest (CH-9), the Context view."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from engine.actions import result_as_text, result_text
from engine.context.transcript import Msg, block_tokens, overhead_count, text_of, tool_result_ids
from engine.request import ModelRequestSpec
from engine.tokens import estimate_text_tokens

PREVIEW_CHARS = 200


def export_json(conversation: dict[str, Any], messages: Sequence[Msg]) -> dict[str, Any]:
    return {"format": "controlcenter.path/1", "conversation": conversation, "messages": list(messages)}


def export_markdown(conversation: dict[str, Any], messages: Sequence[Msg]) -> str:
    """The path as Markdown whose only headings are the export's own (SB-5).

    Every body a user, a model or a tool wrote is a fenced block longer than any backtick run in
    it, so no message can close its block and fake a `## Assistant` section or a tool call.
    """
    out = [f"# {_one_line(conversation.get('title', 'Conversation'))}", ""]
    for message in messages:
        out += [f"## {_one_line(message['role']).capitalize()} (#{_one_line(message.get('id'))})", ""]
        for note in message.get("rewind_notes") or []:
            out += ["**Rewind note**", "", _fenced(str(note), "text"), ""]
        for block in message.get("content") or []:
            kind = block.get("type")
            if kind == "text":
                out += [_fenced(block.get("text", ""), "text"), ""]
            elif kind == "tool_use":
                arguments = json.dumps(block.get("input") or {}, indent=2, sort_keys=True, ensure_ascii=False)
                out += [
                    f"**Tool call** {_code(block.get('name'))} ({_code(block.get('id'))})",
                    "",
                    _fenced(arguments, "json"),
                    "",
                ]
            elif kind == "tool_result":
                label = "Tool error" if block.get("is_error") else "Tool result"
                out += [f"**{label}** for {_code(block.get('tool_use_id'))}", "", _fenced(result_as_text(block)), ""]
            elif kind == "image":
                out += ["*[image]*", ""]
            else:
                out += [_fenced(json.dumps(block, sort_keys=True, ensure_ascii=False), "json"), ""]
    return "\n".join(out).rstrip() + "\n"


def _one_line(value: Any) -> str:
    return " ".join(str(value).split())


def _backtick_run(text: str) -> int:
    return max((len(run) for run in re.findall(r"`+", text)), default=0)


def _fenced(text: str, info: str = "") -> str:
    fence = "`" * max(3, _backtick_run(text) + 1)
    return f"{fence}{info}\n{text}\n{fence}"


def _code(value: Any) -> str:
    text = _one_line(value)
    ticks = "`" * (_backtick_run(text) + 1)
    return f"{ticks} {text} {ticks}" if text.startswith("`") or text.endswith("`") else f"{ticks}{text}{ticks}"


def exploration_digest(explored: Sequence[Msg]) -> dict[str, Any]:
    """What an exploration tried, which tools it called, and how it ended (CH-9)."""
    tools: Counter[str] = Counter()
    errors = 0
    tried = []
    for message in explored:
        for block in message.get("content") or []:
            if block.get("type") == "tool_use":
                tools[block.get("name", "?")] += 1
            elif block.get("type") == "tool_result" and (
                block.get("is_error") or '"ok": false' in str(block.get("content"))
            ):
                errors += 1
        if message.get("role") == "user" and not tool_result_ids(message):
            tried.append(text_of(message)[:PREVIEW_CHARS])
    last_answer = next((text_of(m) for m in reversed(explored) if m.get("role") == "assistant" and text_of(m)), "")
    return {
        "messages": len(explored),
        "from_message": explored[0].get("id") if explored else None,
        "to_message": explored[-1].get("id") if explored else None,
        "tried": tried,
        "tools": dict(sorted(tools.items())),
        "tool_errors": errors,
        "outcome": last_answer[: PREVIEW_CHARS * 2],
    }


def rewind_note(label: str, digest: dict[str, Any]) -> str:
    """The digest of a rewound exploration as the model reads it, in front of the next prompt (CH-9)."""
    tried = "; ".join(json.dumps(text, ensure_ascii=False) for text in digest.get("tried") or []) or "no new prompt"
    tools = ", ".join(f"{name} x{count}" for name, count in (digest.get("tools") or {}).items()) or "none"
    outcome = digest.get("outcome") or "no answer"
    return (
        f"[rewind note] After this point an exploration of {digest.get('messages', 0)} messages "
        f"(#{digest.get('from_message')}-#{digest.get('to_message')}) was tried and then rewound to checkpoint "
        f"{label!r}; it is kept in the tree but is not part of this conversation any more. "
        f"Prompts tried: {tried}. Tools called: {tools}; tool errors: {digest.get('tool_errors', 0)}. "
        f"How it ended: {json.dumps(outcome, ensure_ascii=False)}. "
        "Use what it found; do not repeat what failed unless asked to."
    )


CATEGORIES = (
    "system",
    "resident_tools",
    "tool_prompt",
    "tool_index",
    "messages",
    "tool_results",
    "scratchpad",
    "images",
    "snapshots",
)
CATEGORY_LABELS = {
    "system": "System prompt",
    "resident_tools": "Resident tool schemas",
    "tool_prompt": "Tool-use system prompt",
    "tool_index": "Deferred name index",
    "messages": "Messages",
    "tool_results": "Tool results",
    "scratchpad": "Scratchpad summaries",
    "images": "Images",
    "snapshots": "Snapshots",
    "free": "Free",
}


def is_scratchpad_stub(block: dict[str, Any]) -> bool:
    """A tool result that is the synthetic observation of an offloaded one (SP-3)."""
    content = block.get("content")
    if isinstance(content, list) and all(item.get("type") in ("text", "tool_reference") for item in content):
        content = result_text(block)  # an offload that loaded scratchpad_read carries a tool_reference
    if not isinstance(content, str) or '"scratchpad_id"' not in content:
        return False
    try:
        observation = json.loads(content)
    except ValueError:
        return False
    return isinstance(observation, dict) and isinstance(observation.get("scratchpad_id"), str)


def context_breakdown(
    request: ModelRequestSpec,
    *,
    window_tokens: int,
    tool_index_text: str = "",
    tool_prompt_tokens: int = 0,
    image_rule: str = "area",
) -> dict[str, Any]:
    """What fills the window, by category, for a request built the way a run builds it (CH-10 /context).

    The deferred-name index travels as a system block (TD-2); the block whose text is
    `tool_index_text` is counted as the index, not as the system prompt. `tool_prompt_tokens` is
    the system prompt the provider adds when the request has tools (`engine.tokens.tool_prompt_tokens`);
    `image_rule` how it bills images (`engine.context.transcript.provider_image_rule`).
    The total is `engine.context.transcript.request_tokens` of the same request (CH-12).
    """
    counts = dict.fromkeys(CATEGORIES, 0)
    for block in request.system:
        text = block.get("text", "")
        counts["tool_index" if tool_index_text and text == tool_index_text else "system"] += estimate_text_tokens(text)
    overhead = overhead_count([], request.tools, tool_prompt=tool_prompt_tokens)
    counts["resident_tools"], counts["tool_prompt"] = overhead.tools, overhead.tool_prompt
    for message in request.messages:
        counts["messages"] += 4
        in_snapshot = any(
            b.get("type") == "text" and str(b.get("text", "")).startswith("[snapshot of ")
            for b in message.get("content") or []
        )
        for block in message.get("content") or []:
            kind = block.get("type")
            tokens = block_tokens(block, image_rule=image_rule)
            if kind == "tool_result":
                counts["scratchpad" if is_scratchpad_stub(block) else "tool_results"] += tokens
            elif kind == "image":
                counts["snapshots" if in_snapshot else "images"] += tokens
            else:
                counts["messages"] += tokens
    used = sum(counts.values())
    free = max(0, window_tokens - used)
    return {
        "window_tokens": window_tokens,
        "used_tokens": used,
        "free_tokens": free,
        "categories": [{"name": name, "label": CATEGORY_LABELS[name], "tokens": counts[name]} for name in CATEGORIES]
        + [{"name": "free", "label": CATEGORY_LABELS["free"], "tokens": free}],
    }
