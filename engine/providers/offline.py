"""The offline model: deterministic, no network, no key.

It says plainly what it is, answers by echoing what it understood, and calls a
built-in tool when the user asks about the workspace, so a fresh installation can
show a full turn (text, tool call, tool result, reply) with nothing configured.

Its usage is accounted through the emulator's prompt cache (one per process), with
the request's own breakpoints, so cache figures on the dashboard are what the real
API would have reported for the same requests, not a flattering constant.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from typing import Any

from engine.actions import result_text
from engine.emulator import ApiError, Emulator
from engine.providers.protocol import MessageDone, ProviderEvent, TextDelta, ToolUseBlock, Usage, error_for_status
from engine.request import ModelRequestSpec
from engine.tokens import estimate_json_tokens, estimate_text_tokens

_WORKSPACE_WORDS = re.compile(r"\b(files?|workspace|directory|folder|ls)\b", re.IGNORECASE)
# "run `make test`" asks for the shell: the way to try approvals with no key.
_SHELL_REQUEST = re.compile(r"\brun\s+`([^`]+)`", re.IGNORECASE)


# "in parallel: run `a`; run `b`" fans out one subagent per task (TD-14).
_SPAWN_REQUEST = re.compile(r"\bin parallel:\s*(.+)", re.IGNORECASE | re.DOTALL)
# "call `time__get_current_time {"timezone": "UTC"}`" calls any tool by name (LM-3): deferred and
# imported ones too, which are not in the request's tool list until they are loaded.
_CALL_REQUEST = re.compile(r"\bcall\s+`([A-Za-z0-9_.:-]+)(?:\s+(\{.*?\}))?\s*`", re.IGNORECASE | re.DOTALL)


def _choose_tool(prompt: str, offered: set[str]) -> tuple[str, dict[str, Any]] | None:
    # A fan-out first: its tasks may themselves ask for calls, which the subagents make.
    spawn = _SPAWN_REQUEST.search(prompt)
    if spawn and "spawn_agents" in offered:
        tasks = [task.strip() for task in spawn.group(1).split(";") if task.strip()]
        if tasks:
            return "spawn_agents", {"tasks": tasks}
    call = _CALL_REQUEST.search(prompt)
    if call:
        try:
            arguments = json.loads(call.group(2)) if call.group(2) else {}
        except json.JSONDecodeError:
            arguments = None
        # Arguments that are not a JSON object are sent as they are, for the toolbox to refuse clearly.
        return call.group(1), arguments if isinstance(arguments, dict) else {"_unparsed": call.group(2)}
    command = _SHELL_REQUEST.search(prompt)
    if command and "bash" in offered:
        return "bash", {"command": command.group(1)}
    if _WORKSPACE_WORDS.search(prompt) and "list_dir" in offered:
        return "list_dir", {"path": "."}
    return None


# The intro of a compaction's replacement (engine/context/ladder.py): what follows it in the same
# message is the pages or the summary of the discarded middle, then the latest prompt.
_COMPACTION_INTRO = re.compile(r"\[(?:snapshot|summary) of .*; the database keeps them verbatim\]", re.DOTALL)


def latest_prompt(blocks: list[dict[str, Any]]) -> str:
    """The text the user message ends with, after its tool results, images and anything a compaction
    merged in front of it: the latest prompt, never the first one or the pages' intro (CH-13).

    A compaction view joins the first prompt, the replacement of the middle and the latest prompt
    into one user message (roles must alternate); acting on all its text ran the first prompt's
    command again. Notes written before a prompt (a rewind's digest, a subagent's role) stay with it.
    """
    trailing: list[str] = []
    for block in reversed(blocks):
        if block.get("type") != "text":
            break
        trailing.insert(0, str(block.get("text", "")))
    if any(_COMPACTION_INTRO.fullmatch(text.strip()) for text in trailing):
        # A summary is text too: only the last block is the prompt a person wrote.
        trailing = trailing[-1:]
    return " ".join(text for text in trailing if text)


_shared: Emulator | None = None
_shared_lock = threading.Lock()


def shared_emulator() -> Emulator:
    """The process's cache for offline runs: a worker's requests share it, as they would share the API's."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Emulator()
        return _shared


