"""A faithful stand-in for the Anthropic Messages API (and an OpenAI-compatible route).

There is no network in tests and benchmarks, so every cache figure the product
shows comes through here. It is built to the documented rules, never kinder:

- the prompt is the blocks in the order tools -> system -> messages; each block
  position carries a cumulative prefix hash (seeded by the model); `cache_control`
  is not part of the hash;
- at most four breakpoints; TTL "5m" (default) or "1h", counted from the start of
  the request that wrote or read the entry, refreshed by each read; a longer TTL
  must not follow a shorter one;
- a read looks back from each breakpoint over at most `lookback` (20) block
  positions; a run of consecutive tool_use blocks is one position, and so is a run
  of tool_result blocks; a write is one entry per breakpoint beyond the deepest
  hit, and nothing is cached below the model's minimum prefix length;
- an entry becomes readable only once the response that writes it starts
  streaming, so concurrent identical requests all miss and all write;
- usage as the API reports it: cache reads, cache writes (split 5m / 1h), and
  `input_tokens` after the last breakpoint; the three add up to the prompt;
- `defer_loading` tools are outside the prefix; a `tool_reference` block inside a
  tool result expands to that tool's definition where it stands;
- errors with the API's status codes and wording; injected faults (429 with
  retry-after, 529, a stream cut mid-response) for retry tests.

Pure Python, no Django: tests, benchmarks and the offline provider use it in
process; `EmulatorServer` serves it over HTTP for the official SDKs.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

from engine.request import canonical_json
from engine.tokens import estimate_json_tokens, estimate_text_tokens

TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
MAX_BREAKPOINTS = 4
LOOKBACK_POSITIONS = 20
DEFAULT_CONTEXT_WINDOW = 200_000
# Documented minimum cacheable prefix per model family; first match wins.
MIN_CACHE_TOKENS_BY_MODEL: tuple[tuple[str, int], ...] = (
    ("claude-opus-4-5", 4096),
    ("claude-haiku-4-5", 4096),
    ("claude-3-5-haiku", 2048),
    ("claude-3-haiku", 2048),
    ("claude-haiku", 2048),
)
DEFAULT_MIN_CACHE_TOKENS = 1024
OPENAI_MIN_CACHE_TOKENS = 1024
OPENAI_CACHE_STEP = 128
OPENAI_CACHE_TTL = 300.0

_RUN_KINDS = ("tool_use", "tool_result")


# --- errors -----------------------------------------------------------------------


class ApiError(Exception):
    """An error response, shaped like the real API's."""

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = headers or {}
        self.code = code
        self.param = param

    def anthropic_body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.error_type, "message": self.message}}

    def openai_body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}


def invalid_request(message: str) -> ApiError:
    return ApiError(400, "invalid_request_error", message)


class StreamCut(Exception):
    """In process: the stream was cut mid-response (the HTTP server drops the connection)."""


# --- clock, policy, faults --------------------------------------------------------


