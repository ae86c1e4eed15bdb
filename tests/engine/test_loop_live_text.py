"""The text a turn streams live adds up to the text it stores, also when a reply cut by max_tokens
is continued (its trailing whitespace goes from the prefill, the continuation brings its own)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine.loop import run_turn
from engine.providers.protocol import MessageDone, ProviderEvent, TextDelta, ToolUseBlock, Usage
from engine.request import ModelRequestSpec, text_block
from toolcatalog.builtins import WorkspaceToolBox


class ScriptedStream:
    """A provider that streams each scripted reply as the given deltas, then its final message."""

    name = "scripted"
    supports_prefill = True

    def __init__(self, *replies: tuple[list[Any], str]) -> None:
        self.replies = list(replies)
        self.requests: list[ModelRequestSpec] = []

    def stream(self, request: ModelRequestSpec) -> Iterator[ProviderEvent]:
        self.requests.append(request)
        pieces, stop_reason = self.replies.pop(0)
        content: list[dict[str, Any]] = []
        for piece in pieces:
            if isinstance(piece, str):
                yield TextDelta(piece)
                if content and content[-1]["type"] == "text":
                    content[-1] = {"type": "text", "text": content[-1]["text"] + piece}
                else:
                    content.append({"type": "text", "text": piece})
            else:
                yield piece
                content.append({"type": "tool_use", "id": piece.id, "name": piece.name, "input": piece.input})
        yield MessageDone(content=content, stop_reason=stop_reason, usage=Usage(input_tokens=10, output_tokens=8))


def _turn(provider: ScriptedStream, tmp_path) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    outcome = run_turn(
        provider=provider,
        model="scripted-1",
        system=[text_block("You are terse.")],
        history=[{"role": "user", "content": [text_block("go")]}],
        toolbox=WorkspaceToolBox(tmp_path, approve=lambda name, arguments: True),
        emit=lambda kind, payload: events.append((kind, payload)),
    )
    return outcome, events


def _live(events: list[tuple[str, dict[str, Any]]]) -> str:
    return "".join(payload["text"] for kind, payload in events if kind == "text_delta")


def _stored(outcome) -> str:
    return "".join(
        b["text"] for m in outcome.messages if m["role"] == "assistant" for b in m["content"] if b["type"] == "text"
    )


@pytest.mark.req("UX-1")
def test_a_continued_reply_streams_exactly_the_text_it_stores(tmp_path):
    provider = ScriptedStream(
        (["The answer is in your ", "   "], "max_tokens"),
        ([" ", "last message."], "end_turn"),
    )
    outcome, events = _turn(provider, tmp_path)
    assert [m["role"] for m in outcome.messages] == ["assistant"]  # one message, as if never cut
    assert _stored(outcome) == "The answer is in your last message."
    assert _live(events) == _stored(outcome)
    assert provider.requests[1].messages[-1]["content"][-1]["text"] == "The answer is in your"  # the prefill


@pytest.mark.req("UX-1")
def test_whitespace_that_stays_in_the_stored_reply_is_streamed_too(tmp_path):
    call = ToolUseBlock(id="toolu_1", name="list_dir", input={"path": "."})
    provider = ScriptedStream(
        (["Let me look.\n\n", call], "tool_use"),
        (["Two\n\n", "paragraphs ", "and a trailing newline.\n"], "end_turn"),
    )
    outcome, events = _turn(provider, tmp_path)
    assert _stored(outcome) == "Let me look.\n\nTwo\n\nparagraphs and a trailing newline.\n"
    assert _live(events) == _stored(outcome)
    call_at = next(i for i, (kind, payload) in enumerate(events) if kind == "tool_call")
    assert _live(events[:call_at]) == "Let me look.\n\n"  # shown before the call, as stored before it
    assert [payload["step"] for kind, payload in events if kind == "text_delta"][-1] == 2
