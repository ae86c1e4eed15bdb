"""A provider-neutral model request, in the canonical Anthropic shape.

Serialization is deterministic (sorted keys, no whitespace) so that equal
prefixes are equal bytes, which is what a prompt cache keys on (TD-11).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelRequestSpec:
    model: str
    system: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    max_tokens: int = 4096
    breakpoints: list[str] = field(default_factory=list)

    def as_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": self.system,
            "messages": self.messages,
        }
        if self.tools:
            payload["tools"] = self.tools
        return payload

    def serialize(self) -> bytes:
        return canonical_json(self.as_payload())


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}
