"""One agent turn: build the request, stream from the provider, run tool calls, repeat.

Pure Python: the caller hands in the history, a provider, a toolbox and an `emit`
callback, and gets back the messages the turn produced. Nothing here writes to a
database; the service persists the outcome at the turn boundary (CH-5).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from engine.actions import (
    ActionLimits,
    ApprovalNeeded,
    Decision,
    StepExecutor,
    storable,
    tool_uses_of,
    turn_observations,
)
from engine.breakpoints import place_breakpoints
from engine.context.calibration import Measured
from engine.context.transcript import (
    RequestCount,
    messages_count,
    overhead_count,
    provider_image_rule,
    request_count,
)
from engine.providers.protocol import (
    AnswerStarted,
    AttemptBroken,
    MessageDone,
    PromptTooLong,
    Provider,
    ProviderEvent,
    Retrying,
    TextDelta,
    ToolUseBlock,
    Usage,
    stream_abandoned,
)
from engine.request import (
    ModelRequestSpec,
    called_tools,
    referenced_tools,
    text_block,
    tools_by_recency,
    without_tool_references,
)
from engine.tokens import estimate_json_tokens, estimate_text_tokens, tool_prompt_tokens
from engine.toolbox import ToolBox

Emit = Callable[[str, dict[str, Any]], None]


TOOL_ACTIVATION_MISS = "tool_activation"


CANCEL_POLL_SECONDS = 0.5
# A reply cut by max_tokens mid-text is continued (assistant prefill) at most this many times per turn.
MAX_CONTINUATIONS = 3


def polled_at_most_every(seconds: float, check: Callable[[], bool]) -> Callable[[], bool]:
    """`check` (a database read) asked at most once per `seconds`; in between the answer is "no".

    The loop asks `is_cancelled` between every step and stream chunk; a cancel a moment late
    costs nothing, a query per chunk does.
    """
    last_check = 0.0

    def throttled() -> bool:
        nonlocal last_check
        now = time.monotonic()
        if now - last_check < seconds:
            return False
        last_check = now
        return check()

    return throttled


class TurnHandedOff(Exception):
    """The worker is stopping (OP-4): the turn stopped between two steps, every call answered, to
    be resumed by another worker from `paused`, as after an approval."""

    def __init__(self, paused: PausedTurn) -> None:
        super().__init__(f"the turn was handed off after step {paused.step}")
        self.paused = paused


class TurnCancelled(Exception):
    """Someone asked the run to stop (OP-3).

    `messages` is the turn up to its last complete step, every tool call answered (a call
    killed by the cancel answers with its partial output, marked cancelled), so the caller
    can keep it in the transcript and the provider still accepts it. A step whose reply was
    still streaming is left out.
    """

    def __init__(self, messages: list[dict[str, Any]] | None = None) -> None:
        super().__init__("the turn was cancelled")
        self.messages = messages or []


@dataclass(frozen=True)
class StepRecord:
    step: int
    usage: Usage
    stop_reason: str
    duration_ms: int
    breakpoints: list[str]
    request_id: str = ""
    # Deferred tools this request loaded for the first time (a tool_reference new since the last request).
    tools_loaded: list[str] = field(default_factory=list)
    # Why the provider could not read the previous prefix, when the runtime knows: "tool_activation"
    # when it loaded tools on a provider without deferred loading (their schemas changed the prefix).
    cache_miss: str = ""
    # The runtime's count of the whole request by part (system, tools, the provider's tool prompt,
    # messages, tool results, images; CH-12), beside what the provider measured in `usage`.
    estimate: RequestCount = RequestCount()


@dataclass(frozen=True)
class PausedTurn:
    """A turn stopped for approval or handed off, as stored on the run (`Run.pending_turn`), never in
    the transcript (CH-5)."""

    messages: list[dict[str, Any]]
    step: int
    previous_end: int | None
    counts: dict[str, int]


# (history, this turn's messages so far, the error) -> a shorter history, or None to fail the run.
ReactiveCompaction = Callable[[list[dict[str, Any]], list[dict[str, Any]], PromptTooLong], list[dict[str, Any]] | None]


@dataclass(frozen=True)
class RequestSize:
    """What the loop knows about the size of the request it is about to send (LM-2)."""

    # Our count of the whole request: system, every tool sent (and the provider's tool prompt), the
    # history and this turn so far.
    count: RequestCount
    # The history's share of it: the only part a compaction pass can shrink.
    history: int
    # This turn's earlier requests, our count beside the provider's measure, oldest first (none before
    # the first): the most recent calibration there is.
    measured: tuple[Measured, ...] = ()

    @property
    def estimated(self) -> int:
        return self.count.total


@dataclass(frozen=True)
class Room:
    """What the request is sent with instead: a shorter history, a smaller `max_tokens`, shortened results, or more."""

    history: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    # Tool results of this turn sent as stubs from now on (tool_use_id -> the tool_result sent instead),
    # for a context that is only its turn (a subagent's: `engine.room`). The turn's record keeps them whole.
    results: dict[str, Any] | None = None


# (history, this turn's messages so far, the request's size) -> what to send instead, or None to send it as is.
# Called before every request, so a turn that grows past the window (tool results, tools loaded on the way)
# makes room before the provider refuses it, not after.
MakeRoom = Callable[[list[dict[str, Any]], list[dict[str, Any]], RequestSize], Room | None]


def reactive_compaction_hook(
    history: list[dict[str, Any]], turn: list[dict[str, Any]], error: PromptTooLong
) -> list[dict[str, Any]] | None:
    """The default when no compaction is wired in: fail the run with the measured size.

    The run service passes its own hook (the ladder without a model call, CH-2); a hook
    returns a shorter replacement for `history` to retry the request once, or None.
    """
    return None


@dataclass
class TurnOutcome:
    messages: list[dict[str, Any]] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    stop_reason: str = ""


def run_turn(
    *,
    provider: Provider,
    model: str,
    system: list[dict[str, Any]],
    history: list[dict[str, Any]],
    toolbox: ToolBox,
    emit: Emit,
    max_steps: int = 25,
    is_cancelled: Callable[[], bool] = lambda: False,
    limits: ActionLimits | None = None,
    max_parallel_tools: int = 8,
    resume: PausedTurn | None = None,
    decisions: dict[str, Decision] | None = None,
    on_prompt_too_long: ReactiveCompaction = reactive_compaction_hook,
    max_tokens: int = 4096,
    tool_choice: dict[str, Any] | None = None,
    make_room: MakeRoom | None = None,
    hand_off: Callable[[], bool] = lambda: False,
    record_step: Callable[[StepRecord], None] = lambda step: None,
) -> TurnOutcome:
    """Run one turn; raises `ApprovalNeeded` (with the partial turn) when a call waits for a person,
    and `TurnHandedOff` between two steps once `hand_off()` says the worker is stopping.

    `record_step` gets each request as soon as its answer begins (our estimate) and again when its
    reply is in, the later record of a step replacing the earlier: a request is paid for whether or
    not the turn ends well, so its record must not wait for the turn's end.

    `tool_choice` (Anthropic's shape) applies to the turn's first request only: forcing a
    call on every step would never let the model answer after it.
    """
    outcome = TurnOutcome()
    history = [_as_blocks(message) for message in history]
    # The first request of a turn marks the end of the previous turn (TD-13).
    previous_end = len(history) - 2 if len(history) >= 2 else None
    executor = StepExecutor(toolbox, emit, limits=limits, max_parallel=max_parallel_tools, decisions=decisions)
    first_step = 1
    so_far = [*history, *(resume.messages if resume is not None else [])]
    referenced = referenced_tools(so_far)
    if referenced:
        # In the order they were loaded, so the tools array reads as it did; by recency within a budget (LM-2).
        toolbox.restore_loaded(referenced, tools_by_recency(so_far), called=called_tools(so_far))
    offered = {schema["name"] for schema in toolbox.schemas()} if referenced else set()
    unoffered = {name for name in referenced if name not in offered}
    if unoffered:
        # The conversation's mode (or the catalog) changed since these tools were loaded, or the
        # window's tool budget unloaded them (LM-2): a reference to a tool the request does not
        # carry is refused by the provider. The history is rewritten from the first reference taken
        # out (a mode change rewrote the tool block anyway). Silent: an unload was announced when a
        # load made it, and the stored history keeps its references, so every later turn repeats it.
        history = without_tool_references(history, unoffered)
        if resume is not None:
            resume = replace(resume, messages=without_tool_references(resume.messages, unoffered))
    loaded = set(referenced) - unoffered
    # Results of this turn sent shortened (Room.results); `outcome.messages` keeps them whole.
    shortened: dict[str, Any] = {}
    # Images are estimated as this provider bills them (CH-12).
    images = provider_image_rule(provider.name)
    # Whether this call of the loop did anything yet: a turn is handed off only after it did, so it
    # makes progress each time (the approved calls a resumed turn ran count).
    worked = False
    try:
        if resume is not None:
            outcome.messages = list(resume.messages)
            previous_end, first_step = resume.previous_end, resume.step + 1
            executor.counts = dict(resume.counts)
            toolbox.restore_observations(turn_observations(outcome.messages))
            waiting = tool_uses_of(outcome.messages[-1])
            if waiting:  # paused for approval; a turn handed off has run its calls already
                _run_tools(executor, outcome, resume.step, waiting, previous_end)
                worked = True
        continuing, continuations = False, 0
        live = _LiveText(emit)
        for step in range(first_step, max_steps + 1):
            if is_cancelled():
                raise TurnCancelled()
            if (worked or step > first_step) and not continuing and hand_off():
                paused = PausedTurn(list(outcome.messages), step - 1, previous_end, dict(executor.counts))
                raise TurnHandedOff(paused)
            choice = tool_choice if step == first_step else None
            tool_prompt = tool_prompt_tokens(provider.name, model, forced=_forced(choice))
            # Only tool calls unload (a fresh turn's first request follows the check above).
            ran = step > first_step or resume is not None
            unloaded = _unloaded(toolbox, [*history, *outcome.messages]) if ran else set()
            if unloaded:
                # A load during the turn unloaded older tools to keep the tool budget (LM-2): their
                # references go, from the history as sent and from this turn's record alike.
                loaded.difference_update(unloaded)
                if unloaded & set(referenced_tools(history)):
                    history, previous_end = without_tool_references(history, unloaded), None
                outcome.messages[:] = without_tool_references(outcome.messages, unloaded)
                stubs = without_tool_references([{"role": "user", "content": list(shortened.values())}], unloaded)
                shortened = dict(zip(shortened, stubs[0]["content"], strict=True))
                emit("tools_unloaded", {"step": step, "tools": sorted(unloaded)})
            sent = _sent(outcome.messages, shortened)
            room = (
                _room_made(make_room, system, history, sent, outcome.steps, toolbox, tool_prompt, images)
                if make_room is not None
                else None
            )
            if room is not None and room.history is not None:
                # A new history is a new prefix: the previous turn's end is no longer a breakpoint worth keeping.
                history, previous_end = [_as_blocks(message) for message in room.history], None
            if room is not None and room.results:
                shortened.update(room.results)
            asked = room.max_tokens if room is not None and room.max_tokens else max_tokens
            request, done, duration_ms = _request(provider, model, system, history, _sent(outcome.messages, shortened),
                                                  toolbox, emit, step, previous_end, is_cancelled, on_prompt_too_long,
                                                  max_tokens=asked, tool_choice=choice, record_step=record_step,
                                                  tool_prompt=tool_prompt, live=live)  # fmt: skip
            history = request.messages[: len(request.messages) - len(outcome.messages)]
            previous_end = len(request.messages) - 1
            newly = _newly_loaded(request, loaded)
            loaded.update(newly)
            miss = TOOL_ACTIVATION_MISS if newly and not getattr(provider, "defers_tool_loading", False) else ""
            record = StepRecord(step, done.usage, done.stop_reason, duration_ms, list(request.breakpoints),
                                done.request_id, tools_loaded=newly, cache_miss=miss,
                                estimate=request_count(request.system, request.tools, request.messages,
                                                       tool_prompt=tool_prompt, image_rule=images))  # fmt: skip
            outcome.steps.append(record)
            record_step(record)
            if miss:
                # The API cannot keep the schemas out of the prefix; say so instead of hiding it in the ratio.
                emit("cache_miss", {"step": step, "cause": miss, "tools": newly, "provider": provider.name})
            emit(
                "usage",
                {
                    "step": step,
                    **_usage_dict(done.usage),
                    "usage_source": done.usage.source,
                    "cache_reported": done.usage.cache_reported,
                },
            )
            content = done.content
            if continuing:
                # The continuation of a reply cut by max_tokens: one assistant message, as if never cut.
                content = _joined(outcome.messages.pop()["content"], content)
                continuing = False
            if done.stop_reason == "max_tokens":
                text_only = [b for b in content if b.get("type") != "tool_use"]
                if len(text_only) < len(content):
                    # Cut mid-call: the call's input is incomplete, so it is never executed.
                    dropped = [b.get("name", "") for b in content if b.get("type") == "tool_use"]
                    emit("model_stopped", {"step": step, "stop_reason": "max_tokens", "dropped_calls": dropped,
                                           "detail": "the reply reached max_tokens inside a tool call; "
                                                     "the incomplete call was not run"})  # fmt: skip
                    live.flush()
                    if text_only:
                        outcome.messages.append({"role": "assistant", "content": text_only})
                    outcome.stop_reason = "max_tokens"
                    return outcome
                if continuations < MAX_CONTINUATIONS and getattr(provider, "supports_prefill", False) and content:
                    # Cut mid-text: ask for the rest with the text so far as the assistant prefill.
                    continuations += 1
                    emit("model_stopped", {"step": step, "stop_reason": "max_tokens", "continued": True,
                                           "detail": "the reply reached max_tokens; asking for the rest"})  # fmt: skip
                    outcome.messages.append({"role": "assistant", "content": _as_prefill(content)})
                    live.drop()
                    continuing = True
                    continue
                emit("model_stopped", {"step": step, "stop_reason": "max_tokens", "continued": False,
                                       "detail": "the reply reached max_tokens and was not continued"})  # fmt: skip
            if done.stop_reason == "pause_turn":
                # A long server-side tool turn paused: sending the reply back lets the model go on, in one message.
                outcome.messages.append({"role": "assistant", "content": _as_prefill(content)})
                live.drop()
                continuing = True
                continue
            live.flush()
            if done.stop_reason == "refusal":
                emit("model_stopped", {"step": step, "stop_reason": "refusal",
                                       "detail": "the model declined to continue this turn"})  # fmt: skip
                if content:
                    outcome.messages.append({"role": "assistant", "content": content})
                outcome.stop_reason = "refusal"
                return outcome
            outcome.messages.append({"role": "assistant", "content": content})

            tool_uses = tool_uses_of(outcome.messages[-1])
            if not tool_uses:
                outcome.stop_reason = done.stop_reason
                return outcome
            _run_tools(executor, outcome, step, tool_uses, previous_end)
        outcome.stop_reason = "max_steps"
        return outcome
    except TurnCancelled:
        # Wherever it was noticed, the turn is kept up to its last complete step.
        raise TurnCancelled(_answered(outcome.messages)) from None


def _room_made(
    make_room: MakeRoom,
    system: list[dict[str, Any]],
    history: list[dict[str, Any]],
    turn: list[dict[str, Any]],
    steps: list[StepRecord],
    toolbox: ToolBox,
    tool_prompt: int,
    image_rule: str,
) -> Room | None:
    """Ask `make_room` about the request the loop is about to send (`turn` as sent), with its estimated size."""
    history_count = messages_count(history, image_rule=image_rule)
    count = overhead_count(system, toolbox.schemas(), tool_prompt=tool_prompt) + history_count
    size = RequestSize(
        count=count + messages_count(turn, image_rule=image_rule),
        history=history_count.total,
        measured=tuple((step.estimate, step.usage.prompt_tokens) for step in steps),
    )
    return make_room(history, turn, size)


def _unloaded(toolbox: ToolBox, messages: list[dict[str, Any]]) -> set[str]:
    """The tools `messages` load (`tool_reference`) that the toolbox no longer offers."""
    referenced = referenced_tools(messages)
    if not referenced:
        return set()
    offered = {schema["name"] for schema in toolbox.schemas()}
    return {name for name in referenced if name not in offered}


def _sent(turn: list[dict[str, Any]], shortened: dict[str, Any]) -> list[dict[str, Any]]:
    """The turn's messages as the request sends them: each result named in `shortened` as its stub."""
    if not shortened:
        return turn

    def stubbed(block: dict[str, Any]) -> bool:
        return block.get("type") == "tool_result" and block.get("tool_use_id") in shortened

    sent = []
    for message in turn:
        content = message.get("content")
        if isinstance(content, list) and any(stubbed(block) for block in content):
            message = {**message, "content": [shortened[b["tool_use_id"]] if stubbed(b) else b for b in content]}
        sent.append(message)
    return sent


class _LiveText:
    """The turn's text deltas as shown live, kept equal to the text stored: trailing whitespace is
    held back until text follows it, because a reply continued as a prefill (cut by max_tokens, or
    paused) is stored without it (`_as_prefill`), and the continuation brings its own. Shown at once,
    "in your " then " last" read "your  last" live while the message read "your last" (UX-1)."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.held, self.step = "", 0

    def text(self, step: int, text: str) -> None:
        text = self.held + text
        shown = text.rstrip()
        self.held, self.step = text[len(shown) :], step
        if shown:
            self.emit("text_delta", {"step": step, "text": storable(shown)})

    def flush(self) -> None:
        """The reply is stored as it came: what was held back is part of it."""
        if self.held:
            self.emit("text_delta", {"step": self.step, "text": storable(self.held)})
        self.held = ""

    def drop(self) -> None:
        """The reply goes on as a prefill, stored without its trailing whitespace."""
        self.held = ""


def _forced(tool_choice: dict[str, Any] | None) -> bool:
    """A tool_choice that makes the model call a tool: the provider's tool prompt differs then."""
    return (tool_choice or {}).get("type") in ("any", "tool")


def _request(
    provider: Provider,
    model: str,
    system: list[dict[str, Any]],
    history: list[dict[str, Any]],
    turn: list[dict[str, Any]],
    toolbox: ToolBox,
    emit: Emit,
    step: int,
    previous_end: int | None,
    is_cancelled: Callable[[], bool],
    compact: ReactiveCompaction,
    *,
    max_tokens: int = 4096,
    tool_choice: dict[str, Any] | None = None,
    record_step: Callable[[StepRecord], None] = lambda step: None,
    tool_prompt: int = 0,
    live: _LiveText,
) -> tuple[ModelRequestSpec, MessageDone, int]:
    """One model request with the TD-13 breakpoints; a too-long prompt goes to the compaction hook once.
    Its text is shown through `live`, which the caller flushes or drops once it knows how the reply is stored."""

    def shown(event: ProviderEvent) -> None:
        if isinstance(event, TextDelta):
            live.text(step, event.text)
        elif isinstance(event, ToolUseBlock):
            live.flush()
            emit("tool_call", {"step": step, "id": event.id, "name": event.name, "input": storable(event.input)})
        elif isinstance(event, Retrying):
            emit(
                "model_retry",
                {"step": step, "attempt": event.attempt, "wait_seconds": round(event.wait_seconds, 1),
                 "reason": storable(event.reason)},
            )  # fmt: skip

    for attempt in (1, 2):
        request = ModelRequestSpec(
            model=model,
            system=system,
            tools=_deferred_last(toolbox.schemas()),
            messages=[*history, *turn],
            max_tokens=max_tokens,
            tool_choice=tool_choice,
        )
        place_breakpoints(request, previous_end=previous_end, resident_count=toolbox.resident_count())
        try:
            done, duration_ms = stream_answer(
                provider, request, step=step, is_cancelled=is_cancelled, record_step=record_step,
                tool_prompt=tool_prompt, on_event=shown,
            )  # fmt: skip
        except PromptTooLong as exc:
            replacement = compact(history, turn, exc) if attempt == 1 else None
            if replacement is None:
                raise
            history = [_as_blocks(message) for message in replacement]
            previous_end = None
            continue
        return request, replace(done, content=storable(done.content)), duration_ms
    raise AssertionError("unreachable")


def stream_answer(
    provider: Provider,
    request: ModelRequestSpec,
    *,
    step: int,
    is_cancelled: Callable[[], bool],
    record_step: Callable[[StepRecord], None],
    tool_prompt: int = 0,
    on_event: Callable[[ProviderEvent], None] = lambda event: None,
) -> tuple[MessageDone, int]:
    """Stream one request to its final message, and its duration in ms; every model call goes
    through here (turns, subagents, summaries), so each stops within OP-3's 2 s and is paid for once.

    Once the answer begins, the provider took the request and is owed for it: it is recorded then,
    as our estimate ("incomplete"), and again when the final usage comes, or, cut by a cancel or an
    error, with the output that arrived ("cancelled", "failed"); whole when a stop is seen, with the
    provider's own usage. A worker lost mid-answer leaves the first record. An attempt broken off
    and asked again (`AttemptBroken`) is closed as "retried", and the next attempt is a record of
    its own: the step's later records are that one's.
    """
    started = time.monotonic()
    done: MessageDone | None = None
    answered: list[ProviderEvent] = []  # of the current attempt
    prompt: Usage | None = None  # the provider's own figures for the prompt, once it sent them
    images = provider_image_rule(provider.name)
    try:
        for event in _until_cancelled(provider.stream(request), is_cancelled):
            if isinstance(event, Retrying):
                on_event(event)  # nothing was answered by it: no record
                continue
            if isinstance(event, AttemptBroken):
                elapsed = int((time.monotonic() - started) * 1000)
                record_step(
                    _estimated_record(step, request, answered, elapsed, RETRIED, tool_prompt, prompt, image_rule=images)
                )
                answered, prompt, started = [], None, time.monotonic()
                continue
            if isinstance(event, AnswerStarted):
                prompt = event.usage
            if not answered or isinstance(event, AnswerStarted):
                record_step(
                    _estimated_record(step, request, [], 0, "incomplete", tool_prompt, prompt, image_rule=images)
                )
            answered.append(event)
            if isinstance(event, MessageDone):
                done = event
            elif not isinstance(event, AnswerStarted):
                on_event(event)
            if is_cancelled():
                raise TurnCancelled()
    except TurnCancelled:
        elapsed = int((time.monotonic() - started) * 1000)
        if done is not None:
            # Answered in full just before the stop was seen (a cancel, a run failed under a stopped
            # worker): the provider's own usage.
            count = request_count(
                request.system, request.tools, request.messages, tool_prompt=tool_prompt, image_rule=images
            )
            record_step(StepRecord(step, done.usage, done.stop_reason, elapsed, list(request.breakpoints),
                                   done.request_id, estimate=count))  # fmt: skip
        elif answered:
            record_step(
                _estimated_record(step, request, answered, elapsed, "cancelled", tool_prompt, prompt, image_rule=images)
            )
        raise
    except PromptTooLong:
        raise  # refused before any answer: nothing was taken
    except Exception:
        if answered and done is None:
            # Broken off after it began (retries spent on a stream that kept failing): still taken.
            elapsed = int((time.monotonic() - started) * 1000)
            record_step(
                _estimated_record(step, request, answered, elapsed, "failed", tool_prompt, prompt, image_rule=images)
            )
        raise
    if done is None:
        raise RuntimeError(f"provider {provider.name} ended the stream without a final message")
    return done, int((time.monotonic() - started) * 1000)


def _estimated_record(
    step: int,
    request: ModelRequestSpec,
    answered: list[ProviderEvent],
    duration_ms: int,
    stop_reason: str,
    tool_prompt: int,
    prompt: Usage | None = None,
    *,
    image_rule: str,
) -> StepRecord:
    """A request with no final usage (yet): the prompt as the provider reported it when its answer
    began (`AnswerStarted`, source "partial"), else the whole prompt as we count it (what was cached
    of it unknown, source "estimate"); and the output that arrived, as our estimate."""
    count = request_count(
        request.system, request.tools, request.messages, tool_prompt=tool_prompt, image_rule=image_rule
    )
    output = sum(
        estimate_text_tokens(event.text) if isinstance(event, TextDelta) else estimate_json_tokens(event.input)
        for event in answered
        if isinstance(event, TextDelta | ToolUseBlock)
    )
    if prompt is not None:
        usage = replace(prompt, output_tokens=output, source="partial")
    else:
        usage = Usage(input_tokens=count.total, output_tokens=output, source="estimate", cache_reported=False)
    return StepRecord(step, usage, stop_reason, duration_ms, list(request.breakpoints), estimate=count)


# The stop reason of an attempt broken off and asked again: its record is closed, the retry gets its own.
RETRIED = "retried"

# How often a request that has sent nothing yet looks at the cancel flag (`is_cancelled` may poll less often).
WAITING_POLL_SECONDS = 0.1


@dataclass(frozen=True)
class _StreamFailed:
    error: BaseException


_STREAM_END = object()


def _until_cancelled(events: Iterator[ProviderEvent], is_cancelled: Callable[[], bool]) -> Iterator[ProviderEvent]:
    """The provider's events, read on a thread of their own, so that a cancel ends the turn within
    OP-3's 2 s even while the request sends nothing: a long prompt being read (seconds on a local
    model, more on a long context), a retry's back-off. A read given up on ends at its next event
    or error and closes its stream then."""
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    abandoned = threading.Event()

    def read() -> None:
        stream_abandoned.set(abandoned)
        try:
            for event in events:
                if abandoned.is_set():
                    break
                inbox.put(event)
            else:
                inbox.put(_STREAM_END)
        except BaseException as exc:  # handed over as they are: PromptTooLong, provider errors, bugs
            inbox.put(_StreamFailed(exc))
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()

    threading.Thread(target=read, name="cc-model-stream", daemon=True).start()
    try:
        while True:
            try:
                item = inbox.get(timeout=WAITING_POLL_SECONDS)
            except queue.Empty:
                if is_cancelled():
                    raise TurnCancelled() from None
                continue
            if item is _STREAM_END:
                return
            if isinstance(item, _StreamFailed):
                raise item.error
            yield item
    finally:
        abandoned.set()


def _run_tools(
    executor: StepExecutor, outcome: TurnOutcome, step: int, tool_uses: list[dict[str, Any]], previous_end: int | None
) -> None:
    # Tool calls are numbered across the turn (1, 2, 3...) for `{{stepN.field}}` references
    # (SP-9); counted from the messages, so a turn resumed after an approval numbers alike.
    earlier_calls = sum(len(tool_uses_of(message)) for message in outcome.messages[:-1])
    try:
        outcome.messages.append(executor.run(step, tool_uses, first_tool_step=earlier_calls + 1))
    except ApprovalNeeded as pause:
        pause.messages, pause.previous_end = list(outcome.messages), previous_end
        raise
    if executor.cancelled:
        # A tool stopped by the cancel (OP-3): the run ends here, with its partial output as the result.
        raise TurnCancelled()


def _answered(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages without a last assistant message whose tool calls have no results yet."""
    if messages and messages[-1]["role"] == "assistant" and tool_uses_of(messages[-1]):
        return list(messages[:-1])
    return list(messages)


def _as_prefill(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # The API refuses a final assistant message ending in whitespace; the continuation brings it back.
    blocks = [dict(b) for b in content]
    if blocks and blocks[-1].get("type") == "text":
        blocks[-1]["text"] = blocks[-1]["text"].rstrip()
        if not blocks[-1]["text"]:
            blocks.pop()
    return blocks


def _joined(prefill: list[dict[str, Any]], rest: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if prefill and rest and prefill[-1].get("type") == "text" and rest[0].get("type") == "text":
        return [*prefill[:-1], {**prefill[-1], "text": prefill[-1]["text"] + rest[0]["text"]}, *rest[1:]]
    return [*prefill, *rest]


def _deferred_last(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Deferred schemas after every resident one: the cached tool block stays one contiguous run.
    return [*(t for t in tools if not t.get("defer_loading")), *(t for t in tools if t.get("defer_loading"))]


def _newly_loaded(request: ModelRequestSpec, loaded: set[str]) -> list[str]:
    deferred = {tool["name"] for tool in request.tools if tool.get("defer_loading")}
    return [name for name in referenced_tools(request.messages) if name in deferred and name not in loaded]


def _as_blocks(message: dict[str, Any]) -> dict[str, Any]:
    # One representation for a message, so a marker on it never changes its bytes (TD-11).
    if isinstance(message.get("content"), str):
        return {**message, "content": [text_block(message["content"])]}
    return message


def _usage_dict(usage: Usage) -> dict[str, int]:
    return {
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_creation_5m_input_tokens": usage.cache_creation_5m_input_tokens,
        "cache_creation_1h_input_tokens": usage.cache_creation_1h_input_tokens,
    }
