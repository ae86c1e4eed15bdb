"""The emulator: one Messages API (and chat-completions) endpoint in process."""

from __future__ import annotations

import hashlib
import itertools
from collections import deque
from typing import Any

from engine.emulator.accounting import Usage, output_tokens
from engine.emulator.cache import (
    DEFAULT_MIN_CACHE_TOKENS,
    LOOKBACK_POSITIONS,
    MIN_CACHE_TOKENS_BY_MODEL,
    PrefixCache,
    analyse,
)
from engine.emulator.openai_route import OpenAIPendingResponse, openai_begin
from engine.emulator.policy import Clock, Fault, Policy, SystemClock, default_policy, plain_text
from engine.emulator.sse import PendingResponse
from engine.emulator.validation import ApiError, invalid_request
from engine.request import canonical_json

DEFAULT_CONTEXT_WINDOW = 200_000


def seconds_header(value: float | None) -> str:
    return str(int(value)) if value is not None and float(value).is_integer() else str(value)


class Emulator:
    """The Anthropic Messages API prompt cache, usage and errors, in process."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        policy: Policy | None = None,
        context_window: int = DEFAULT_CONTEXT_WINDOW,
        min_cache_tokens: int | None = None,
        lookback: int = LOOKBACK_POSITIONS,
    ) -> None:
        self.clock: Clock = clock or SystemClock()
        self.policy: Policy = policy or default_policy
        self.context_window = context_window
        self.min_cache_tokens = min_cache_tokens
        self.lookback = lookback
        self.cache = PrefixCache(lookback)
        self.openai_cache = PrefixCache(lookback)
        self._faults: deque[Fault] = deque()
        self._ids = itertools.count(1)

    # -- test hooks
    def inject(self, fault: Fault) -> None:
        self._faults.append(fault)

    def entry_count(self) -> int:
        return self.cache.live_count(self.clock.now())

    def min_cache_tokens_for(self, model: str) -> int:
        if self.min_cache_tokens is not None:
            return self.min_cache_tokens
        for prefix, minimum in MIN_CACHE_TOKENS_BY_MODEL:
            if model.startswith(prefix):
                return minimum
        return DEFAULT_MIN_CACHE_TOKENS

    # -- Messages API
    def count_tokens(self, payload: dict[str, Any]) -> int:
        return analyse({"max_tokens": 1, **payload}).total_tokens

    def begin(self, payload: dict[str, Any]) -> PendingResponse:
        """Accept a request: look up the cache and plan writes; nothing is readable until `start()`."""
        started_at = self.clock.now()
        fault = self._next_fault()
        prompt = analyse(payload)
        if prompt.total_tokens > self.context_window:
            raise invalid_request(f"prompt is too long: {prompt.total_tokens} tokens > {self.context_window} maximum")
        usage, writes = self.cache.account(prompt, started_at, self.min_cache_tokens_for(prompt.model))
        content = self.reply(payload)
        usage.output_tokens = output_tokens(content)
        return PendingResponse(
            self.cache, f"msg_emu_{next(self._ids):08d}", prompt.model, content, usage, writes, fault
        )

    def measure(self, payload: dict[str, Any]) -> Usage:
        """Account a request whose answer comes from elsewhere (the offline model).

        The same cache lookup, writes and errors as `begin`, with the response
        counted as streaming at once; `output_tokens` is left to the caller.
        """
        started_at = self.clock.now()
        prompt = analyse(payload)
        if prompt.total_tokens > self.context_window:
            raise invalid_request(f"prompt is too long: {prompt.total_tokens} tokens > {self.context_window} maximum")
        usage, writes = self.cache.account(prompt, started_at, self.min_cache_tokens_for(prompt.model))
        self.cache.commit(writes)
        return usage

    def create(self, payload: dict[str, Any]) -> dict[str, Any]:
        response = self.begin(payload)
        response.start()
        return response.message()

    def _next_fault(self) -> Fault | None:
        fault = self._faults.popleft() if self._faults else None
        if fault is None:
            return None
        if fault.kind == "rate_limit":
            headers = {"retry-after": seconds_header(fault.retry_after)} if fault.retry_after is not None else {}
            raise ApiError(
                429, "rate_limit_error", "Number of request tokens has exceeded your rate limit.", headers=headers
            )
        if fault.kind == "overloaded":
            headers = {"retry-after": seconds_header(fault.retry_after)} if fault.retry_after is not None else {}
            raise ApiError(529, "overloaded_error", "Overloaded", headers=headers)
        return fault

    def reply(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        """The policy's answer; a trailing assistant message is a prefill the answer continues."""
        messages = payload["messages"]
        prefill = ""
        if messages[-1].get("role") == "assistant":
            prefill = plain_text(messages[-1].get("content"))
            payload = {**payload, "messages": messages[:-1]}
        content = self.policy(payload)
        for n, block in enumerate(content):
            if block.get("type") == "tool_use" and not block.get("id"):
                content[n] = {
                    **block,
                    "id": f"toolu_emu_{hashlib.sha256(canonical_json([payload, n])).hexdigest()[:20]}",
                }
        if prefill and content and content[0].get("type") == "text":
            text = content[0]["text"]
            content[0] = {"type": "text", "text": text[len(prefill) :] if text.startswith(prefill) else text}
        return content

    # -- OpenAI-compatible chat completions (automatic prefix caching)
    def openai_begin(self, payload: dict[str, Any]) -> OpenAIPendingResponse:
        return openai_begin(self, payload)

    def next_id(self) -> int:
        return next(self._ids)

    def next_fault_openai(self) -> Fault | None:
        try:
            return self._next_fault()
        except ApiError as exc:
            code = "rate_limit_exceeded" if exc.status == 429 else "overloaded"
            raise ApiError(exc.status, exc.error_type, exc.message, headers=exc.headers, code=code) from None
