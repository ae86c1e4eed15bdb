"""The prompt cache: block layout, prefix hashes, breakpoints, TTLs, lookback.

The prompt is the blocks in the order tools -> system -> messages; each block
position carries a cumulative prefix hash (seeded by the model); `cache_control`
is not part of the hash.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

from engine.emulator.accounting import Usage, block_tokens, count_images
from engine.emulator.policy import strip_cache_control
from engine.emulator.validation import (
    TTL_SECONDS,
    check_block,
    check_cache_control,
    check_messages,
    check_request_fields,
    check_signature,
    check_tool,
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
    nested: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Prompt:
    model: str
    blocks: list[Block]
    hashes: list[str]
    cumulative: list[int]
    position_of: list[int]
    position_ends: list[int]
    breakpoints: list[tuple[int, str]]
    info: dict[str, Any] = field(default_factory=dict)
    deferred: dict[str, dict[str, Any]] = field(default_factory=dict)
    searchers: dict[str, str] = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return self.cumulative[-1] if self.cumulative else 0


@dataclass
class Entry:
    expires_at: float
    ttl: str
    tokens: int
    readable: bool = False


def analyse(payload: dict[str, Any], *, count_only: bool = False, known_model: bool = True) -> Prompt:
    """Validate a Messages request and lay it out as hashed block positions.

    `count_only` checks it as `count_tokens` does (no `max_tokens`, no sampling
    fields); `known_model=False` accounts an unknown model with the default limits
    (the offline model's accounting, which is not an API request).
    """
    if not isinstance(payload, dict):
        raise invalid_request("The request body must be a JSON object.")
    info = check_request_fields(payload, count_only=count_only, known_model=known_model)
    model = payload["model"]
    messages = payload["messages"]
    if not messages:
        raise invalid_request("messages: at least one message is required")

    blocks: list[Block] = []
    tools = payload.get("tools") or []
    deferred: dict[str, dict[str, Any]] = {}
    names: set[str] = set()
    searchers: dict[str, str] = {}
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        kind = check_tool(tool, where)
        if tool["name"] in names:
            raise invalid_request(f"tools: Tool names must be unique. Duplicate: {tool['name']!r}")
        names.add(tool["name"])
        if kind != "custom":
            searchers[tool["name"]] = kind
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
    if tools and not blocks:
        raise invalid_request(
            "tools: at least one tool must not have defer_loading set (every tool in the request is deferred)"
        )
    if blocks:
        # The API adds a tool-use system prompt whenever tools are present; its size depends on the model and
        # on whether tool_choice forces a call. It is counted with the tool block (a tool_choice change does
        # not invalidate the tools, as documented).
        forced = (payload.get("tool_choice") or {}).get("type") in ("any", "tool")
        blocks[0].tokens += info["tool_prompt"][1 if forced else 0]

    system = payload.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise invalid_request("system: Input should be a valid string or list")
    if isinstance(system, str) and system:
        system = [{"type": "text", "text": system}]
    for i, block in enumerate(system or []):
        where = f"system.{i}"
        check_block(block, where, ("text",))
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

    contents = check_messages(messages, thinking=info["thinking_budget"] is not None)
    current = current_turn_start(messages)
    images = count_images(contents)
    # A change of tool_choice or of the thinking settings invalidates the messages (not tools or system).
    messages_seed = canonical_json(["messages", _choice_key(payload.get("tool_choice")), info["thinking"]])
    first_message_block = len(blocks)
    for m, content in enumerate(contents):
        role = messages[m]["role"]
        for b, block in enumerate(content):
            where = f"messages.{m}.content.{b}"
            if block["type"] in ("thinking", "redacted_thinking") and m < current:
                # Thinking from earlier turns is stripped by the API: neither counted nor part of the prefix.
                continue
            if block["type"] == "thinking":
                check_signature(block, where)
            bare = strip_cache_control(block)
            if block["type"] in ("tool_result", "tool_search_tool_result"):
                bare = expand_tool_references(bare, deferred, names, where)
            tokens = block_tokens(bare, images, where)
            control = block.get("cache_control")
            nested = nested_cache_controls(block, where)
            blocks.append(
                Block(canonical_json(["m", role, b == 0, bare]), tokens, block["type"], control, where, nested)
            )
    last = contents[-1]
    final = last[-1] if messages[-1]["role"] == "assistant" and last else {}
    if final.get("type") == "text" and final["text"] != final["text"].rstrip():
        raise invalid_request("messages: final assistant content cannot end with trailing whitespace")

    if payload.get("cache_control") is not None and blocks and blocks[-1].cache_control is None:
        # Top-level cache_control marks the last cacheable block.
        blocks[-1].cache_control = payload["cache_control"]
    breakpoints = []
    count = 0
    for i, block in enumerate(blocks):
        controls = ([block.cache_control] if block.cache_control else []) + block.nested
        count += len(controls)
        if controls:
            # A marker nested in a tool result caches through the block that holds it.
            breakpoints.append((i, controls[-1].get("ttl", "5m")))
    if count > MAX_BREAKPOINTS:
        raise invalid_request(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {count}."
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
    hashes: list[str] = []
    cumulative: list[int] = []
    position_of: list[int] = []
    position_ends: list[int] = []
    total = 0
    for i, block in enumerate(blocks):
        if i == first_message_block:
            digest = hashlib.sha256(digest + messages_seed).digest()
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
    return Prompt(model, blocks, hashes, cumulative, position_of, position_ends, breakpoints, info, deferred, searchers)


def _choice_key(choice: Any) -> Any:
    if not choice or choice == {"type": "auto"}:
        return None
    return choice


def current_turn_start(messages: list[dict[str, Any]]) -> int:
    """Index of the message that opens the current turn: the last user message that is not only tool results."""
    for m in range(len(messages) - 1, -1, -1):
        content = messages[m]["content"]
        if messages[m]["role"] == "user" and (
            isinstance(content, str) or any(b.get("type") != "tool_result" for b in content)
        ):
            return m
    return 0


def nested_cache_controls(block: dict[str, Any], where: str) -> list[dict[str, Any]]:
    if block.get("type") != "tool_result" or not isinstance(block.get("content"), list):
        return []
    return [inner["cache_control"] for inner in block["content"] if "cache_control" in inner]


def expand_tool_references(
    block: dict[str, Any], deferred: dict[str, dict[str, Any]], names: set[str], where: str
) -> dict[str, Any]:
    """A `tool_reference` to a deferred tool loads that tool's definition where it stands."""
    if block.get("type") == "tool_search_tool_result":
        content = block["content"]
        references = content.get("tool_references") if isinstance(content, dict) else None
        if not isinstance(references, list):
            return block
        items: Any = references
        container = "tool_references"
    else:
        items, container = block.get("content"), "content"
        if not isinstance(items, list):
            return block
    expanded = []
    for item in items:
        if isinstance(item, dict) and item.get("type") == "tool_reference":
            name = item.get("tool_name")
            if name not in names:
                raise invalid_request(f"{where}: tool_reference to {name!r}, which is not in the request's tools")
            # A reference to a resident tool adds nothing new; a deferred one loads its definition here.
            expanded.append({"type": "tool_definition", "tool": deferred[name]} if name in deferred else item)
        else:
            expanded.append(item)
    if container == "tool_references":
        return {**block, "content": {**block["content"], "tool_references": expanded}}
    return {**block, "content": expanded}


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
