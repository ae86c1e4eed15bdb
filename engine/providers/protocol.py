"""The provider protocol: what the runtime needs from any model API.

A provider streams events for one request and ends with a `MessageDone` that
carries the complete assistant content and the usage as the provider reported it.
Failures are typed so the runtime can tell transient ones (retry) from the prompt
being too long (compaction) and from its own mistakes (invalid request).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from engine.request import ModelRequestSpec


@dataclass(frozen=True)
class Usage:
    """Anthropic's disjoint fields: the four add up to everything processed."""

    input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    output_tokens: int = 0
    # The split of cache_creation_input_tokens by TTL, as the API reports it; the
    # two add up to cache_creation_input_tokens when the provider reports them.
    cache_creation_5m_input_tokens: int = 0
    cache_creation_1h_input_tokens: int = 0
    # Where the figures come from: "reported" by the provider, counted with the model server's own
    # "tokenizer" (it sent none), or our "estimate" (neither); the last two are shown as estimated.
    # "partial": an answer cut before its final usage, the prompt as reported when it began
    # (`AnswerStarted`), the output our count of what arrived.
    source: str = "reported"
    # False when the provider said nothing of its cache (no `cached_tokens`): the cache fields are
    # then unknown, not zero, and the request stays out of every cache ratio.
    cache_reported: bool = True

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolUseBlock:
    id: str
    name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class MessageDone:
    content: list[dict[str, Any]]
    stop_reason: str
    usage: Usage = field(default_factory=Usage)
    # The provider's id for this request (Anthropic: the `request-id` header, else the message id).
    request_id: str = ""


@dataclass(frozen=True)
class AnswerStarted:
    """The provider's figures for the prompt, sent as its answer begins (Anthropic's `message_start`):
    what the request is owed for should the answer be cut before its final usage comes."""

    usage: Usage


@dataclass(frozen=True)
class AttemptBroken:
    """The retrying provider's word that the answer under way broke off (a cut stream, an overload
    mid-answer) and is being asked for again: the broken attempt was taken, and is owed for, on its own."""

    reason: str


@dataclass(frozen=True)
class Retrying:
    """The retrying provider's word that it asks again after `wait_seconds` (a 429, a 529, a cut
    stream): said as it happens, so a wait of a minute is not silence, and the run's log keeps
    the attempts the final answer does not show (QA: a 429 then a 200 left one quiet row)."""

    attempt: int  # the attempt that failed, 1-based
    wait_seconds: float
    reason: str


ProviderEvent = AnswerStarted | AttemptBroken | Retrying | TextDelta | ToolUseBlock | MessageDone

# Set on the thread that reads a stream for the runtime (`engine.loop`): once the event is set, nobody
# reads the stream any more (the turn was cancelled while the request waited), so a retry after a
# back-off must not send the request again.
stream_abandoned: ContextVar[threading.Event | None] = ContextVar("stream_abandoned", default=None)

# A tool call whose arguments were not a JSON object carries them, as the model wrote them, under
# this key alone; the runtime answers it with a tool error the model sees instead of running it.
MALFORMED_ARGUMENTS = "_malformed_arguments"


class ProviderError(Exception):
    """Base of every error a provider raises."""

    transient = False


class RateLimited(ProviderError):
    transient = True

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Overloaded(ProviderError):
    transient = True

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PromptTooLong(ProviderError):
    def __init__(self, message: str, *, tokens: int | None = None, maximum: int | None = None) -> None:
        super().__init__(message)
        self.tokens = tokens
        self.maximum = maximum


class InvalidRequest(ProviderError):
    pass


class StreamInterrupted(ProviderError):
    """The response stream ended before the message did (connection cut)."""

    transient = True

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@runtime_checkable
class Provider(Protocol):
    """`defers_tool_loading` (optional, False when absent): the API keeps `defer_loading` tools out of
    the cached prefix until a `tool_reference` loads them; without it an activation is a cache miss."""

    name: str

    def stream(self, request: ModelRequestSpec) -> Iterator[ProviderEvent]:
        """Yield text deltas and tool-use blocks as they arrive, then one MessageDone."""
        ...


_TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")


def error_for_status(status: int, message: str, *, retry_after: float | None = None) -> ProviderError:
    """The typed error for an HTTP error status in the Anthropic API's conventions."""
    if status == 429:
        return RateLimited(message, retry_after=retry_after)
    if status in (500, 502, 503, 504, 529):
        return Overloaded(message, retry_after=retry_after)
    too_long = _TOO_LONG.search(message)
    if too_long:
        return PromptTooLong(message, tokens=int(too_long.group(1)), maximum=int(too_long.group(2)))
    return InvalidRequest(f"HTTP {status}: {message}")
