"""BM25 search over a run's tool surface (TD-6, TD-7).

Pure Python. One `ToolIndex` is built per catalog version (a fingerprint of the
tool records) and reused; a query touches only the postings of its own terms, so
it stays fast at ten thousand tools. rank-bm25 supplies the Okapi statistics (idf,
document lengths); fields are weighted by repeating their terms, a cheap BM25F.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import snowballstemmer
from rank_bm25 import BM25Okapi

from toolcatalog.surface import ToolRecord

# How much one occurrence in each field counts. Names and descriptions say what a
# tool does; headings and parameters say where it lives and what it needs.
FIELD_WEIGHTS = {"name": 3, "description": 2, "group": 1, "parameters": 1}
K1 = 1.2
B = 0.75
# Pseudo-relevance feedback: the vocabulary of the best first-pass matches widens
# a paraphrased query towards the words the catalog itself uses.
FEEDBACK_DOCS = 3
FEEDBACK_TERMS = 8
FEEDBACK_WEIGHT = 0.25

STOPWORDS = frozenset(
    """a about above after again all also am an and any are as at be because been before being below between both
    but by can could did do does doing done down during each either else ever every few for from further get got had
    has have having he her here hers him his how i if in into is it its itself just let like me might more most my
    myself no nor not now of off on once only or other our ours out over own please same she should so some such
    than that the their theirs them then there these they this those through to too under until up us very via was
    we were what when where which while who whom why will with would yet you your yours""".split()
)

_WORD = re.compile(r"[A-Za-z][a-z]+|[A-Z]+(?![a-z])|[a-z]+|\d+")
_stem_lock = threading.Lock()
_stemmer = snowballstemmer.stemmer("english")


@lru_cache(maxsize=200_000)
def _stem(word: str) -> str:
    with _stem_lock:  # the snowball stemmer keeps state between calls
        return _stemmer.stemWord(word)


def words(text: str) -> list[str]:
    """Lower-case words; `snake_case`, `camelCase`, `HTTPServer` and digits all split apart."""
    return [word.lower() for word in _WORD.findall(text)]


def terms(text: str) -> list[str]:
    return [_stem(word) for word in words(text) if word not in STOPWORDS]


@dataclass(frozen=True)
class Match:
    tool: ToolRecord
    score: float


def parameter_text(schema: dict[str, Any]) -> str:
    """Parameter names and descriptions, nested objects and enums included."""
    parts: list[str] = []

    def walk(node: Any) -> None:
        if not isinstance(node, dict):
            return
        for name, spec in (node.get("properties") or {}).items():
            parts.append(name)
            if isinstance(spec, dict):
                parts.append(str(spec.get("description", "")))
                parts.extend(str(value) for value in spec.get("enum", []) if isinstance(value, str))
                walk(spec)
                walk(spec.get("items"))

    walk(schema)
    return " ".join(parts)


def document_terms(tool: ToolRecord) -> list[str]:
    # MCP tools are searched by their own name; the server prefix is a namespace, not a capability.
    bare_name = tool.name.split("__", 1)[-1]
    fields = {
        "name": terms(bare_name),
        "description": terms(tool.description),
        "group": terms(tool.group),
        "parameters": terms(parameter_text(tool.input_schema)),
    }
    return [term for field, found in fields.items() for term in found * FIELD_WEIGHTS[field]]


class ToolIndex:
    def __init__(self, tools: Sequence[ToolRecord]) -> None:
        self.tools = list(tools)
        self.position = {tool.name: i for i, tool in enumerate(self.tools)}
        corpus = [document_terms(tool) or ["\x00empty"] for tool in self.tools]
        self._postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._doc_terms: list[Counter[str]] = []
        if not self.tools:
            return
        okapi = BM25Okapi(corpus, k1=K1, b=B)
        lengths = np.asarray(okapi.doc_len, dtype=float)
        norm = K1 * (1 - B + B * lengths / okapi.avgdl)
        by_term: dict[str, tuple[list[int], list[float]]] = {}
        for i, frequencies in enumerate(okapi.doc_freqs):
            self._doc_terms.append(Counter(frequencies))
            for term, tf in frequencies.items():
                docs, contributions = by_term.setdefault(term, ([], []))
                docs.append(i)
                contributions.append(okapi.idf[term] * tf * (K1 + 1) / (tf + norm[i]))
        self._postings = {
            term: (np.asarray(docs, dtype=np.int64), np.asarray(contributions)) for term, (docs, contributions) in by_term.items()
        }
        self._idf = okapi.idf

    def _score(self, weighted_terms: dict[str, float]) -> np.ndarray:
        scores = np.zeros(len(self.tools))
        for term, weight in weighted_terms.items():
            posting = self._postings.get(term)
            if posting is not None:
                scores[posting[0]] += weight * posting[1]
        return scores

    def _top(self, scores: np.ndarray, k: int, admitted: Callable[[int], bool]) -> list[int]:
        candidates = np.flatnonzero(scores > 0)
        if candidates.size == 0:
            return []
        order = candidates[np.lexsort((candidates, -scores[candidates]))]
        top: list[int] = []
        for i in order:
            if admitted(int(i)):
                top.append(int(i))
                if len(top) == k:
                    break
        return top

    def search(self, query: str, *, k: int = 5, allowed: Container[str] | None = None) -> list[Match]:
        """The k best tools for `query` among `allowed` names (all when None), best first."""
        query_terms = Counter(terms(query))
        if not query_terms or not self.tools:
            return []

        def admitted(i: int) -> bool:
            return allowed is None or self.tools[i].name in allowed

        weighted = {term: float(count) for term, count in query_terms.items()}
        first = self._top(self._score(weighted), FEEDBACK_DOCS, admitted)
        if not first:
            return []
        expanded = dict(weighted)
        for term, weight in self._feedback_terms(first, set(query_terms)):
            expanded[term] = expanded.get(term, 0.0) + weight
        scores = self._score(expanded)
        return [Match(self.tools[i], float(scores[i])) for i in self._top(scores, k, admitted)]

    def _feedback_terms(self, docs: Iterable[int], seen: set[str]) -> list[tuple[str, float]]:
        pooled: Counter[str] = Counter()
        for i in docs:
            counts = self._doc_terms[i]
            total = sum(counts.values())
            for term, tf in counts.items():
                if term not in seen:
                    pooled[term] += tf / total * self._idf.get(term, 0.0)
        best = pooled.most_common(FEEDBACK_TERMS)
        if not best:
            return []
        top = best[0][1]
        return [(term, FEEDBACK_WEIGHT * value / top) for term, value in best if value > 0]


def catalog_fingerprint(tools: Iterable[ToolRecord]) -> str:
    digest = hashlib.sha256()
    for tool in sorted(tools, key=lambda t: t.name):
        digest.update(json.dumps([tool.name, tool.group, tool.description, tool.input_schema], sort_keys=True).encode())
    return digest.hexdigest()


_index_lock = threading.Lock()
_indexes: dict[str, ToolIndex] = {}
_MAX_CACHED_INDEXES = 8


def index_for(tools: Sequence[ToolRecord]) -> ToolIndex:
    """The index of this catalog version: built on first use, then reused (TD-6)."""
    key = catalog_fingerprint(tools)
    with _index_lock:
        index = _indexes.get(key)
        if index is None:
            index = ToolIndex(tools)
            if len(_indexes) >= _MAX_CACHED_INDEXES:
                _indexes.pop(next(iter(_indexes)))
            _indexes[key] = index
        return index


def no_match_message(query: str) -> str:
    return (
        f"No tool on this run's surface matches {query!r}. That does not mean the capability is missing: "
        "rephrase the query with other words for the action or the object (for example 'send a message' "
        "instead of 'ping'), or search more broadly (for example just 'tickets'), or look at the grouped "
        "name index in the system prompt."
    )