class Clock(Protocol):
    def now(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()


class TestClock:
    """Time that moves only when a test says so."""

    __test__ = False  # not a pytest test class

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


Policy = Callable[[dict[str, Any]], list[dict[str, Any]]]


def default_policy(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Answer with text that shows what the emulator understood."""
    last = payload["messages"][-1]
    text = _plain_text(last.get("content"))
    words = text.split()
    return [
        {
            "type": "text",
            "text": f"This is the Control Center API emulator. I read {len(words)} words in your last message.",
        }
    ]


class ScriptedPolicy:
    """Replies in order, one per new conversation state.

    The same conversation (same messages) gets the same reply again, so a request
    retried after a fault or a stream cut sees what the first attempt would have.
    After the script runs out, `fallback` answers.
    """

    def __init__(self, replies: list[str | list[dict[str, Any]]], *, fallback: Policy = default_policy) -> None:
        self._replies = deque(replies)
        self._seen: dict[bytes, list[dict[str, Any]]] = {}
        self._fallback = fallback
        self._lock = threading.Lock()

    def __call__(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        key = hashlib.sha256(canonical_json(_strip_cache_control(payload["messages"]))).digest()
        with self._lock:
            if key not in self._seen:
                if self._replies:
                    reply = self._replies.popleft()
                    self._seen[key] = [{"type": "text", "text": reply}] if isinstance(reply, str) else reply
                else:
                    self._seen[key] = self._fallback(payload)
            return copy.deepcopy(self._seen[key])

    @property
    def remaining(self) -> int:
        return len(self._replies)


@dataclass(frozen=True)
class Fault:
    """A failure to inject into the next request.

    `rate_limit` (429) and `overloaded` (529) refuse the request; `stream_cut` drops
    the connection after `after_chars` characters of text; `stream_overloaded` sends
    an `overloaded_error` event there instead, as the API does mid-stream.
    """

    kind: str
    retry_after: float | None = None
    after_chars: int = 0


# --- prompt analysis ------------------------------------------------------------


@dataclass
class _Block:
    key: bytes
    tokens: int
    kind: str
    cache_control: dict[str, Any] | None
    where: str


@dataclass
class _Prompt:
    model: str
    blocks: list[_Block]
    hashes: list[str]
    cumulative: list[int]
    position_of: list[int]
    position_ends: list[int]
    breakpoints: list[tuple[int, str]]

    @property
    def total_tokens(self) -> int:
        return self.cumulative[-1] if self.cumulative else 0


@dataclass
class _Entry:
    expires_at: float
    ttl: str
    tokens: int
    readable: bool = False


@dataclass
class Usage:
    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    cache_creation_5m: int
    cache_creation_1h: int
    output_tokens: int = 0

    def as_anthropic(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.cache_creation_5m,
                "ephemeral_1h_input_tokens": self.cache_creation_1h,
            },
            "output_tokens": self.output_tokens,
        }

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens


def _strip_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_cache_control(v) for v in value]
    return value


def _plain_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if block.get("type") == "text":
            parts.append(block.get("text", ""))
        elif block.get("type") == "tool_result":
            parts.append(_plain_text(block.get("content")))
    return " ".join(parts)


def _content_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) and "type" in b for b in content):
        raise invalid_request(f"{where}: content must be a string or a list of typed blocks")
    return content


def _check_cache_control(control: Any, where: str) -> None:
    if not isinstance(control, dict) or control.get("type") != "ephemeral":
        raise invalid_request(f"{where}.cache_control.type: Input should be 'ephemeral'")
    ttl = control.get("ttl", "5m")
    if ttl not in TTL_SECONDS:
        raise invalid_request(f"{where}.cache_control.ttl: Input should be '5m' or '1h'")


def analyse(payload: dict[str, Any]) -> _Prompt:
    """Validate a Messages request and lay it out as hashed block positions."""
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise invalid_request("model: Field required")
    max_tokens = payload.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise invalid_request("max_tokens: Field required (a positive integer)")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid_request("messages: at least one message is required")

    blocks: list[_Block] = []
    tools = payload.get("tools") or []
    deferred: dict[str, dict[str, Any]] = {}
    names: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise invalid_request(f"{where}.name: Field required")
        if tool["name"] in names:
            raise invalid_request(f"tools: Tool names must be unique. Duplicate: {tool['name']!r}")
        names.add(tool["name"])
        bare = _strip_cache_control(tool)
        if tool.get("defer_loading"):
            if "cache_control" in tool:
                raise invalid_request(f"{where}: a tool with defer_loading cannot carry cache_control")
            deferred[tool["name"]] = {k: v for k, v in bare.items() if k != "defer_loading"}
            continue
        if "cache_control" in tool:
            _check_cache_control(tool["cache_control"], where)
        blocks.append(
            _Block(canonical_json(["tool", bare]), estimate_json_tokens(bare), "tool", tool.get("cache_control"), where)
        )

    system = payload.get("system") or []
    for i, block in enumerate(_content_blocks(system, "system") if system else []):
        where = f"system.{i}"
        if block.get("type") != "text":
            raise invalid_request(f"{where}.type: system blocks must be text")
        if "cache_control" in block:
            _check_cache_control(block["cache_control"], where)
        bare = _strip_cache_control(block)
        blocks.append(
            _Block(
                canonical_json(["system", bare]),
                estimate_json_tokens(bare),
                "system",
                block.get("cache_control"),
                where,
            )
        )

    _check_tool_pairing(messages)
    for m, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise invalid_request(f"messages.{m}.role: Input should be 'user' or 'assistant'")
        content = _content_blocks(message.get("content"), f"messages.{m}")
        if not content:
            raise invalid_request(f"messages.{m}: all messages must have non-empty content")
        for b, block in enumerate(content):
            where = f"messages.{m}.content.{b}"
            if "cache_control" in block:
                _check_cache_control(block["cache_control"], where)
            bare = _strip_cache_control(block)
            tokens = estimate_json_tokens(bare)
            if block["type"] == "tool_result":
                bare, tokens = _expand_tool_references(bare, deferred, names, where)
            blocks.append(
                _Block(
                    canonical_json(["m", role, b == 0, bare]), tokens, block["type"], block.get("cache_control"), where
                )
            )
    if m == len(messages) - 1 and role == "assistant":
        last = content[-1]
        if last.get("type") == "text" and last.get("text", "") != last.get("text", "").rstrip():
            raise invalid_request("messages: final assistant content cannot end with trailing whitespace")

    breakpoints = [(i, (b.cache_control or {}).get("ttl", "5m")) for i, b in enumerate(blocks) if b.cache_control]
    if len(breakpoints) > MAX_BREAKPOINTS:
        raise invalid_request(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(breakpoints)}."
        )
    seen_short = False
    for _index, ttl in breakpoints:
        if ttl == "5m":
            seen_short = True
        elif seen_short:
            raise invalid_request(
                "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block; "
                "longer TTLs must precede shorter ones (order: tools, system, messages)"
            )

    digest = hashlib.sha256(b"model:" + model.encode()).digest()
    hashes, cumulative, position_of, position_ends = [], [], [], []
    total = 0
    for i, block in enumerate(blocks):
        digest = hashlib.sha256(digest + block.key).digest()
        hashes.append(digest.hex())
        total += block.tokens
        cumulative.append(total)
        same_run = i > 0 and block.kind in _RUN_KINDS and blocks[i - 1].kind == block.kind
        if same_run:
            position_ends[-1] = i
        else:
            position_ends.append(i)
        position_of.append(len(position_ends) - 1)
    return _Prompt(model, blocks, hashes, cumulative, position_of, position_ends, breakpoints)


def _expand_tool_references(
    block: dict[str, Any], deferred: dict[str, dict[str, Any]], names: set[str], where: str
) -> tuple[dict[str, Any], int]:
    content = block.get("content")
    if not isinstance(content, list):
        return block, estimate_json_tokens(block)
    expanded = []
    for item in content:
        if isinstance(item, dict) and item.get("type") == "tool_reference":
            name = item.get("tool_name")
            if name not in names:
                raise invalid_request(f"{where}: tool_reference to {name!r}, which is not in the request's tools")
            # A reference to a resident tool adds nothing new; a deferred one loads its definition here.
            expanded.append({"type": "tool_definition", "tool": deferred[name]} if name in deferred else item)
        else:
            expanded.append(item)
    result = {**block, "content": expanded}
    return result, estimate_json_tokens(result)


def _check_tool_pairing(messages: list[dict[str, Any]]) -> None:
    for m, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), list):
            continue
        if message.get("role") == "user":
            results = [
                (b, block.get("tool_use_id"))
                for b, block in enumerate(message["content"])
                if isinstance(block, dict) and block.get("type") == "tool_result"
            ]
            previous = messages[m - 1] if m > 0 else {}
            offered = {
                block.get("id")
                for block in (previous.get("content") if isinstance(previous.get("content"), list) else [])
                if previous.get("role") == "assistant" and isinstance(block, dict) and block.get("type") == "tool_use"
            }
            for b, tool_use_id in results:
                if tool_use_id not in offered:
                    raise invalid_request(
                        f"messages.{m}.content.{b}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{tool_use_id}. Each `tool_result` block must have a corresponding `tool_use` block "
                        "in the previous message."
                    )
        elif message.get("role") == "assistant":
            ids = [b.get("id") for b in message["content"] if isinstance(b, dict) and b.get("type") == "tool_use"]
            if not ids:
                continue
            following = messages[m + 1] if m + 1 < len(messages) else {}
            answered = {
                b.get("tool_use_id")
                for b in (following.get("content") if isinstance(following.get("content"), list) else [])
                if following.get("role") == "user" and isinstance(b, dict) and b.get("type") == "tool_result"
            }
            missing = [i for i in ids if i not in answered]
            if missing:
                raise invalid_request(
                    f"messages.{m}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                    f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block "
                    "in the next message."
                )


# --- the emulator ------------------------------------------------------------------


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
        self._entries: dict[str, _Entry] = {}
        self._openai_entries: dict[str, _Entry] = {}
        self._faults: deque[Fault] = deque()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    # -- test hooks
    def inject(self, fault: Fault) -> None:
        self._faults.append(fault)

    def entry_count(self) -> int:
        now = self.clock.now()
        with self._lock:
            return sum(1 for e in self._entries.values() if e.expires_at > now)

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
        with self._lock:
            usage, writes = self._account(prompt, started_at)
        content = self._reply(payload)
        usage.output_tokens = _output_tokens(content)
        return PendingResponse(self, f"msg_emu_{next(self._ids):08d}", prompt.model, content, usage, writes, fault)

    def measure(self, payload: dict[str, Any]) -> Usage:
        """Account a request whose answer comes from elsewhere (the offline model).

        The same cache lookup, writes and errors as `begin`, with the response
        counted as streaming at once; `output_tokens` is left to the caller.
        """
        started_at = self.clock.now()
        prompt = analyse(payload)
        if prompt.total_tokens > self.context_window:
            raise invalid_request(f"prompt is too long: {prompt.total_tokens} tokens > {self.context_window} maximum")
        with self._lock:
            usage, writes = self._account(prompt, started_at)
        self._commit(writes, self._entries)
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
            headers = {"retry-after": _seconds_header(fault.retry_after)} if fault.retry_after is not None else {}
            raise ApiError(
                429, "rate_limit_error", "Number of request tokens has exceeded your rate limit.", headers=headers
            )
        if fault.kind == "overloaded":
            headers = {"retry-after": _seconds_header(fault.retry_after)} if fault.retry_after is not None else {}
            raise ApiError(529, "overloaded_error", "Overloaded", headers=headers)
        return fault

    def _account(self, prompt: _Prompt, now: float) -> tuple[Usage, list[tuple[str, _Entry]]]:
        hit_block = -1
        for block_index, _ttl in prompt.breakpoints:
            found = self._lookup(prompt, block_index, now)
            hit_block = max(hit_block, found)
        hit_tokens = prompt.cumulative[hit_block] if hit_block >= 0 else 0
        # A read refreshes what it used: every breakpoint entry inside the read prefix.
        for block_index, ttl in prompt.breakpoints:
            if block_index <= hit_block:
                self._refresh(prompt.hashes[block_index], now, ttl)
        if hit_block >= 0:
            self._refresh(prompt.hashes[hit_block], now, "5m")

        minimum = self.min_cache_tokens_for(prompt.model)
        writes: list[tuple[str, _Entry]] = []
        covered = hit_tokens
        split = {"5m": 0, "1h": 0}
        for block_index, ttl in prompt.breakpoints:
            tokens = prompt.cumulative[block_index]
            if block_index <= hit_block or tokens < minimum:
                continue
            split[ttl] += tokens - covered
            covered = tokens
            writes.append((prompt.hashes[block_index], _Entry(now + TTL_SECONDS[ttl], ttl, tokens)))
        usage = Usage(
            input_tokens=prompt.total_tokens - covered,
            cache_creation_input_tokens=covered - hit_tokens,
            cache_read_input_tokens=hit_tokens,
            cache_creation_5m=split["5m"],
            cache_creation_1h=split["1h"],
        )
        return usage, writes

    def _lookup(self, prompt: _Prompt, block_index: int, now: float) -> int:
        """The deepest block this breakpoint can read from, or -1."""
        candidates = [block_index]
        position = prompt.position_of[block_index]
        for back in range(1, self.lookback):
            if position - back < 0:
                break
            candidates.append(prompt.position_ends[position - back])
        for candidate in candidates:
            entry = self._entries.get(prompt.hashes[candidate])
            if entry is not None and entry.readable and entry.expires_at > now:
                return candidate
        return -1

    def _refresh(self, key: str, now: float, ttl: str) -> None:
        entry = self._entries.get(key)
        if entry is not None and entry.readable and entry.expires_at > now:
            entry.expires_at = max(entry.expires_at, now + max(TTL_SECONDS[entry.ttl], TTL_SECONDS[ttl]))

    def _commit(self, writes: list[tuple[str, _Entry]], store: dict[str, _Entry]) -> None:
        with self._lock:
            for key, entry in writes:
                current = store.get(key)
                if current is not None and current.readable and current.expires_at >= entry.expires_at:
                    continue
                store[key] = _Entry(entry.expires_at, entry.ttl, entry.tokens, readable=True)

    def _reply(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        """The policy's answer; a trailing assistant message is a prefill the answer continues."""
        messages = payload["messages"]
        prefill = ""
        if messages[-1].get("role") == "assistant":
            prefill = _plain_text(messages[-1].get("content"))
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
        started_at = self.clock.now()
        fault = self._next_fault_openai()
        model = payload.get("model")
        messages = payload.get("messages")
        if not isinstance(model, str) or not isinstance(messages, list) or not messages:
            raise ApiError(400, "invalid_request_error", "model and messages are required", param="messages")
        parts = [["tool", t] for t in payload.get("tools") or []] + [["m", m] for m in messages]
        digest = hashlib.sha256(b"model:" + model.encode()).digest()
        hashes, cumulative, total = [], [], 0
        for part in parts:
            digest = hashlib.sha256(digest + canonical_json(part)).digest()
            hashes.append(digest.hex())
            total += estimate_json_tokens(part[1])
            cumulative.append(total)
        if total > self.context_window:
            raise ApiError(
                400,
                "invalid_request_error",
                f"This model's maximum context length is {self.context_window} tokens. "
                f"However, your messages resulted in {total} tokens. Please reduce the length of the messages.",
                param="messages",
                code="context_length_exceeded",
            )
        cached = 0
        with self._lock:
            for i in range(len(hashes) - 1, -1, -1):
                entry = self._openai_entries.get(hashes[i])
                if entry is not None and entry.readable and entry.expires_at > started_at:
                    entry.expires_at = started_at + OPENAI_CACHE_TTL
                    cached = (cumulative[i] // OPENAI_CACHE_STEP) * OPENAI_CACHE_STEP
                    break
        if cached < OPENAI_MIN_CACHE_TOKENS:
            cached = 0
        writes = [
            (h, _Entry(started_at + OPENAI_CACHE_TTL, "5m", c))
            for h, c in zip(hashes, cumulative, strict=True)
            if c >= OPENAI_MIN_CACHE_TOKENS
        ]
        content = self._reply(openai_to_anthropic(payload))
        return OpenAIPendingResponse(
            self,
            f"chatcmpl-emu{next(self._ids):08d}",
            model,
            content,
            total,
            cached,
            _output_tokens(content),
            writes,
            fault,
        )

    def _next_fault_openai(self) -> Fault | None:
        try:
            return self._next_fault()
        except ApiError as exc:
            code = "rate_limit_exceeded" if exc.status == 429 else "overloaded"
            raise ApiError(exc.status, exc.error_type, exc.message, headers=exc.headers, code=code) from None


def _seconds_header(value: float | None) -> str:
    return str(int(value)) if value is not None and float(value).is_integer() else str(value)


def _output_tokens(content: list[dict[str, Any]]) -> int:
    total = 0
    for block in content:
        if block.get("type") == "text":
            total += estimate_text_tokens(block["text"])
        else:
            total += estimate_json_tokens(block)
    return max(total, 1)


def _stop_reason(content: list[dict[str, Any]]) -> str:
    return "tool_use" if any(b.get("type") == "tool_use" for b in content) else "end_turn"


def _word_chunks(text: str) -> list[str]:
    return re.findall(r"\S+\s*|\s+", text) or [text]


@dataclass
class PendingResponse:
    emulator: Emulator
    id: str
    model: str
    content: list[dict[str, Any]]
    usage: Usage
    writes: list[tuple[str, _Entry]]
    fault: Fault | None = None
    started: bool = field(default=False)

    def start(self) -> None:
        """The response starts streaming: what this request writes becomes readable."""
        if not self.started:
            self.started = True
            self.emulator._commit(self.writes, self.emulator._entries)

    def message(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.content,
            "stop_reason": _stop_reason(self.content),
            "stop_sequence": None,
            "usage": self.usage.as_anthropic(),
        }

    def sse_events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The Messages streaming events.

        A `stream_cut` fault raises StreamCut where the connection drops; a
        `stream_overloaded` fault sends the API's mid-stream `error` event there.
        """
        try:
            yield from self._events()
        except _StreamError as exc:
            yield exc.event

    def _events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        self.start()
        start_usage = {**self.usage.as_anthropic(), "output_tokens": 1}
        yield (
            "message_start",
            {
                "type": "message_start",
                "message": {**self.message(), "content": [], "stop_reason": None, "usage": start_usage},
            },
        )
        faulted = self.fault is not None and self.fault.kind in ("stream_cut", "stream_overloaded")
        budget = self.fault.after_chars if faulted and self.fault is not None else None
        streamed = 0
        for index, block in enumerate(self.content):
            if block["type"] == "text":
                yield (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
                )
                for chunk in _word_chunks(block["text"]):
                    if budget is not None and streamed + len(chunk) > budget:
                        self._interrupt(streamed)
                    streamed += len(chunk)
                    yield (
                        "content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": chunk}},
                    )
            else:
                if budget is not None:
                    self._interrupt(streamed)
                yield (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}},
                )
                arguments = json.dumps(block.get("input", {}), sort_keys=True)
                for i in range(0, len(arguments), 16):
                    yield (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": arguments[i : i + 16]},
                        },
                    )
            yield "content_block_stop", {"type": "content_block_stop", "index": index}
        if budget is not None:
            self._interrupt(streamed)
        yield (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": _stop_reason(self.content), "stop_sequence": None},
                "usage": {"output_tokens": self.usage.output_tokens},
            },
        )
        yield "message_stop", {"type": "message_stop"}

    def _interrupt(self, streamed: int) -> NoReturn:
        if self.fault is not None and self.fault.kind == "stream_overloaded":
            raise _StreamError(
                ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
            )
        raise StreamCut(f"stream cut after {streamed} characters")


class _StreamError(Exception):
    def __init__(self, event: tuple[str, dict[str, Any]]) -> None:
        super().__init__(event[1]["error"]["message"])
        self.event = event


@dataclass
class OpenAIPendingResponse:
    emulator: Emulator
    id: str
    model: str
    content: list[dict[str, Any]]
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    writes: list[tuple[str, _Entry]]
    fault: Fault | None = None
    started: bool = False

    def start(self) -> None:
        if not self.started:
            self.started = True
            self.emulator._commit(self.writes, self.emulator._openai_entries)

    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def _tool_calls(self) -> list[dict[str, Any]]:
        return [
            {
                "id": b["id"],
                "type": "function",
                "function": {"name": b["name"], "arguments": json.dumps(b.get("input", {}), sort_keys=True)},
            }
            for b in self.content
            if b.get("type") == "tool_use"
        ]

    def _finish_reason(self) -> str:
        return "tool_calls" if self._tool_calls() else "stop"

    def completion(self) -> dict[str, Any]:
        self.start()
        text = "".join(b["text"] for b in self.content if b.get("type") == "text")
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if self._tool_calls():
            message["tool_calls"] = self._tool_calls()
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": 0,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish_reason()}],
            "usage": self.usage(),
        }

    def chunks(self, include_usage: bool) -> Iterator[dict[str, Any]]:
        self.start()
        base = {"id": self.id, "object": "chat.completion.chunk", "created": 0, "model": self.model}
        budget = self.fault.after_chars if self.fault and self.fault.kind == "stream_cut" else None
        streamed = 0
        yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
        for block in self.content:
            if block.get("type") != "text":
                continue
            for chunk in _word_chunks(block["text"]):
                if budget is not None and streamed + len(chunk) > budget:
                    raise StreamCut(f"stream cut after {streamed} characters")
                streamed += len(chunk)
                yield {**base, "choices": [{"index": 0, "delta": {"content": chunk}, "finish_reason": None}]}
        if budget is not None:
            raise StreamCut(f"stream cut after {streamed} characters")
        for index, call in enumerate(self._tool_calls()):
            yield {
                **base,
                "choices": [{"index": 0, "delta": {"tool_calls": [{"index": index, **call}]}, "finish_reason": None}],
            }
        yield {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": self._finish_reason()}]}
        if include_usage:
            yield {**base, "choices": [], "usage": self.usage()}


def openai_to_anthropic(payload: dict[str, Any]) -> dict[str, Any]:
    """Chat-completions messages as a Messages payload, so one policy answers both routes."""
    system: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []

    def append(role: str, blocks: list[dict[str, Any]]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for message in payload.get("messages", []):
        role = message.get("role")
        content = message.get("content")
        text = (
            content
            if isinstance(content, str)
            else " ".join(p.get("text", "") for p in content or [] if isinstance(p, dict))
        )
        if role in ("system", "developer"):
            system.append({"type": "text", "text": text})
        elif role == "user":
            append("user", [{"type": "text", "text": text}])
        elif role == "tool":
            append("user", [{"type": "tool_result", "tool_use_id": message.get("tool_call_id"), "content": text}])
        elif role == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
            for call in message.get("tool_calls") or []:
                arguments = call.get("function", {}).get("arguments") or "{}"
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.get("id"),
                        "name": call["function"]["name"],
                        "input": json.loads(arguments),
                    }
                )
            append("assistant", blocks or [{"type": "text", "text": ""}])
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            "input_schema": t["function"].get("parameters", {}),
        }
        for t in payload.get("tools") or []
        if t.get("type") == "function"
    ]
    return {"model": payload.get("model"), "max_tokens": 1024, "system": system, "messages": messages, "tools": tools}