class OfflineProvider:
    name = "offline"
    # Accounted through the emulator's Anthropic-shaped cache, where deferred tools stay out of the prefix.
    defers_tool_loading = True

    def __init__(self, *, emulator: Emulator | None = None) -> None:
        self._emulator = emulator

    def stream(self, request: ModelRequestSpec) -> Iterator[ProviderEvent]:
        emulator = self._emulator or shared_emulator()
        try:
            cache_usage = emulator.measure(request.as_payload())
        except ApiError as exc:
            raise error_for_status(exc.status, exc.message) from exc
        last = request.messages[-1] if request.messages else {"role": "user", "content": []}
        blocks = [block for block in last["content"] if isinstance(block, dict)]
        results = [block for block in blocks if block.get("type") == "tool_result"]
        prompt = latest_prompt(blocks)
        call = None
        if results and not prompt:
            text = self._describe_results(results)
        else:
            text = self._answer(prompt)
            call = _choose_tool(prompt, {tool["name"] for tool in request.tools})
            if call is not None:
                text += {"list_dir": " Let me look at the workspace.", "spawn_agents": " Let me hand those out."}.get(
                    call[0], " Let me run that."
                )
        for chunk in _chunks(text):
            yield TextDelta(chunk)
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        if call is not None:
            tool_use = ToolUseBlock(id=_tool_use_id(request), name=call[0], input=call[1])
            yield tool_use
            content.append({"type": "tool_use", "id": tool_use.id, "name": tool_use.name, "input": tool_use.input})
        output_tokens = estimate_text_tokens(text) + (estimate_json_tokens(content[-1]) if call else 0)
        yield MessageDone(
            content=content,
            stop_reason="tool_use" if call else "end_turn",
            usage=Usage(
                input_tokens=cache_usage.input_tokens,
                cache_creation_input_tokens=cache_usage.cache_creation_input_tokens,
                cache_read_input_tokens=cache_usage.cache_read_input_tokens,
                cache_creation_5m_input_tokens=cache_usage.cache_creation_5m,
                cache_creation_1h_input_tokens=cache_usage.cache_creation_1h,
                output_tokens=output_tokens,
            ),
        )

    @staticmethod
    def _answer(prompt: str) -> str:
        words = prompt.split()
        quoted = " ".join(words[:40]) + (" …" if len(words) > 40 else "")
        return (
            "I am the offline model of Control Center: deterministic, with no network and no API key, "
            f'so I can only reflect what you sent. You wrote {len(words)} words: "{quoted}".'
        )

    @staticmethod
    def _describe_results(results: list[dict[str, Any]]) -> str:
        parts: list[str] = []
        for result in results:
            try:
                observation = json.loads(result_text(result) or "{}")
            except json.JSONDecodeError:
                observation = {"ok": False}
            if observation.get("ok") is False:
                parts.append(f"the tool failed: {observation.get('error', 'unknown error')}")
            elif "exit_code" in observation:
                output = (observation.get("stdout") or "").strip()
                parts.append(
                    f"the command exited with {observation['exit_code']}" + (f": {output[:200]}" if output else "")
                )
            elif "results" in observation:
                for child in observation["results"]:
                    said = child.get("text") or child.get("summary") or child.get("error", "")
                    parts.append(f"subagent {child.get('index')} said: {said[:200]}")
            elif "entries" in observation:
                names = [entry["name"] for entry in observation["entries"]]
                listing = ", ".join(names) if names else "nothing yet"
                parts.append(f"the workspace holds {len(names)} entries: {listing}")
            elif observation.get("text") or "structured_content" in observation:
                said = observation.get("text") or json.dumps(observation["structured_content"], sort_keys=True)
                parts.append(f"the tool answered: {said[:300]}")
            else:
                parts.append("the tool answered")
        return "I am the offline model. I ran the tool and " + "; ".join(parts) + "."


def _chunks(text: str) -> Iterator[str]:
    # Word-sized deltas, like a real stream, so the UI shows text arriving.
    for match in re.finditer(r"\S+\s*", text):
        yield match.group(0)


def _tool_use_id(request: ModelRequestSpec) -> str:
    digest = hashlib.sha256(request.serialize()).hexdigest()[:24]
    return f"toolu_offline_{digest}"
