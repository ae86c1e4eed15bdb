"""Retries around any provider: transient failures only, bounded, never repeating text.

429 and 529/overloaded (and a cut connection) are retried with exponential
backoff and full jitter, waiting at least what `retry-after` asks; a wait longer
than `max_retry_after` is not worth holding a worker for, so it is raised.
A stream cut after some text reached the caller resumes without sending that text
again: providers that accept an assistant prefill (Anthropic) continue from the
text already streamed; others are replayed and the already-streamed prefix is
skipped, and a replay that disagrees with it is an error, not a silent rewrite.
An attempt broken after its answer began is announced (`AttemptBroken`) before the
next is sent: it was paid for, and its caller records it as a request of its own.
"""

from __future__ import annotations

import contextlib
import email.utils
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from engine.providers.protocol import (
    AttemptBroken,
    MessageDone,
    Provider,
    ProviderError,
    ProviderEvent,
    Retrying,
    StreamInterrupted,
    TextDelta,
    ToolUseBlock,
    stream_abandoned,
)
from engine.request import ModelRequestSpec

OnRetry = Callable[[int, float, ProviderError], None]


class RetryingProvider:
    def __init__(
        self,
        inner: Provider,
        *,
        max_attempts: int = 5,
        base_delay: float = 1.0,
        max_delay: float = 32.0,
        max_retry_after: float = 120.0,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
        on_retry: OnRetry | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.inner = inner
        self.name = inner.name
        self.defers_tool_loading = bool(getattr(inner, "defers_tool_loading", False))
        self.supports_prefill = bool(getattr(inner, "supports_prefill", False))
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.max_retry_after = max_retry_after
        self._sleep = sleep
        self._jitter = jitter
        self._on_retry = on_retry

    def delay(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before attempt `attempt + 1`, or None to give up."""
        ceiling = min(self.max_delay, self.base_delay * (2**attempt))
        backoff = ceiling * self._jitter()
        if retry_after is None:
            return float(backoff)
        if retry_after > self.max_retry_after:
            return None
        return float(max(retry_after, backoff))

    def stream(self, request: ModelRequestSpec) -> Iterator[ProviderEvent]:
        seen = _Seen()
        attempt = 0
        began = time.monotonic()
        waited = 0.0
        while True:
            seen.began = False
            try:
                if seen.text and not seen.tools and getattr(self.inner, "supports_prefill", False):
                    yield from self._continue(request, seen)
                else:
                    yield from self._replay(request, seen)
                return
            except ProviderError as exc:
                if not exc.transient:
                    raise
                # The last error alone ("Overloaded") read as if nothing had been tried: the run's
                # error says why the client stopped asking.
                attempts = f"{attempt + 1} attempt{'s' if attempt else ''}"
                if attempt + 1 >= self.max_attempts:
                    # The clock misses waits a test's `sleep` only pretends to take.
                    elapsed = max(time.monotonic() - began, waited)
                    _explain(exc, f"gave up after {attempts} over {elapsed:.0f} s, the most this client makes")
                    raise
                retry_after = getattr(exc, "retry_after", None)
                wait = self.delay(attempt, retry_after)
                if wait is None:
                    _explain(
                        exc,
                        f"the server asked to wait {retry_after:.0f} s before trying again, longer than the "
                        f"{self.max_retry_after:.0f} s this client waits at most; gave up after {attempts}",
                    )
                    raise
                if seen.began:
                    yield AttemptBroken(str(exc))
                yield Retrying(attempt + 1, wait, str(exc))
                if self._on_retry is not None:
                    self._on_retry(attempt + 1, wait, exc)
                self._sleep(wait)
                waited += wait
                abandoned = stream_abandoned.get()
                if abandoned is not None and abandoned.is_set():
                    return  # nobody reads this stream any more: another request would be paid for nothing
                attempt += 1

    def _replay(self, request: ModelRequestSpec, seen: _Seen) -> Iterator[ProviderEvent]:
        """Send the request again and skip what the caller already has."""
        streamed, tools = seen.text, list(seen.tools)
        position = 0  # characters of this attempt's text
        tool_index = 0
        for event in self.inner.stream(request):
            seen.began = True
            if isinstance(event, TextDelta):
                start, position = position, position + len(event.text)
                overlap = streamed[start:position]
                if event.text[: len(overlap)] != overlap:
                    raise ProviderError(
                        "the model server broke off its answer, and asked again it answered differently: the "
                        "retried response differs from the text already streamed (a sampled answer does not "
                        "repeat). Retry the run."
                    )
                fresh = event.text[len(overlap) :]
                if fresh:
                    seen.text += fresh
                    yield TextDelta(fresh)
            elif isinstance(event, ToolUseBlock):
                if tool_index < len(tools):
                    if (tools[tool_index].name, tools[tool_index].input) != (event.name, event.input):
                        raise ProviderError("the retried response differs from the tool calls already streamed")
                else:
                    seen.tools.append(event)
                    yield event
                tool_index += 1
            else:
                yield event

    def _continue(self, request: ModelRequestSpec, seen: _Seen) -> Iterator[ProviderEvent]:
        """Ask for the rest of the answer after the text already streamed (assistant prefill)."""
        # The API refuses a prefill ending in whitespace; the caller already has that
        # whitespace, so it is dropped from the start of the continuation instead.
        prefill = seen.text.rstrip()
        pending_space = seen.text[len(prefill) :]
        prefilled = {"role": "assistant", "content": [{"type": "text", "text": prefill}]}
        for event in self.inner.stream(replace(request, messages=[*request.messages, prefilled])):
            seen.began = True
            if isinstance(event, TextDelta):
                text = event.text
                while pending_space and text and text[0] == pending_space[0]:
                    text, pending_space = text[1:], pending_space[1:]
                if text:
                    pending_space = ""
                    seen.text += text
                    yield TextDelta(text)
            elif isinstance(event, ToolUseBlock):
                seen.tools.append(event)
                yield event
            elif isinstance(event, MessageDone):
                yield replace(event, content=_merge_prefill(prefill, event.content))
            else:
                yield event


@dataclass
class _Seen:
    """What the caller has received so far, across attempts."""

    text: str = ""
    tools: list[ToolUseBlock] = field(default_factory=list)
    began: bool = False  # the current attempt's answer began: it is paid for however it ends


def _explain(exc: ProviderError, reason: str) -> None:
    # Said on the error itself, so its type (and `retry_after`) stay what callers test for.
    exc.args = (f"{exc} ({reason})", *exc.args[1:])


def _merge_prefill(prefill: str, content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if content and content[0].get("type") == "text":
        return [{**content[0], "text": prefill + content[0]["text"]}, *content[1:]]
    return [{"type": "text", "text": prefill}, *content]


def parse_retry_after(headers: Any) -> float | None:
    """`retry-after-ms`, `retry-after` in seconds, or an HTTP date; None if absent or unreadable."""
    if headers is None:
        return None
    value = headers.get("retry-after-ms")
    if value is not None:
        with contextlib.suppress(ValueError):
            return float(value) / 1000
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    with contextlib.suppress(TypeError, ValueError):
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    return None


def transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP libraries' own errors, raised as-is when a stream breaks mid-body."""
    errors: list[type[BaseException]] = [OSError]
    for module in ("httpx", "httpx2"):
        with contextlib.suppress(ImportError):
            errors.append(__import__(module).HTTPError)
    return tuple(errors)


__all__ = ["RetryingProvider", "StreamInterrupted", "parse_retry_after", "transport_errors"]
