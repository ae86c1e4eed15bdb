"""Optional semantic ranker (CC_TOOL_SEARCH_RANKER=hybrid; extra `.[semantic]` for thread control).

BM25 (engine/catalog/ranking.py) fused with all-MiniLM-L6-v2 sentence embeddings (a
mix of both rankers' standardised scores): paraphrased queries that share few words with a tool's
description still find it. No Django import. The model runs in plain numpy
(engine/catalog/minilm.py) from int8 weights kept in this repository: no torch, no
GPU packages, nothing downloaded at run time (TS-2). Tool embeddings are computed
once per catalog version (the BM25 fingerprint), kept in-process and stored as
`.npy` files in a cache folder, so a restart does not recompute them.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Container, Sequence
from functools import cache
from pathlib import Path

import numpy as np

from engine.catalog import minilm
from engine.catalog.ranking import MAX_QUERY_CHARS, Match, ToolIndex, catalog_fingerprint, index_for
from engine.catalog.surface import ToolRecord

MODEL_NAME = "all-MiniLM-L6-v2"
# Fusion: each ranker's scores are standardised over the catalog (z-scores) and mixed,
# this share for BM25 and the rest for the cosine similarity. Chosen on the tune parts
# (bench search_tune): 0.4 beat reciprocal rank fusion (k 5-60, weights 1:1-1:1.5) and
# min-max scaling summed over the three sets, by ~0.02 recall@5 on ToolRet apigen.
LEXICAL_SHARE = 0.4
# A tool's vector is its text's embedding plus this much of its bare name's ("read file",
# "Wolfram Alpha"): the name is the densest statement of what a tool does, and in the whole
# text it is one phrase among many sentences. Scores stay one dot product per tool (the
# query's cosine with each part, the name's weighted). Chosen on the tune parts (bench
# search_tune, cross-validated; 1.0 was every fold's pick with LEXICAL_SHARE 0.4): any weight
# from 0.3 to 1 gained about 0.03 recall@5 on tool-queries-dev and 0.02 to 0.05 on MetaTool,
# and moved ToolRet apigen by under 0.005.
NAME_WEIGHT = 1.0

Encoder = Callable[[list[str]], np.ndarray]


class SemanticUnavailable(RuntimeError):
    """The model file is missing from this install; the message says what to do."""


def available() -> bool:
    return minilm.MODEL_FILE.exists()


@cache
def default_encoder() -> Encoder:
    """Load the model once per process (well under a second)."""
    if not available():
        raise SemanticUnavailable(
            f"The hybrid tool ranker needs its model file {minilm.MODEL_FILE}, which ships with the "
            "source; reinstall from a full checkout."
        )
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # the extra is not installed: still correct, only slower on a busy machine
        pass
    else:
        # One short query per call: BLAS threads on matrices this small only contend
        # with the web process's other work (several times slower under load).
        threadpool_limits(limits=1, user_api="blas")
    model = minilm.MiniLM()
    return model.encode


def name_words(tool: ToolRecord) -> str:
    """The tool's own name as words: `read_file` is "read file", `WolframAlpha` "Wolfram Alpha"."""
    bare = tool.name.rpartition("__")[2]
    return re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", bare).replace("_", " ")


def tool_text(tool: ToolRecord) -> str:
    """What the text embedding sees: the tool's own name in words, its heading and description."""
    return f"{name_words(tool)}. {tool.group}. {tool.description}".strip()


class HybridIndex:
    """Same interface as ToolIndex: `tools` and `search(query, k=, allowed=)`."""

    def __init__(self, bm25: ToolIndex, embeddings: np.ndarray, encode: Encoder) -> None:
        self.bm25 = bm25
        self.tools = bm25.tools
        self.embeddings = embeddings
        self._encode = encode

    def search(self, query: str, *, k: int = 5, allowed: Container[str] | None = None) -> list[Match]:
        if not self.tools or not query.strip():
            return []
        fused = LEXICAL_SHARE * _standardised(self.bm25.scores(query)) + (1 - LEXICAL_SHARE) * _standardised(
            self.embeddings @ self._encode([query[:MAX_QUERY_CHARS]])[0]
        )
        # Best first; ties keep catalog order. A query BM25 finds nothing for is still answered
        # semantically (its BM25 scores are all zero, so they add nothing).
        best: list[Match] = []
        for i in np.lexsort((np.arange(len(fused)), -fused)):
            if allowed is None or self.tools[int(i)].name in allowed:
                best.append(Match(self.tools[int(i)], float(fused[i])))
                if len(best) == k:
                    break
        return best


def _standardised(scores: np.ndarray) -> np.ndarray:
    spread = float(scores.std())
    return (scores - scores.mean()) / spread if spread > 0 else np.zeros_like(scores, dtype=np.float64)


def tool_embeddings(
    tools: Sequence[ToolRecord], *, fingerprint: str, encode: Encoder, cache_dir: Path | None
) -> np.ndarray:
    """Each tool's vector, in `tools` order: its text's embedding plus NAME_WEIGHT of its name's."""
    texts = _part_embeddings(tools, "text", tool_text, fingerprint=fingerprint, encode=encode, cache_dir=cache_dir)
    names = _part_embeddings(tools, "name", name_words, fingerprint=fingerprint, encode=encode, cache_dir=cache_dir)
    return texts + NAME_WEIGHT * names


def _part_embeddings(
    tools: Sequence[ToolRecord],
    part: str,
    text_of: Callable[[ToolRecord], str],
    *,
    fingerprint: str,
    encode: Encoder,
    cache_dir: Path | None,
) -> np.ndarray:
    """Embeddings of one part of each tool, read from `cache_dir` when this catalog version has them.

    Stored in name order, like the fingerprint, so callers listing the same tools in
    another order share the file. The parts are stored apart, so another NAME_WEIGHT
    reuses them.
    """
    order = sorted(range(len(tools)), key=lambda i: tools[i].name)
    stored = cache_dir / f"{MODEL_NAME}-{part}-{fingerprint}.npy" if cache_dir is not None else None
    by_name = None
    if stored is not None and stored.exists():
        by_name = np.load(stored)
        if by_name.shape[0] != len(tools):
            by_name = None
    if by_name is None:
        by_name = encode([text_of(tools[i]) for i in order]) if tools else np.zeros((0, 384), dtype=np.float32)
        if stored is not None:
            stored.parent.mkdir(parents=True, exist_ok=True)
            partial = stored.with_name(f"{stored.stem}.{os.getpid()}.tmp.npy")
            np.save(partial, by_name)
            partial.replace(stored)  # readers never see half a file
    vectors = np.empty_like(by_name)
    vectors[order] = by_name
    return vectors


_lock = threading.Lock()
_hybrid: dict[str, HybridIndex] = {}
_MAX_CACHED = 4


def hybrid_index_for(
    tools: Sequence[ToolRecord], *, cache_dir: Path | None = None, encode: Encoder | None = None
) -> HybridIndex:
    """The hybrid index of this catalog version: built on first use, then reused."""
    key = catalog_fingerprint(tools)
    with _lock:
        index = _hybrid.get(key)
        if index is None:
            encoder = encode or default_encoder()
            bm25 = index_for(tools)
            # Aligned with the BM25 index's own tool order (it may come from an earlier caller).
            embeddings = tool_embeddings(bm25.tools, fingerprint=key, encode=encoder, cache_dir=cache_dir)
            index = HybridIndex(bm25, embeddings, encoder)
            if len(_hybrid) >= _MAX_CACHED:
                _hybrid.pop(next(iter(_hybrid)))
            _hybrid[key] = index
        return index
