"""The offline model answers the latest prompt of a compacted view, never the first one (CH-3, CH-13).

A compaction view merges the first prompt, the snapshot pages (or the summary) of the
middle and the latest prompt into one user message; the offline model read all its
text and ran the first prompt's shell command again.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.context.ladder import compact
from engine.context.transcript import api_messages
from engine.emulator import Emulator, TestClock
from engine.providers.offline import OfflineProvider
from engine.providers.protocol import MessageDone, TextDelta, ToolUseBlock
from engine.request import ModelRequestSpec

BASH = {"name": "bash", "description": "Run a shell command.", "input_schema": {"type": "object"}}
LIST_DIR = {"name": "list_dir", "description": "List a directory.", "input_schema": {"type": "object"}}
LATEST = "Notes 7: what did we decide about the release?"


def text(role: str, value: str) -> dict[str, Any]:
    return {"role": role, "content": [{"type": "text", "text": value}]}


def history() -> list[dict[str, Any]]:
    """A first prompt that runs a command, a long middle of notes, and a latest prompt that runs nothing."""
    messages = [
        text("user", "run `echo FIRST`"),
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "echo FIRST"}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"exit_code": 0}'}],
        },
        text("assistant", "The command printed FIRST."),
    ]
    for n in range(1, 7):
        messages += [
            text("user", f"Notes {n}: " + "the release plan needs more review " * 120),
            text("assistant", "Noted."),
        ]
    return [*messages, text("user", LATEST)]


def answer(messages: list[dict[str, Any]]) -> tuple[str, list[ToolUseBlock], MessageDone]:
    spec = ModelRequestSpec(model="offline-1", system=[], tools=[BASH, LIST_DIR], messages=messages)
    events = list(OfflineProvider(emulator=Emulator(clock=TestClock())).stream(spec))
    said = "".join(e.text for e in events if isinstance(e, TextDelta))
    done = events[-1]
    assert isinstance(done, MessageDone)
    return said, [e for e in events if isinstance(e, ToolUseBlock)], done


@pytest.mark.req("CH-3")
@pytest.mark.req("CH-13")
def test_after_a_snapshot_the_offline_model_answers_the_latest_prompt_and_reruns_nothing():
    # As conversations/compaction.py stores the view.
    view = api_messages(compact(history(), rungs=("snapshot",), tail_tokens=50).messages)
    last = view[-1]["content"]
    # The shape QA met: the first prompt, the pages, then the latest prompt, in one user message.
    assert last[0]["text"] == "run `echo FIRST`" and any(b["type"] == "image" for b in last)
    assert last[-1]["text"] == LATEST

    said, calls, done = answer(view)

    assert calls == [] and done.stop_reason == "end_turn"
    assert f'You wrote 9 words: "{LATEST}"' in said
    assert "FIRST" not in said and "snapshot of" not in said


@pytest.mark.req("CH-13")
def test_after_a_summary_the_offline_model_answers_the_latest_prompt_not_the_summary():
    merged = {
        "role": "user",
        "content": [
            {"type": "text", "text": "run `echo FIRST`"},
            {"type": "text", "text": "[summary of messages #2-#15 (14 messages); the database keeps them verbatim]"},
            {"type": "text", "text": "The user asked to run `echo FIRST`, which printed FIRST; notes followed."},
            {"type": "text", "text": "what files are here?"},
        ],
    }

    said, calls, _ = answer([merged])

    assert [(c.name, c.input) for c in calls] == [("list_dir", {"path": "."})]
    assert 'You wrote 4 words: "what files are here?"' in said


@pytest.mark.req("CH-13")
def test_a_prompt_after_tool_results_in_one_message_is_answered_and_notes_before_a_prompt_stay_with_it():
    after_results = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"exit_code": 0}'},
            {"type": "text", "text": "run `echo SECOND`"},
        ],
    }
    call = history()[1]
    _, calls, _ = answer([text("user", "go on"), call, after_results])
    assert [(c.name, c.input) for c in calls] == [("bash", {"command": "echo SECOND"})]

    # A subagent's first message is its role, then its task: both are its prompt.
    role_and_task = {
        "role": "user",
        "content": [{"type": "text", "text": "Your profile: worker."}, {"type": "text", "text": "run `echo TASK`"}],
    }
    said, calls, _ = answer([role_and_task])
    assert [(c.name, c.input) for c in calls] == [("bash", {"command": "echo TASK"})]
    assert 'You wrote 6 words: "Your profile: worker. run `echo TASK`"' in said
