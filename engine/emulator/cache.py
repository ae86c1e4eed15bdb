"""The prompt cache: block layout, prefix hashes, breakpoints, TTLs, lookback.

The prompt is the blocks in the order tools -> system -> messages; each block
position carries a cumulative prefix hash (seeded by the model); `cache_control`
is not part of the hash.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Any

from engine.emulator.accounting import Usage
from engine.emulator.policy import strip_cache_control
from engine.emulator.validation import (
    TTL_SECONDS,
    check_cache_control,
    check_tool_pairing,
    content_blocks,
    invalid_request,
)
from engine.request import canonical_json
from engine.tokens import estimate_json_tokens

MAX_BREAKPOINTS = 4
LOOKBACK_POSITIONS = 20
# Documented minimum cacheable prefix per model family; first match wins.
MIN_CACHE_TOKENS_BY_MODEL: tuple[tuple[str, int], ...] = (
    ("claude-opus-4-5", 4096),
    ("claude-haiku-4-5", 4096),
    ("claude-3-5-haiku", 2048),
    ("claude-3-haiku", 2048),
    ("claude-haiku", 2048),
)
DEFAULT_MIN_CACHE_TOKENS = 1024

RUN_KINDS = ("tool_use", "tool_result")


@dataclass
class Block:
    key: bytes
    tokens: int
    kind: str
    cache_control: dict[str, Any] | None
    where: str


@dataclass
class Prompt:
    model: str
    blocks: list[Block]
    hashes: list[str]
    cumulative: list[int]
    position_of: list[int]
    position_ends: list[int]
    breakpoints: list[tuple[int, str]]

    @property
    def total_tokens(self) -> int:
        return self.cumulative[-1] if self.cumulative else 0


@dataclass
class Entry:
    expires_at: float
    ttl: str
    tokens: int
    readable: bool = False


def analyse(payload: dict[str, Any]) -> Prompt:
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

    blocks: list[Block] = []
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
        bare = strip_cache_control(tool)
        if tool.get("defer_loading"):
            if "cache_control" in tool:
                raise invalid_request(f"{where}: a tool with defer_loading cannot carry cache_control")
            deferred[tool["name"]] = {k: v for k, v in bare.items() if k != "defer_loading"}
            continue
        if "cache_control" in tool:
            check_cache_control(tool["cache_control"], where)
        blocks.append(
            Block(canonical_json(["tool", bare]), estimate_json_tokens(bare), "tool", tool.get("cache_control"), where)
        )

    system = payload.get("system") or []
    for i, block in enumerate(content_blocks(system, "system") if system else []):
        where = f"system.{i}"
        if block.get("type") != "text":
            raise invalid_request(f"{where}.type: system blocks must be text")
        if "cache_control" in block:
            check_cache_control(block["cache_control"], where)
        bare = strip_cache_control(block)
        blocks.append(
            Block(
                canonical_json(["system", bare]),
                estimate_json_tokens(bare),
                "system",
                block.get("cache_control"),
                where,
            )
        )

    check_tool_pairing(messages)
    for m, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise invalid_request(f"messages.{m}.role: Input should be 'user' or 'assistant'")
        content = content_blocks(message.get("content"), f"messages.{m}")
        if not content:
            raise invalid_request(f"messages.{m}: all messages must have non-empty content")
        for b, block in enumerate(content):
            where = f"messages.{m}.content.{b}"
            if "cache_control" in block:
                check_cache_control(block["cache_control"], where)
            bare = strip_cache_control(block)
            tokens = estimate_json_tokens(bare)
            if block["type"] == "tool_result":
                bare, tokens = expand_tool_references(bare, deferred, names, where)
            blocks.append(
                Block(
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
        same_run = i > 0 and block.kind in RUN_KINDS and blocks[i - 1].kind == block.kind
        if same_run:
            position_ends[-1] = i
        else:
            position_ends.append(i)
        position_of.append(len(position_ends) - 1)
    return Prompt(model, blocks, hashes, cumulative, position_of, position_ends, breakpoints)


def expand_tool_references(
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


class PrefixCache:
    """Entries keyed by prefix hash; reads, refreshes and writes under one lock."""

    def __init__(self, lookback: int = LOOKBACK_POSITIONS) -> None:
        self.lookback = lookback
        self.entries: dict[str, Entry] = {}
        self.lock = threading.Lock()

    def live_count(self, now: float) -> int:
        with self.lock:
            return sum(1 for e in self.entries.values() if e.expires_at > now)

    def account(self, prompt: Prompt, now: float, minimum: int) -> tuple[Usage, list[tuple[str, Entry]]]:
        with self.lock:
            return self._account(prompt, now, minimum)

    def _account(self, prompt: Prompt, now: float, minimum: int) -> tuple[Usage, list[tuple[str, Entry]]]:
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

        writes: list[tuple[str, Entry]] = []
        covered = hit_tokens
        split = {"5m": 0, "1h": 0}
        for block_index, ttl in prompt.breakpoints:
            tokens = prompt.cumulative[block_index]
            if block_index <= hit_block or tokens < minimum:
                continue
            split[ttl] += tokens - covered
            covered = tokens
            writes.append((prompt.hashes[block_index], Entry(now + TTL_SECONDS[ttl], ttl, tokens)))
        usage = Usage(
            input_tokens=prompt.total_tokens - covered,
            cache_creation_input_tokens=covered - hit_tokens,
            cache_read_input_tokens=hit_tokens,
            cache_creation_5m=split["5m"],
            cache_creation_1h=split["1h"],
        )
        return usage, writes

    def _lookup(self, prompt: Prompt, block_index: int, now: float) -> int:
        """The deepest block this breakpoint can read from, or -1."""
        candidates = [block_index]
        position = prompt.position_of[block_index]
        for back in range(1, self.lookback):
            if position - back < 0:
                break
            candidates.append(prompt.position_ends[position - back])
        for candidate in candidates:
            entry = self.entries.get(prompt.hashes[candidate])
            if entry is not None and entry.readable and entry.expires_at > now:
                return candidate
        return -1

    def _refresh(self, key: str, now: float, ttl: str) -> None:
        entry = self.entries.get(key)
        if entry is not None and entry.readable and entry.expires_at > now:
            entry.expires_at = max(entry.expires_at, now + max(TTL_SECONDS[entry.ttl], TTL_SECONDS[ttl]))

    def commit(self, writes: list[tuple[str, Entry]]) -> None:
        """The writer's response starts streaming: what it writes becomes readable."""
        store = self.entries
        with self.lock:
            for key, entry in writes:
                current = store.get(key)
                if current is not None and current.readable and current.expires_at >= entry.expires_at:
                    continue
                store[key] = Entry(entry.expires_at, entry.ttl, entry.tokens, readable=True)
