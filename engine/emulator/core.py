"""The emulator: one Messages API (and chat-completions) endpoint in process."""

from __future__ import annotations

import hashlib
import itertools
from collections import deque
from typing import Any

from engine.emulator import tool_search
from engine.emulator.accounting import Usage
from engine.emulator.cache import (
    DEFAULT_MIN_CACHE_TOKENS,
    LOOKBACK_POSITIONS,
    MIN_CACHE_TOKENS_BY_MODEL,
    PrefixCache,
    Prompt,
    analyse,
)
from engine.emulator.openai_route import OpenAIPendingResponse, openai_begin
from engine.emulator.policy import Clock, Fault, Policy, SystemClock, default_policy, plain_text
from engine.emulator.sse import PendingResponse, shape_reply
from engine.emulator.validation import ApiError, invalid_request, sign_thinking
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
        return analyse(payload, count_only=True).total_tokens

    def prompt_tokens(self, payload: dict[str, Any]) -> int:
        """The prompt tokens of a Messages request (as `measure` counts it), for tests and benchmarks."""
        return analyse(payload, known_model=False).total_tokens

    def begin(self, payload: dict[str, Any], *, fault: Fault | None = None) -> PendingResponse:
        """Accept a request: look up the cache and plan writes; nothing is readable until `start()`.

        `fault` applies to this request instead of the next queued one.
        """
        started_at = self.clock.now()
        fault = self._next_fault(fault)
        prompt = analyse(payload)
        if prompt.total_tokens > self.context_window:
            raise invalid_request(f"prompt is too long: {prompt.total_tokens} tokens > {self.context_window} maximum")
        usage, writes = self.cache.account(prompt, started_at, self.min_cache_tokens_for(prompt.model))
        content, stop = self.reply(payload, prompt)
        shaped = shape_reply(
            content, max_tokens=payload["max_tokens"], stop_sequences=payload.get("stop_sequences") or [], stop=stop
        )
        usage.output_tokens = shaped.output_tokens
        return PendingResponse(
            self.cache,
            f"msg_emu_{next(self._ids):08d}",
            prompt.model,
            shaped.content,
            usage,
            writes,
            fault,
            stop_reason=shaped.stop_reason,
            stop_sequence=shaped.stop_sequence,
            partial_json=shaped.partial_json,
        )

    def measure(self, payload: dict[str, Any]) -> Usage:
        """Account a request whose answer comes from elsewhere (the offline model).

        The same cache lookup, writes and errors as `begin`, with the response
        counted as streaming at once; `output_tokens` is left to the caller. The
        offline model is not an API model, so an unknown model name is counted with
        the default model's rules instead of refused.
        """
        started_at = self.clock.now()
        prompt = analyse(payload, known_model=False)
        if prompt.total_tokens > self.context_window:
            raise invalid_request(f"prompt is too long: {prompt.total_tokens} tokens > {self.context_window} maximum")
        usage, writes = self.cache.account(prompt, started_at, self.min_cache_tokens_for(prompt.model))
        self.cache.commit(writes)
        return usage

    def create(self, payload: dict[str, Any]) -> dict[str, Any]:
        response = self.begin(payload)
        response.start()
        return response.message()

    def queued_faults(self) -> list[Fault]:
        return list(self._faults)

    def _next_fault(self, given: Fault | None = None) -> Fault | None:
        fault = given or (self._faults.popleft() if self._faults else None)
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

    def reply(self, payload: dict[str, Any], prompt: Prompt | None = None) -> tuple[list[dict[str, Any]], str | None]:
        """The policy's answer and its stop reason (None: from the content).

        A trailing assistant message is a prefill the answer continues. With thinking
        on, the answer opens with a signed thinking block; a `server_tool_use` of a
        tool search tool in the request is answered by the search.
        """
        messages = payload["messages"]
        prefill = ""
        if messages and messages[-1].get("role") == "assistant":
            prefill = plain_text(messages[-1].get("content"))
            payload = {**payload, "messages": messages[:-1]}
        answer = self.policy(payload)
        stop = None
        if isinstance(answer, dict):
            stop = answer.get("stop_reason")
            answer = answer["content"]
        content = list(answer)
        for n, block in enumerate(content):
            if block.get("type") in ("tool_use", "server_tool_use") and not block.get("id"):
                prefix = "toolu_emu_" if block["type"] == "tool_use" else "srvtoolu_emu_"
                content[n] = {**block, "id": f"{prefix}{hashlib.sha256(canonical_json([payload, n])).hexdigest()[:20]}"}
        if prefill and content and content[0].get("type") == "text":
            text = content[0]["text"]
            content[0] = {"type": "text", "text": text[len(prefill) :] if text.startswith(prefill) else text}
        if prompt is None:
            return content, stop
        searched: list[dict[str, Any]] = []
        for block in content:
            searched.append(block)
            if block.get("type") == "server_tool_use" and block.get("name") in prompt.searchers:
                kind = prompt.searchers[block["name"]]
                query = (block.get("input") or {}).get("query" if "bm25" in kind else "pattern")
                searched.append(tool_search.run(kind, block["id"], query, prompt.deferred))
        if prompt.info.get("thinking_budget") is not None and not prefill:
            thought = f"The request ends with: {plain_text(messages[-1].get('content'))[:200]}".strip()
            searched.insert(0, {"type": "thinking", "thinking": thought, "signature": sign_thinking(thought)})
        return searched, stop

    # -- OpenAI-compatible chat completions (automatic prefix caching)
    def openai_begin(self, payload: dict[str, Any], *, fault: Fault | None = None) -> OpenAIPendingResponse:
        return openai_begin(self, payload, fault)

    def next_id(self) -> int:
        return next(self._ids)

    def next_fault_openai(self, given: Fault | None = None) -> Fault | None:
        try:
            return self._next_fault(given)
        except ApiError as exc:
            code = "rate_limit_exceeded" if exc.status == 429 else "overloaded"
            raise ApiError(exc.status, exc.error_type, exc.message, headers=exc.headers, code=code) from None
