"""BM25 search over a run's tool surface (TD-6, TD-7).

Pure Python. One `ToolIndex` is built per catalog version (a fingerprint of the
tool records) and reused; a query touches only the postings of its own terms, so
it stays fast at ten thousand tools. rank-bm25 supplies the Okapi idf; the
term frequencies are BM25F (each field length-normalised on its own, weighted,
then saturated once).
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

from engine.catalog.surface import ToolRecord

# How much one occurrence in each field counts. Names and descriptions say what a
# tool does; headings and parameters say where it lives and what it needs. `whole`
# is the flattened document plain Okapi BM25 sees: catalogs whose fields carry
# little (run-together names, marketing first sentences) still rank like plain
# BM25 does. Chosen on the tune parts of the frozen splits only (TS-1), with
# `python manage.py bench search_tune` (whole 0.25 and K1 1.6 over 0.5 and 1.2: the
# pick of every cross-validation fold).
FIELD_WEIGHTS = {
    "name": 1.0,
    "description": 0.5,
    "group": 0.3,
    "parameters": 0.25,
    "pointers": 0.5,
    "summary": 0.25,
    "whole": 0.25,
}
K1 = 1.6
IDF_FLOOR = 0.1
B = 0.75
# Coverage diversification: how much a query term already covered by a pick is discounted.
DIVERSITY = 0.1
CANDIDATES = 20

STOPWORDS = frozenset(
    [
        "a",
        "about",
        "above",
        "after",
        "again",
        "all",
        "also",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "because",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "done",
        "down",
        "during",
        "each",
        "either",
        "else",
        "ever",
        "every",
        "few",
        "for",
        "from",
        "further",
        "get",
        "got",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "him",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "itself",
        "just",
        "let",
        "like",
        "me",
        "might",
        "more",
        "most",
        "my",
        "myself",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "ours",
        "out",
        "over",
        "own",
        "please",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "us",
        "very",
        "via",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "yet",
        "you",
        "your",
        "yours",
    ]
)

_WORD = re.compile(r"[A-Za-z][a-z]+|[A-Z]+(?![a-z])|[a-z]+|\d+")
_stem_lock = threading.Lock()
STEMMER = "english"
_stemmer = snowballstemmer.stemmer(STEMMER)


@lru_cache(maxsize=200_000)
def _stem(word: str) -> str:
    with _stem_lock:  # the snowball stemmer keeps state between calls
        return str(_stemmer.stemWord(word))


def words(text: str) -> list[str]:
    """Lower-case words; `snake_case`, `camelCase`, `HTTPServer` and digits all split apart."""
    return [word.lower() for word in _WORD.findall(text)]


def terms(text: str) -> list[str]:
    # Single letters and bare numbers (line 200, v2, 4pm) name no capability.
    return [_stem(word) for word in words(text) if word not in STOPWORDS and len(word) > 1 and not word.isdigit()]


# What a query's literal shape says about the object it acts on: a path or file
# name means files, a URL means the web. Added as plain words, weighted low.
_QUERY_SHAPES = [
    (re.compile(r"https?://\S+"), "url web page"),
    (re.compile(r"(?<![@\w])[\w.-]*\w/|\b\w[\w-]*\.[a-z]{1,5}\b(?!\.\w)"), "file path"),
]
SHAPE_WEIGHT = 0.5


# Literal values in a query (URLs, paths, file names, code identifiers such as
# requests_cache or parseInvoice) name things in the user's world, not what a tool
# does; their words count for less than the plain words around them.
_LITERAL = re.compile(r"https?://\S+|\S*[/\\]\S*|\S+\.\w+|\w*_\w+|\b[a-z]+[A-Z]\w*")
LITERAL_WEIGHT = 0.3


# Everyday words for what agent tools do, which tool descriptions rarely use: a person says
# "remember that ...", "ping me at 4", "what's left on your checklist", where the tools say
# memory, reminder, todo. A query word adds these words at a low weight, so they break ties
# and fill rankings that found nothing, and never outweigh the query's own words. Written
# for the vocabulary of tools in general (memory, version control, calendars, reminders,
# plans, databases, questions to the user), checked on the tune parts only (TS-1).
EVERYDAY_WORDS = {
    "remember": "memory save",
    "recall": "memory",
    "forget": "memory",
    "uncommitted": "status",
    "unstaged": "status",
    "restore": "checkpoint rewind",
    "undo": "rewind checkpoint",
    "ping": "reminder notify message",
    "remind": "reminder",
    "alarm": "reminder",
    "book": "calendar event",
    "meeting": "calendar event",
    "appointment": "calendar event",
    "reschedule": "update calendar event",
    "postpone": "update calendar event",
    "checklist": "todo",
    "slow": "explain query plan",
    "markdown": "glob pattern",
    "confirm": "ask user",
    "clarify": "ask user",
}
EVERYDAY_WEIGHT = 0.5
_EXPANSIONS = {_stem(word): terms(expansion) for word, expansion in EVERYDAY_WORDS.items()}


# A query is a few words. The literal patterns above take time in the square of a word's length:
# a 30,000-character query held a web process for 22 s and a million characters for minutes, every
# other request waiting on the GIL (QA). The search tools refuse a longer query with a message;
# the ranker itself never reads past this, whoever calls it.
MAX_QUERY_CHARS = 1_000


def query_too_long(query: str) -> str | None:
    """What a search tool answers for a query the ranker would not read whole, or None."""
    if len(query) <= MAX_QUERY_CHARS:
        return None
    return (
        f"query is {len(query):,} characters; describe the tool you need in at most {MAX_QUERY_CHARS:,} "
        "(a few words for the action and its object work best)."
    )


def query_terms(query: str) -> dict[str, float]:
    query = query[:MAX_QUERY_CHARS]
    weighted: dict[str, float] = {}
    literals = " ".join(_LITERAL.findall(query))
    for term in terms(_LITERAL.sub(" ", query)):
        weighted[term] = weighted.get(term, 0.0) + 1.0
    for term in terms(literals):
        weighted[term] = weighted.get(term, 0.0) + LITERAL_WEIGHT
    for term, weight in list(weighted.items()):
        for added in _EXPANSIONS.get(term, ()):
            weighted[added] = weighted.get(added, 0.0) + EVERYDAY_WEIGHT * weight
    stripped = _QUERY_SHAPES[0][0].sub(" ", query)
    for i, (pattern, hint) in enumerate(_QUERY_SHAPES):
        if pattern.search(query if i == 0 else stripped):
            for term in terms(hint):
                weighted[term] = weighted.get(term, 0.0) + SHAPE_WEIGHT
    return weighted


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


_CLAUSE = re.compile(r"(?<=[.;:!?])\s+|\s+-\s+")


def _namespace(name: str) -> tuple[str, str]:
    namespace, _, bare = name.rpartition("__")
    return namespace, bare


def split_pointers(tools: Sequence[ToolRecord]) -> tuple[list[str], dict[tuple[str, str], list[str]]]:
    """Each tool's own description, and the clauses other tools' descriptions say about it.

    Catalog descriptions steer the model between lookalikes ("for PDF files use
    read_document"). Such a clause describes the tool it names, not the one it is
    written in, so it is indexed under the named tool of the same namespace (an
    MCP server's descriptions speak about that server's tools).
    """
    names = {_namespace(tool.name) for tool in tools}
    own: list[str] = []
    pointers: dict[tuple[str, str], list[str]] = {}
    for tool in tools:
        namespace, bare = _namespace(tool.name)
        kept = []
        for clause in _CLAUSE.split(tool.description):
            named = [
                word
                for word in re.findall(r"[A-Za-z0-9_]+", clause)
                if "_" in word and word != bare and (namespace, word) in names
            ]
            for name in named:
                pointers.setdefault((namespace, name), []).append(clause)
            if not named:
                kept.append(clause)
        own.append(" ".join(kept))
    return own, pointers


def document_fields(tool: ToolRecord, description: str, pointers: list[str]) -> dict[str, list[str]]:
    # MCP tools are searched by their own name; the server prefix is a namespace, not a capability.
    bare_name = _namespace(tool.name)[1]
    return {
        "name": terms(bare_name),
        "description": terms(description),
        "summary": terms(_CLAUSE.split(description, maxsplit=1)[0]),
        "group": terms(tool.group),
        "parameters": terms(parameter_text(tool.input_schema)),
        "pointers": terms(" ".join(pointers)),
        "whole": terms(f"{bare_name} {tool.group} {tool.description} {parameter_text(tool.input_schema)}"),
    }


class ToolIndex:
    """BM25F: each field is length-normalised on its own, then weighted, then saturated once."""

    def __init__(self, tools: Sequence[ToolRecord]) -> None:
        self.tools = list(tools)
        self.position = {tool.name: i for i, tool in enumerate(self.tools)}
        self._postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if not self.tools:
            return
        own, pointers = split_pointers(self.tools)
        fields = [
            document_fields(tool, own[i], pointers.get(_namespace(tool.name), [])) for i, tool in enumerate(self.tools)
        ]
        # rank-bm25 gives the Okapi idf over whole documents (every field together).
        # It is zero or negative for a term in half the tools or more, which would
        # make small catalogs unsearchable: such terms get a small positive floor.
        corpus = [[t for found in f.values() for t in found] or ["\x00empty"] for f in fields]
        okapi = BM25Okapi(corpus, k1=K1, b=B)
        positive = [value for value in okapi.idf.values() if value > 0]
        floor = IDF_FLOOR * (sum(positive) / len(positive) if positive else 1.0)
        self._idf = {term: max(value, floor) for term, value in okapi.idf.items()}
        average = {name: max(1e-9, sum(len(f[name]) for f in fields) / len(fields)) for name in FIELD_WEIGHTS}
        pseudo_tf: list[dict[str, float]] = []
        for f in fields:
            combined: dict[str, float] = {}
            for name, found in f.items():
                if not found:
                    continue
                norm = FIELD_WEIGHTS[name] / (1 - B + B * len(found) / average[name])
                for term, tf in Counter(found).items():
                    combined[term] = combined.get(term, 0.0) + tf * norm
            pseudo_tf.append(combined)
        by_term: dict[str, tuple[list[int], list[float]]] = {}
        for i, combined in enumerate(pseudo_tf):
            for term, weight in combined.items():
                docs, contributions = by_term.setdefault(term, ([], []))
                docs.append(i)
                contributions.append(self._idf[term] * weight * (K1 + 1) / (weight + K1))
        self._postings = {
            term: (np.asarray(docs, dtype=np.int64), np.asarray(values)) for term, (docs, values) in by_term.items()
        }

    def scores(self, query: str) -> np.ndarray:
        """The BM25F score of every tool for `query`, in `tools` order (zero where no term matches)."""
        weighted = query_terms(query)
        return self._score(weighted) if self.tools and weighted else np.zeros(len(self.tools))

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
        weighted = query_terms(query)
        if not self.tools or not weighted:
            return []

        def admitted(i: int) -> bool:
            return allowed is None or self.tools[i].name in allowed

        scores = self._score(weighted)
        ranked = [(i, float(scores[i])) for i in self._top(scores, max(k, CANDIDATES), admitted)]
        if DIVERSITY > 0 and len(ranked) > 1:
            return self._diversified(weighted, ranked, k)
        return [Match(self.tools[i], score) for i, score in ranked[:k]]

    def _diversified(self, weighted: dict[str, float], ranked: list[tuple[int, float]], k: int) -> list[Match]:
        """Greedy re-ranking that discounts query terms the picks so far already cover.

        A request that names several needs ("find the anime, and search movies")
        should not get five variants of the first need.
        """
        candidates = [i for i, _ in ranked]
        gains: dict[str, np.ndarray] = {}
        for term, weight in weighted.items():
            posting = self._postings.get(term)
            if posting is None:
                continue
            docs, values = posting
            where = np.searchsorted(docs, candidates)
            where = np.minimum(where, len(docs) - 1)
            hit = docs[where] == np.asarray(candidates)
            gains[term] = np.where(hit, weight * values[where], 0.0)
        if not gains:
            return [Match(self.tools[i], score) for i, score in ranked[:k]]
        matrix = np.vstack(list(gains.values()))  # query terms x candidates
        peaks = matrix.max(axis=1, keepdims=True)
        peaks[peaks == 0] = 1.0
        covered = matrix / peaks
        coverage = np.zeros((matrix.shape[0], 1))
        available = np.ones(len(candidates), dtype=bool)
        picked: list[Match] = []
        while available.any() and len(picked) < k:
            values = (matrix * (1 - DIVERSITY) ** coverage).sum(axis=0)
            values[~available] = -np.inf
            best = int(np.argmax(values))  # ties keep the earlier (better-ranked) candidate
            picked.append(Match(self.tools[candidates[best]], float(values[best])))
            available[best] = False
            coverage += covered[:, best : best + 1]
        return picked


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
