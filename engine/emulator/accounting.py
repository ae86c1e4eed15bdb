"""Token counting and usage as the API reports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.tokens import estimate_json_tokens, estimate_text_tokens


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


def output_tokens(content: list[dict[str, Any]]) -> int:
    total = 0
    for block in content:
        if block.get("type") == "text":
            total += estimate_text_tokens(block["text"])
        else:
            total += estimate_json_tokens(block)
    return max(total, 1)
