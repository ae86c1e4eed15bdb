"""Server-side tool search: the API's own BM25 and regex search over the deferred tools.

Written apart from the product's search (engine/catalog/ranking.py) on purpose,
so the two can be compared. The result shape is the documented one: a
`tool_search_tool_result` whose content lists `tool_reference`s.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

MAX_RESULTS = 5
MAX_PATTERN_CHARS = 200


def _text(tool: dict[str, Any]) -> str:
    schema = tool.get("input_schema") or {}
    properties = schema.get("properties") if isinstance(schema, dict) else None
    arguments = []
    for name, spec in (properties or {}).items() if isinstance(properties, dict) else []:
        arguments.append(str(name))
        if isinstance(spec, dict) and isinstance(spec.get("description"), str):
            arguments.append(spec["description"])
    return " ".join([tool.get("name", ""), tool.get("description", ""), *arguments])


def _terms(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower().replace("_", " "))


def bm25(query: str, tools: dict[str, dict[str, Any]], *, k1: float = 1.2, b: float = 0.75) -> list[str]:
    documents = {name: _terms(_text(tool)) for name, tool in tools.items()}
    if not documents:
        return []
    average = sum(len(d) for d in documents.values()) / len(documents) or 1.0
    frequency = Counter(term for d in documents.values() for term in set(d))
    scores = []
    for name, terms in documents.items():
        counts = Counter(terms)
        score = 0.0
        for term in set(_terms(query)):
            if term not in counts:
                continue
            idf = math.log(1 + (len(documents) - frequency[term] + 0.5) / (frequency[term] + 0.5))
            tf = counts[term]
            score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(terms) / average))
        if score > 0:
            scores.append((-score, name))
    return [name for _score, name in sorted(scores)[:MAX_RESULTS]]


def regex(pattern: str, tools: dict[str, dict[str, Any]]) -> list[str] | str:
    """Names whose name, description or argument names match; an error code when the pattern is bad."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return "pattern_too_long"
    try:
        compiled = re.compile(pattern)
    except re.error:
        return "invalid_pattern"
    return [name for name, tool in tools.items() if compiled.search(_text(tool))][:MAX_RESULTS]


def run(kind: str, tool_use_id: str, query: Any, deferred: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The `tool_search_tool_result` block for one `server_tool_use` call."""
    text = query if isinstance(query, str) else ""
    found = regex(text, deferred) if "regex" in kind else bm25(text, deferred)
    if isinstance(found, str):
        content: dict[str, Any] = {"type": "tool_search_tool_result_error", "error_code": found}
    else:
        content = {
            "type": "tool_search_tool_search_result",
            "tool_references": [{"type": "tool_reference", "tool_name": name} for name in found],
        }
    return {"type": "tool_search_tool_result", "tool_use_id": tool_use_id, "content": content}
